"""The VRAM-budget dialog (b on the plan screen): one size field; Enter plans, Esc cancels.

The size is checked here (`args.parse_budget`: a size, or `auto` for what the GPU has free now less
a margin), so a typo is answered in the dialog and never reaches the planner; the app runs the
planner off the UI thread. The field starts from the budget last entered, and the dialog says what
`auto` would give now (or why it cannot), so nothing on it is an example posing as a value.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from ...engine.api import plain, planner
from ...engine.errors import ConfigError
from ..args import parse_budget
from ..widgets.plain_input import PlainInput


def auto_text(device: str | None) -> str:
    """What `auto` gives on `device` now (free memory less the margin), or why it gives nothing."""
    from ...offload.units import format_bytes

    try:
        return f"auto now: {format_bytes(planner.auto_budget(device, 'auto'))} (free less a margin)"
    except ConfigError as exc:
        return f"auto now: none — {plain(str(exc).removeprefix('auto: ').split('; ')[0])}"


class BudgetDialog(ModalScreen[tuple[int, str] | None]):
    """Returns the budget in bytes and as entered, or None when cancelled."""

    DEFAULT_CSS = """
    BudgetDialog { align: center middle; }
    BudgetDialog > Vertical { width: 60; height: auto; border: round $accent; background: $surface; padding: 0 1; }
    BudgetDialog #budget-error { color: $error; height: auto; }
    """

    BINDINGS = [Binding("escape", "cancel", "cancel", id="budget.cancel")]

    def __init__(self, value: str = "", device: str | None = None, auto_line: str | None = None) -> None:
        """`value`: the budget last entered (empty: none yet); `auto_line`: what `auto` means now (default:
        read from `device` here, `auto_text`)."""
        super().__init__()
        self.value, self.device = value, device
        self.auto_line = auto_text(device) if auto_line is None else auto_line

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "VRAM budget (Enter plans, Esc cancels)"
            yield Static("the fastest policy whose device memory of the process fits: a size (24GB, 24GiB) or auto",
                         markup=False)
            yield Static(f"last budget: {plain(self.value)}" if self.value else "last budget: none (the policy as "
                         "edited)", id="budget-last", markup=False)
            yield Static(self.auto_line, id="budget-auto", markup=False)
            yield PlainInput(self.value, placeholder="a size or auto", id="budget-size", compact=True)
            yield Static("", id="budget-error", markup=False)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            budget = parse_budget(event.value, self.device, "the budget")
        except ConfigError as exc:
            self.query_one("#budget-error", Static).update(plain(exc))
            return
        self.dismiss((budget, event.value.strip()))

    def action_cancel(self) -> None:
        self.dismiss(None)
