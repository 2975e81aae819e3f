"""The plan screen (before load): components, policy toggles, the vLLM-Omni flags and the forecast.

Keys edit the app's policy through `policy_edits`; the app re-plans and calls `show_plan`, so
the table, the JSON preview and the forecast always describe the same policy. While a load
runs, the toggles are disabled (greyed in the footer) and Esc cancels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, Log, Static

from ...engine.plan import Plan
from ...offload.events import LoadProgress
from ..widgets.load_progress import LoadProgressPanel
from ..widgets.plan_blocks import BlockListPanel
from ..widgets.plan_forecast import ForecastPanel, LinkInfo
from ..widgets.plan_policy import PolicyPanel
from ..widgets.plan_table import ComponentTable

if TYPE_CHECKING:
    from ..app import OmniConsoleApp

LAYERS = Binding.Group("layers")
"""+ and - share one footer entry (`+ - layers`), so the footer fits 80 columns."""
EDIT_ACTIONS = {"toggle", "toggle_default", "clear_entry", "layers_up", "layers_down", "switch_mode", "load"}


class PlanScreen(Screen[None]):
    """Before load: choose the policy and read what it costs."""

    BINDINGS = [
        Binding("j", "cursor_down", "down", show=False, id="plan.down"),
        Binding("k", "cursor_up", "up", show=False, id="plan.up"),
        Binding("l", "load", "load", id="plan.load", tooltip="load the model with this policy"),
        Binding("space,enter", "toggle", "toggle", priority=True, id="plan.toggle",
                tooltip="toggle the selected encoder/VAE between resident and offloaded (space or enter)"),
        Binding("d", "toggle_default", "default", id="plan.default",
                tooltip='flip the "default" entry (components without their own entry)'),
        Binding("x", "clear_entry", "clear", id="plan.clear",
                tooltip="remove the selected component's explicit entry (back to default)"),
        Binding("plus,equals_sign", "layers_up", "+layer", id="plan.layers_up", group=LAYERS,
                tooltip="one more resident leading DiT layer (+)"),
        Binding("minus", "layers_down", "-layer", id="plan.layers_down", group=LAYERS,
                tooltip="one fewer resident leading DiT layer (-)"),
        Binding("m", "switch_mode", "mode", id="plan.mode", tooltip="switch mode dlo ⇄ resident (baseline)"),
        Binding("c", "copy_command", "copy", id="plan.copy",
                tooltip="copy the vllm serve command to the clipboard"),
        Binding("escape", "cancel", "cancel load", id="plan.cancel", tooltip="cancel the load in progress"),
    ]

    DEFAULT_CSS = """
    PlanScreen #plan-body { height: 1fr; }
    PlanScreen #plan-header { height: auto; padding: 0 1; }
    PlanScreen #plan-status { height: auto; padding: 0 1; }
    PlanScreen #plan-status.-empty { display: none; }
    PlanScreen #plan-status.-error { color: $error; text-style: bold; }
    PlanScreen #plan-status.-warning { color: $warning; }
    PlanScreen LoadProgressPanel { display: none; }
    PlanScreen.-loading LoadProgressPanel { display: block; }
    PlanScreen #load-log { height: 10; display: none; border: round $accent; }
    PlanScreen.-loading #load-log, PlanScreen.-failed #load-log { display: block; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.table = ComponentTable(id="components")
        self.policy_panel = PolicyPanel(id="policy")
        self.forecast = ForecastPanel(id="forecast")
        self.blocks = BlockListPanel(id="block-lists")
        self.progress = LoadProgressPanel(id="load-progress")
        self.header = Static("", id="plan-header", markup=False)
        self.status_line = Static("", id="plan-status", markup=False, classes="-empty")
        self.load_log = Log(max_lines=2000, id="load-log")
        self.status = ""

    @property
    def console_app(self) -> OmniConsoleApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll(id="plan-body"):
            yield self.header
            yield self.table
            yield self.status_line
            yield self.progress
            yield self.load_log
            yield self.forecast  # before the rest: at 80x24 it fits under the table without scrolling
            yield self.blocks
            yield self.policy_panel
        yield Footer(compact=True, show_command_palette=False)  # ^p is in the help (?)

    def on_mount(self) -> None:
        self.table.border_title = "components"
        self.load_log.border_title = "engine events"
        self.console_app.refresh_plan_views()
        self.table.focus()

    # ---- what the app calls ---------------------------------------------------------------

    def show_plan(self, plan: Plan, link: LinkInfo, header: str) -> None:
        self.table.show_plan(plan)
        self.policy_panel.show_plan(plan)
        self.blocks.show_plan(plan)
        self.show_link(plan, link)
        self.header.update(header)

    def show_link(self, plan: Plan, link: LinkInfo) -> None:
        self.forecast.show(plan, link)

    def set_status(self, text: str, severity: str = "") -> None:
        self.status = text
        status = self.status_line
        status.update(text)
        status.set_class(not text, "-empty")
        status.set_class(severity == "error", "-error")
        status.set_class(severity == "warning", "-warning")

    def load_started(self) -> None:
        self.progress.reset()
        self.load_log.clear()
        self.set_class(True, "-loading")
        self.set_class(False, "-failed")
        self.set_status("loading… (esc cancels)")
        self.refresh_bindings()

    def load_events(self, progress: list[LoadProgress], lines: list[str]) -> None:
        """One drained batch: the latest progress per component and the event lines."""
        for event in progress:
            self.progress.add_progress(event)
        if lines:
            self.load_log.write_lines(lines)

    def load_ended(self, error: str | None, cancelled: bool = False) -> None:
        self.set_class(False, "-loading")
        self.set_class(error is not None, "-failed")
        if error is None:
            self.set_status("")
        elif cancelled:
            self.set_status("load cancelled — memory released", "warning")
        else:
            self.set_status(f"load failed: {error} — memory released; change the policy or press l to retry",
                            "error")
        self.refresh_bindings()

    # ---- keys ------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        busy = self.console_app.phase != "plan"
        if action == "cancel":
            return busy
        if action in EDIT_ACTIONS and busy:
            return None  # shown greyed while loading
        return True

    def action_cursor_down(self) -> None:
        self.table.action_cursor_down()

    def action_cursor_up(self) -> None:
        self.table.action_cursor_up()

    def _selected(self) -> str | None:
        return self.table.selected_name

    def action_toggle(self) -> None:
        name = self._selected()
        if name is not None:
            self.console_app.edit_toggle(name)

    def action_clear_entry(self) -> None:
        name = self._selected()
        if name is not None:
            self.console_app.edit_clear(name)

    def action_toggle_default(self) -> None:
        self.console_app.edit_default()

    def action_layers_up(self) -> None:
        self.console_app.edit_layers(+1)

    def action_layers_down(self) -> None:
        self.console_app.edit_layers(-1)

    def action_switch_mode(self) -> None:
        self.console_app.edit_mode()

    def action_load(self) -> None:
        self.console_app.action_load()

    def action_cancel(self) -> None:
        self.console_app.action_cancel()

    def action_copy_command(self) -> None:
        self.console_app.action_copy_command()
