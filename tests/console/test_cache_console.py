"""The step cache in the console: `s` on the live screen cycles the next request's cache between requests
(refused while one runs), the status line says which, the generate dialog takes it as a field, the plan screen
gives the step as a range, and the request's steps show their hits and skipped bytes."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

import pytest
from app_helpers import finish, forecast_shown, hold_first_step, load, screen_text, until
from textual.widgets import DataTable, Input

from omni_console.console.generate_form import RequestForm
from omni_console.console.request_defaults import default_request
from omni_console.console.screens import GenerateDialog, LiveScreen
from omni_console.console.session import ConsoleSession
from omni_console.engine.errors import ConfigError
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.running.cache_spec import parse_cache
from omni_console.engine.running.step_cache import supported_kinds


class _Editor:
    policy = plan = None


def test_s_cycles_off_then_each_kind_the_family_takes_and_is_refused_while_a_request_runs():
    session = ConsoleSession(_Editor(), live_replan=False, engine_state="ready", prompt="x")  # type: ignore[arg-type]
    assert session.refuse_cache_change() == ("load the model first (l)", "warning")
    session.phase = "live"
    seen = [session.cycle_cache(["first-block", "mag"]) for _ in range(3)]
    assert [s.text() if s else "off" for s in seen] == ["first-block", "mag", "off"]
    session.cache = parse_cache("mag:threshold=0.1")  # a setting from the dialog goes on to the next kind
    assert session.cycle_cache(["first-block", "mag"]) is None
    session.generating = True
    refusal = session.refuse_cache_change()
    assert refusal is not None and refusal[0].startswith("the step cache changes between requests")


def test_the_dialog_takes_a_cache_as_run_does_and_names_the_field_when_it_is_bad(demo_model_dir):
    model = discover_model(demo_model_dir)
    kinds = tuple(supported_kinds(model))
    assert kinds[:2] == ("first-block", "mag") and "pab" in kinds  # diffusers' hooks on the demo's Flux DiT

    class Handle:
        pass

    handle = Handle()
    handle.model = model  # type: ignore[attr-defined]

    def make(**kw):
        return default_request(handle, **kw)

    form = RequestForm.for_model(model, make(prompt="a fox"), make, kinds)
    field = next(f for f in form.fields() if f.id == "cache")
    assert (field.label, field.value) == ("step cache", "") and field.placeholder.startswith("off · first-block/mag/")
    values = {f.id: f.value for f in form.fields()}
    assert form.build(values).cache is None
    set_here = "first-block:threshold=0.3"
    assert form.build({**values, "cache": set_here}).cache == parse_cache(set_here)
    assert form.build({**values, "cache": "off"}).cache is None
    with pytest.raises(ConfigError, match=r"^step cache 'nope': not a cache kind"):
        form.build({**values, "cache": "nope"})
    with pytest.raises(ConfigError, match=r"^step cache first-block: FirstBlockCacheConfig has no parameter tresh"):
        form.build({**values, "cache": "first-block:tresh=0.2"})
    no_cache = RequestForm.for_model(model, make(prompt="a fox"), make)  # a family no kind works for: no field
    assert "cache" not in [f.id for f in no_cache.fields()]


@pytest.mark.slow
async def test_s_sets_the_next_requests_cache_and_its_steps_show_hits_and_skipped_bytes(app, tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    in_first_step, finish_step = hold_first_step(monkeypatch)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        await load(pilot, app)
        live = app.live_screen
        assert "cache" not in live.status_text
        await pilot.press("s")
        await until(pilot, lambda: "cache first-block" in live.status_text)
        assert app.session.cache == parse_cache("first-block")
        await pilot.press("g")
        await until(pilot, lambda: isinstance(app.screen, GenerateDialog) and bool(app.screen.query("#cache")))
        dialog = app.screen
        assert dialog.query_one("#cache", Input).value == "first-block"
        dialog.query_one("#cache", Input).value = "first-block:threshold=0.5"
        dialog.query_one("#steps", Input).value = "5"
        dialog.query_one("#seed", Input).value = "3"
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, LiveScreen))
        done: Future = app.last_command["generate"]
        assert await asyncio.to_thread(in_first_step.wait, 30)
        await pilot.press("s")  # the request runs with its own cache: refused, the setting unchanged
        assert any(str(m).startswith("the step cache changes between requests") for m, _ in app.notices)
        finish_step.set()
        await finish(pilot, done, lambda: not app.generating)
        assert app.session.cache == parse_cache("first-block:threshold=0.5")
        steps = done.result().steps
        assert [s.cache_forwards for s in steps] == [1] * 5 and sum(s.cache_hits for s in steps) > 0
        assert all(s.skipped_bytes > 0 for s in steps if s.cache_hits)
        table = live.steps.query_one(DataTable)  # the step panel's rows: the copied column with hits and skips
        cells = [str(table.get_row_at(i)[-1]) for i in range(table.row_count)]
        assert any(c.startswith("0 bytes (hit 1/1, skipped ") for c in cells), cells
        assert "cache first-block:threshold=0.5" in screen_text(app)  # the status line
        assert any("SKIP " in line and "not copied (step cache hit)" in line for line in live.staging.lines)
        await pilot.press("s")  # between requests: the next kind
        await until(pilot, lambda: "cache mag" in live.status_text)


def test_console_cache_is_the_first_requests_and_a_bad_one_is_refused_before_the_app(demo_model_dir, loads):
    from omni_console.console.app_main import build_app
    from omni_console.console.cli import build_parser

    parser = build_parser()
    app = build_app(parser.parse_args(["console", "--model", str(demo_model_dir), "--cache", "mag:threshold=0.1"]))
    try:
        assert app.session.cache == parse_cache("mag:threshold=0.1")
    finally:
        app.shutdown()
    for text, line in [("nope", "--cache 'nope': not a cache kind"),
                       ("first-block:tresh=1", "--cache first-block: FirstBlockCacheConfig has no parameter tresh")]:
        with pytest.raises(ConfigError, match=f"^{line}"):
            build_app(parser.parse_args(["console", "--model", str(demo_model_dir), "--cache", text]))
    assert loads == []


@pytest.mark.slow
async def test_the_plan_screen_gives_the_cached_step_as_a_range(app):
    app.session.cache = parse_cache("first-block")
    async with app.run_test(size=(160, 48)) as pilot:
        await forecast_shown(pilot, app)
        app.refresh_plan_views()
        await pilot.pause()
        rows = {label: (value, note) for label, value, note in app.plan_screen.forecast._shown}
        value, note = rows["step with cache first-block"]
        assert "is a range, not a forecast" in note
        if value == "a range":  # no step of the demo measured in this cache yet
            assert "down to a hit step running 1 of 6 blocks" in note
        else:  # best – no hits
            assert " – " in value and "(1 of 6 blocks copied and run; the first step never hits)" in note
        assert "step with cache first-block" in screen_text(app)
