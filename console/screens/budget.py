"""The VRAM-budget dialog (b on the plan screen): one size field; Enter plans, Esc cancels.

The size is checked here (`args.parse_budget`: a size, or `auto` for what the GPU has free now less
a margin), so a typo is answered in the dialog and never reaches the planner; the app runs the
planner off the UI thread.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from ...engine.api import plain
from ...engine.errors import ConfigError
from ..args import parse_budget
from ..widgets.plain_input import PlainInput


class BudgetDialog(ModalScreen[int | None]):
    """Returns the budget in bytes, or None when cancelled."""

    DEFAULT_CSS = """
    BudgetDialog { align: center middle; }
    BudgetDialog > Vertical { width: 60; height: auto; border: round $accent; background: $surface; padding: 0 1; }
    BudgetDialog #budget-error { color: $error; height: auto; }
    """

    BINDINGS = [Binding("escape", "cancel", "cancel", id="budget.cancel")]

    def __init__(self, value: str = "", device: str | None = None) -> None:
        super().__init__()
        self.value, self.device = value, device

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "VRAM budget (Enter plans, Esc cancels)"
            yield Static("the fastest policy whose device memory of the process fits, e.g. 24GB, 24GiB or auto",
                         markup=False)
            yield PlainInput(self.value, placeholder="24GB", id="budget-size", compact=True)
            yield Static("", id="budget-error", markup=False)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            budget = parse_budget(event.value, self.device, "the budget")
        except ConfigError as exc:
            self.query_one("#budget-error", Static).update(plain(exc))
            return
        self.dismiss(budget)

    def action_cancel(self) -> None:
        self.dismiss(None)
