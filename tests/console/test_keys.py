"""One key per action: an action both screens offer has the same key on each, and no key means two
things (placement was `p` on the plan screen and `o` on the live one, where `p` pauses the log)."""

from __future__ import annotations

from textual.binding import Binding

from omni_console.console.screens import LiveScreen, PlanScreen


def keys_by_action(bindings) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for b in bindings:
        assert isinstance(b, Binding)
        out.setdefault(b.action, set()).update(k.strip() for k in b.key.split(","))
    return out


def test_an_action_on_both_screens_has_the_same_keys():
    plan, live = keys_by_action(PlanScreen.BINDINGS), keys_by_action(LiveScreen.BINDINGS)
    shared = plan.keys() & live.keys()
    assert "app.edit('placement')" in shared and "app.budget" in shared
    assert {a: plan[a] for a in shared} == {a: live[a] for a in shared}


def test_no_key_means_two_actions_across_the_screens():
    meaning: dict[str, set[str]] = {}
    for bindings in (PlanScreen.BINDINGS, LiveScreen.BINDINGS):
        for action, keys in keys_by_action(bindings).items():
            for key in keys:
                meaning.setdefault(key, set()).add(action)
    # esc cancels the load on one screen and the request on the other: one meaning, "cancel what runs"
    clashes = {k: v for k, v in meaning.items() if len(v) > 1}
    assert clashes == {}
