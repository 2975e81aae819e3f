"""Tab moves focus without restyling the screen or rebuilding the footer (it took 0.45 s on the live screen).

A `*:focus-within` rule made Textual restyle every widget on each focus change, and the footer
remounted all its keys though they stayed the same; now only the focused panel's title changes.
"""

from __future__ import annotations

from app_helpers import until
from textual.widgets import Footer

from omni_console.console.focus_title import titled_ancestor
from omni_console.console.widgets.steady_footer import shown_keys


async def test_tab_reverses_one_title_and_restyles_nothing_else(app, monkeypatch):
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.plan_screen.table.row_count > 0)
        restyled: list[int] = []
        real_update = app.stylesheet.update_nodes
        monkeypatch.setattr(app.stylesheet, "update_nodes",
                            lambda nodes, animate=False: (restyled.append(len(nodes)),
                                                          real_update(nodes, animate=animate)))
        footer = app.screen.query_one(Footer)
        rebuilds: list[int] = []
        real_recompose = footer.recompose
        monkeypatch.setattr(footer, "recompose", lambda: (rebuilds.append(1), real_recompose())[1])
        titles = []
        previous = None
        changes, keys = 0, shown_keys(app.screen)
        for _ in range(6):
            await pilot.press("tab")
            await pilot.pause()
            panel = titled_ancestor(app.focused)
            if previous is not None and previous is not panel:
                assert not previous.styles.inline.has_rule("border_title_style")  # the last title restored
            if panel is not None:
                assert panel.styles.inline.has_rule("border_title_style")  # the focused panel's title reversed
                titles.append(panel.id)
            previous = panel
            changes += shown_keys(app.screen) != keys
            keys = shown_keys(app.screen)
        assert {"components", "forecast", "policy"} <= set(titles)
        everything = len(list(app.screen.walk_children(with_self=True)))
        assert max(restyled, default=0) < everything // 2, (restyled, everything)  # never a pass over the screen
        assert len(rebuilds) == changes  # the footer is rebuilt only when the keys it shows change
