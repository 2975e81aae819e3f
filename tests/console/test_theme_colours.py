"""The active theme is the only source of colour: every coloured cell is one of the theme's colours.

Each test draws the same thing under two themes and checks the colours a user would see: the
residency panel's states, the plan's component table, the forecast's "NO" verdict and the headless
`plan` tables. A hard-coded Rich colour ("green", "bold red") is none of any theme's colours, so it
fails these tests wherever it comes back.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from app_helpers import make_app
from rich.console import Console
from rich.style import Style
from rich.text import Text
from textual.app import App, ComposeResult
from textual.color import Color, ColorParseError
from textual.widgets import DataTable

from omni_console.console.event_text import progress_line
from omni_console.console.plan_context import LinkInfo
from omni_console.console.plan_view import component_table, render_plan
from omni_console.console.theme_colors import default_variables, resolve, theme_variables
from omni_console.console.widgets import ResidencyPanel
from omni_console.console.widgets.plan_forecast import ForecastPanel
from omni_console.console.widgets.plan_table import ComponentTable
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.plan import make_plan
from omni_console.offload.events import ErrorEvent
from omni_console.offload.policy import build_policy
from omni_console.themes import CSS_PATH, DEFAULT_THEME, THEMES, register_themes

TWO_THEMES = ["omni-light", "omni-high-contrast"]  # neither is the default: a default-only colour shows


def opaque(theme: str, variable: str) -> str:
    """A theme colour as a terminal cell shows it (translucent ones over the theme's background)."""
    variables = theme_variables(THEMES[theme])
    colour = Color.parse(variables[variable])
    if colour.a < 1:
        colour = Color.parse(variables["background"]) + colour
    return colour.hex.lower()


def palette(theme: str) -> set[str]:
    """Every colour the theme defines, as a cell shows it."""
    out = set()
    for name in theme_variables(THEMES[theme]):
        try:
            out.add(opaque(theme, name))
        except ColorParseError:  # "auto 87%" and the like depend on the background they land on
            continue
    return out


def colour_of(style: str | Style) -> str | None:
    parsed = Style.parse(style) if isinstance(style, str) else style
    return None if parsed.color is None else parsed.color.get_truecolor().hex.lower()


def rendered_colours(renderable) -> set[str]:
    """The foreground and background colours of every cell a truecolor terminal would draw."""
    console = Console(width=160, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    colours = set()
    for segment in console.render(renderable):
        if segment.style is not None:
            colours |= {c.get_truecolor().hex.lower() for c in (segment.style.color, segment.style.bgcolor) if c}
    return colours


@pytest.fixture(scope="module")
def demo_plan(demo_model_dir: Path):
    """Every residency the table colours: none, staged, streamed and resident (the VAE kept on device)."""
    plan = make_plan(discover_model(demo_model_dir), build_policy({"vae": False}, 1, "dlo"))
    assert {c.residency for c in plan.components} == {"none", "staged", "streamed", "resident"}
    return plan


RESIDENCY_VARIABLE = {"streamed": "primary", "staged": "warning", "resident": "success", "none": "foreground-muted"}


def test_a_theme_style_resolves_to_that_themes_colours_only():
    for theme in TWO_THEMES:
        variables = theme_variables(THEMES[theme])
        assert resolve("bold $success", variables) == f"bold {opaque(theme, 'success')}"
        assert resolve("$foreground-muted", variables) == opaque(theme, "foreground-muted")  # blended, no alpha
        assert resolve("dim", variables) == "dim"
    assert opaque(TWO_THEMES[0], "success") != opaque(TWO_THEMES[1], "success")
    with pytest.raises(KeyError, match=r"\$no-such-colour"):
        resolve("$no-such-colour", theme_variables(THEMES[DEFAULT_THEME]))


@pytest.mark.parametrize("theme", TWO_THEMES)
def test_plan_component_table_uses_the_themes_colours(demo_plan, theme):
    table = component_table(demo_plan, 160, theme_variables(THEMES[theme]))
    colours = rendered_colours(table)
    assert colours and colours <= palette(theme)
    residency = next(c for c in table.columns if c.header == "residency")
    for component, cell in zip(demo_plan.components, residency._cells, strict=True):
        assert colour_of(cell.style) == opaque(theme, RESIDENCY_VARIABLE[component.residency]), component.info.name


@pytest.mark.parametrize("theme", TWO_THEMES)
def test_headless_plan_on_a_terminal_draws_only_theme_colours(demo_plan, theme):
    buf = io.StringIO()
    render_plan(demo_plan, Console(width=160, file=buf, force_terminal=True, color_system="truecolor"),
                variables=theme_variables(THEMES[theme]))
    out = buf.getvalue()
    for residency in ("streamed", "staged", "resident"):
        rgb = tuple(int(opaque(theme, RESIDENCY_VARIABLE[residency])[i:i + 2], 16) for i in (1, 3, 5))
        assert "38;2;{};{};{}m".format(*rgb) in out, residency


def test_headless_plan_without_a_theme_uses_the_default_themes_colours(demo_plan):
    buf = io.StringIO()
    render_plan(demo_plan, Console(width=160, file=buf, force_terminal=True, color_system="truecolor"))
    colour = opaque(DEFAULT_THEME, "success")
    assert "38;2;{};{};{}m".format(*(int(colour[i:i + 2], 16) for i in (1, 3, 5))) in buf.getvalue()


def test_piped_plan_does_not_import_textual(demo_model_dir: Path):
    code = "\n".join([
        "import sys",
        "from omni_console.console.cli import main",
        "code = main(['plan', '--model', sys.argv[1]])",
        "heavy = [m for m in sys.modules if m.split('.')[0] == 'textual' or m.startswith('omni_console.themes')]",
        "print('HEAVY', heavy, file=sys.stderr)",
        "sys.exit(code)",
    ])
    done = subprocess.run([sys.executable, "-c", code, str(demo_model_dir)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stderr  # stdout is a pipe here: tab-separated rows need no colour


def test_run_failure_lines_are_in_the_default_themes_error_colour():
    _, style = progress_line(ErrorEvent(where="load", message="boom"))
    assert colour_of(style) == opaque(DEFAULT_THEME, "error")
    assert default_variables() == theme_variables(THEMES[DEFAULT_THEME])


class ThemedApp(App):
    CSS_PATH = CSS_PATH

    def __init__(self, *widgets, theme: str) -> None:
        super().__init__()
        self._widgets, self._theme_name = widgets, theme

    def compose(self) -> ComposeResult:
        yield from self._widgets

    def on_mount(self) -> None:
        register_themes(self, activate=self._theme_name)


STATE_VARIABLE = {"resident": "success", "device": "primary", "host": "foreground-muted", "in_flight": "warning"}


def state_colours(panel: ResidencyPanel) -> dict[str, str | None]:
    table = panel.query_one(DataTable)
    cells = {r.name: table.get_cell(r.name, "state") for r in panel.rows}
    return {name: colour_of(cell.style) for name, cell in cells.items() if isinstance(cell, Text)}


async def test_residency_panel_follows_the_theme_when_it_changes():
    panel = ResidencyPanel()
    app = ThemedApp(panel, theme=TWO_THEMES[0])
    async with app.run_test(size=(120, 40)) as pilot:
        panel.update_rows([(state, state, 1000) for state in STATE_VARIABLE])
        await pilot.pause()
        for theme in (*TWO_THEMES, TWO_THEMES[0]):
            app.theme = theme
            await pilot.pause()
            assert state_colours(panel) == {s: opaque(theme, v) for s, v in STATE_VARIABLE.items()}, theme


async def test_component_table_follows_the_theme_when_it_changes(demo_plan):
    table = ComponentTable()
    app = ThemedApp(table, theme=TWO_THEMES[0])
    async with app.run_test(size=(160, 40)) as pilot:
        table.show_plan(demo_plan)
        await pilot.pause()
        for theme in TWO_THEMES:
            app.theme = theme
            await pilot.pause()
            shown = {c.info.name: colour_of(table.get_cell(c.info.name, "residency").style)
                     for c in demo_plan.components}
            assert shown == {c.info.name: opaque(theme, RESIDENCY_VARIABLE[c.residency])
                             for c in demo_plan.components}, theme


async def test_forecast_short_verdict_is_the_themes_error_colour(demo_plan):
    panel = ForecastPanel()
    app = ThemedApp(panel, theme=TWO_THEMES[0])
    async with app.run_test(size=(160, 40)) as pilot:
        panel.show(demo_plan, LinkInfo(is_cuda=True, free_bytes=1, free_source="test"))
        assert panel.rows["fits in device free memory"].startswith("NO")
        for theme in TWO_THEMES:
            app.theme = theme
            await pilot.pause()
            colours = rendered_colours(panel.content)  # the rich table the panel draws
            assert opaque(theme, "error") in colours and colours <= palette(theme), theme


@pytest.mark.slow
async def test_pressing_t_recolours_the_plan_screens_residency_cells(engine, tmp_path):
    """The real console: each `t` press moves every residency cell to the next theme's colours."""
    app = make_app(engine, tmp_path, theme=DEFAULT_THEME)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            table = app.plan_screen.query_one(ComponentTable)
            seen = set()
            for _ in THEMES:
                await pilot.press("t")
                await pilot.pause()
                theme = app.theme
                seen.add(theme)
                shown = {c.info.name: colour_of(table.get_cell(c.info.name, "residency").style)
                         for c in table.plan.components}
                assert shown == {c.info.name: opaque(theme, RESIDENCY_VARIABLE[c.residency])
                                 for c in table.plan.components}, theme
            assert seen == set(THEMES)
    finally:
        app.shutdown()
