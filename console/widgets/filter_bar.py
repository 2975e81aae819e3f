"""A one-line substring filter input (opened with `/`, closed with Esc), like htop/btop/k9s.

In a multi-GPU group its title also says which rank's lines the log shows (`rank: all`, `rank: 1`).
"""

from __future__ import annotations

from textual.binding import Binding
from textual.message import Message
from textual.widgets import Input

from .plain_input import PlainInput


class FilterBar(PlainInput):
    """Posts `FilterChanged` as the user types and `Closed` on Esc/Enter.

    Esc clears the filter; Enter keeps it and just closes the bar.
    """

    DEFAULT_CSS = """
    FilterBar { height: 3; border: tall $accent; }
    """

    BINDINGS = [
        Binding("escape", "clear_and_close", "clear filter", show=True, id="filter.clear"),
    ]

    class FilterChanged(Message):
        """The filter text changed (empty: no filter)."""

        def __init__(self, bar: FilterBar, text: str) -> None:
            super().__init__()
            self.bar = bar
            self.text = text

        @property
        def control(self) -> FilterBar:
            return self.bar

    class Closed(Message):
        """The user is done with the bar (the owner hides it and refocuses)."""

        def __init__(self, bar: FilterBar) -> None:
            super().__init__()
            self.bar = bar

        @property
        def control(self) -> FilterBar:
            return self.bar

    def __init__(
        self, value: str = "", *, placeholder: str = "filter (substring; Esc clears)", **kwargs
    ) -> None:
        super().__init__(value=value, placeholder=placeholder, **kwargs)

    def show_rank(self, rank: int | None) -> None:
        """Say which rank the log is narrowed to (None: all ranks)."""
        self.border_title = f"rank: {'all' if rank is None else rank}"

    def _on_input_changed(self, event: Input.Changed) -> None:
        if event.input is self:
            self.post_message(self.FilterChanged(self, event.value))

    def _on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input is self:
            event.stop()
            self.post_message(self.Closed(self))

    def action_clear_and_close(self) -> None:
        if self.value:
            self.value = ""  # posts Input.Changed -> FilterChanged("")
        self.post_message(self.Closed(self))
