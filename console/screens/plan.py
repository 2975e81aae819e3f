"""The plan screen (before load): components, policy toggles, the vLLM-Omni flags and the forecast.

Keys edit the app's policy (`app.edit(...)` actions, or `edit_selected` for the selected row); the
app re-plans and calls `show_plan`, so the table, the JSON preview and the forecast always describe
the same policy. While a load runs (`busy`), the toggles are disabled (greyed in the footer) and Esc
cancels. The screen owns its widgets: the app calls its methods, never a widget's.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.reactive import var
from textual.screen import Screen
from textual.widgets import Header, Log, Static

from ...engine import events
from ...engine.api import Plan, RequestForecast, plain_lines
from ..plan_context import LinkInfo
from ..widgets.load_progress import LoadProgressPanel
from ..widgets.plan_blocks import BlockListPanel
from ..widgets.plan_forecast import ForecastPanel
from ..widgets.plan_policy import PolicyPanel
from ..widgets.plan_ram import RamPlanPanel
from ..widgets.plan_table import ComponentTable
from ..widgets.steady_footer import SteadyFooter

LAYERS = Binding.Group("layers")
SLOTS = Binding.Group("slots")
"""+ and - share one footer entry (`+ - layers`), so the footer fits 80 columns."""
SELECTION_EDITS = {"toggle", "clear_entry"}
"""The screen's own edit actions: they need the selected row, so they are not app actions."""


class PlanScreen(Screen[None]):
    """Before load: choose the policy and read what it costs."""

    BINDINGS = [
        Binding("j", "cursor_down", "down", show=False, id="plan.down"),
        Binding("k", "cursor_up", "up", show=False, id="plan.up"),
        Binding("l", "app.load", "load", id="plan.load", tooltip="load the model with this policy"),
        Binding("space,enter", "toggle", "toggle", priority=True, id="plan.toggle",
                tooltip="toggle the selected encoder/VAE between resident and offloaded (space or enter)"),
        Binding("d", "app.edit('default')", "default", id="plan.default",
                tooltip='flip the "default" entry (components without their own entry)'),
        Binding("x", "clear_entry", "clear", id="plan.clear",
                tooltip="remove the selected component's explicit entry (back to default)"),
        Binding("plus,equals_sign", "app.edit('layers', 1)", "+layer", id="plan.layers_up", group=LAYERS,
                tooltip="one more resident leading block of the DiT or UNet (+)"),
        Binding("minus", "app.edit('layers', -1)", "-layer", id="plan.layers_down", group=LAYERS,
                tooltip="one fewer resident leading block of the DiT or UNet (-)"),
        Binding("m", "app.edit('mode')", "mode", id="plan.mode", tooltip="switch mode dlo ⇄ resident (baseline)"),
        Binding("o", "app.edit('placement')", "placement", id="plan.placement", show=False,  # o on live too
                tooltip="resident blocks: leading (vLLM-Omni) ⇄ spread between the streamed ones"),
        Binding("right_square_bracket", "app.edit('slots', 1)", "+slot", id="plan.slots_up", group=SLOTS, show=False,
                tooltip="one more prefetch slot (copies run further ahead; one more block of device memory)"),
        Binding("left_square_bracket", "app.edit('slots', -1)", "-slot", id="plan.slots_down", group=SLOTS, show=False,
                tooltip="one prefetch slot less"),
        Binding("b", "app.budget", "budget", id="plan.budget", show=False,
                tooltip="VRAM budget: the planner chooses the fastest policy that fits"),
        Binding("c", "app.copy_command", "copy", id="plan.copy",
                tooltip="copy the vllm serve command to the clipboard"),
        Binding("escape", "app.cancel", "cancel load", id="plan.cancel", tooltip="cancel the load in progress"),
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
        self.ram = RamPlanPanel(id="ram-plan")  # --ram-budget's decisions (hidden without one)
        self.blocks = BlockListPanel(id="block-lists")
        self.progress = LoadProgressPanel(id="load-progress")
        self.header = Static("", id="plan-header", markup=False)
        self.status_line = Static("", id="plan-status", markup=False, classes="-empty")
        self.load_log = Log(max_lines=2000, id="load-log")
        self.status = ""
        self.cache: object = None
        """The next request's step cache (a `CacheSpec`; the app sets it): the forecast gives its step as a range."""

    busy = var(False)
    """A load is running: the selection's edits are greyed (the app's own actions check its phase)."""

    class Ready(Message):
        """Mounted: the app fills the views for the current policy."""

    class EditSelected(Message):
        """space/enter or x on a component row: the app applies `what` to the component `name`."""

        def __init__(self, what: str, name: str) -> None:
            super().__init__()
            self.what = what
            self.name = name

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll(id="plan-body"):
            yield self.header
            yield self.table
            yield self.status_line
            yield self.progress
            yield self.load_log
            yield self.forecast  # before the rest: at 80x24 it fits under the table without scrolling
            yield self.ram
            yield self.blocks
            yield self.policy_panel
        yield SteadyFooter(compact=True, show_command_palette=False)  # ^p is in the help (?)

    def on_mount(self) -> None:
        self.table.border_title = "components"
        self.load_log.border_title = "engine events"
        self.post_message(self.Ready())
        self.table.focus()

    # ---- what the app calls ---------------------------------------------------------------

    def show_plan(self, plan: Plan, link: LinkInfo, header: str, request: RequestForecast | None = None,
                  forecasting: bool = False) -> None:
        self.table.show_plan(plan)
        self.policy_panel.show_plan(plan)
        self.blocks.show_plan(plan)
        self.show_link(plan, link, header, request, forecasting)
        self.refresh_bindings()

    def show_link(self, plan: Plan, link: LinkInfo, header: str, request: RequestForecast | None = None,
                  forecasting: bool = False) -> None:
        """The parts that follow the machine (free memory, bandwidth): forecast and header. `forecasting`: the
        request forecast is still on its way from the engine thread."""
        self.forecast.show(plan, link, request, forecasting, self.cache)
        self.header.update(plain_lines(header))

    def show_ram(self, answer: object, pending: bool = False) -> None:
        """`--ram-budget`'s tiers for the plan on screen ((plan, RamPlan), the refusal, or None: no budget)."""
        self.ram.show(answer, pending)  # type: ignore[arg-type]

    def set_status(self, text: str, severity: str = "") -> None:
        self.status = text
        status = self.status_line
        status.update(plain_lines(text))
        status.set_class(not text, "-empty")
        status.set_class(severity == "error", "-error")
        status.set_class(severity == "warning", "-warning")

    def load_started(self) -> None:
        self.progress.reset()
        self.load_log.clear()
        self.set_class(True, "-loading")
        self.set_class(False, "-failed")
        self.set_status("loading… (esc cancels)")
        self.busy = True
        self.refresh_bindings()

    def load_events(self, progress: list[events.LoadProgress], lines: list[str]) -> None:
        """One drained batch: the latest progress per component and the event lines."""
        for event in progress:
            self.progress.add_progress(event)
        if lines:
            self.load_log.write_lines(lines)

    def load_ended(self, error: str | None, cancelled: bool = False) -> None:
        self.busy = False
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
        if action in SELECTION_EDITS and self.busy:
            return None  # shown greyed while loading
        return True

    def action_cursor_down(self) -> None:
        self.table.action_cursor_down()

    def action_cursor_up(self) -> None:
        self.table.action_cursor_up()

    def action_toggle(self) -> None:
        self._edit_selected("toggle")

    def action_clear_entry(self) -> None:
        self._edit_selected("clear")

    def _edit_selected(self, what: str) -> None:
        name = self.table.selected_name
        if name is not None:
            self.post_message(self.EditSelected(what, name))
