"""The live screen's LoRA panel: the `--lora` files, each one's scale and on/off, and the mode applied.

Shown only when the console was started with `--lora` (other screens stay as they were). The keys are the
live screen's (`LORA_BINDINGS`): the panel shows the set, `LoraSet` holds it, and each request the console
submits carries it, so a change applies to the next request. The title's mode is the engine's: with `auto`,
the mode it resolved for the set it last applied (its `LorasApplied` event: at load, and each time a request
switches the set or a re-plan changes the plan), so it follows when a switch makes `auto` choose otherwise.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ..lora_set import LoraSet


def mode_words(mode: str, chosen: str | None) -> str:
    return f"auto ({chosen})" if mode == "auto" and chosen else mode


class LoraPanel(Static):
    """One line per LoRA file: ▶ marks the selection, then on/off, scale and file name."""

    DEFAULT_CSS = """
    LoraPanel { height: auto; max-height: 6; border: round $primary-darken-1; padding: 0 1; }
    """

    def __init__(self, loras: LoraSet, chosen_mode: str | None = None, *, id: str | None = None) -> None:
        super().__init__("", id=id, markup=False)
        self.loras = loras
        self.chosen_mode = chosen_mode
        self.refresh_rows()

    def show_chosen(self, chosen: str | None) -> None:
        """The mode the engine applied the LoRA set in (its `LorasApplied`; None: no LoRA applied)."""
        self.chosen_mode = chosen
        self.refresh_rows()

    def refresh_rows(self) -> None:
        """Show the set as it is now (after a key changed it)."""
        self.border_title = f"LoRA · mode {mode_words(self.loras.mode, self.chosen_mode)} · next request"
        text = Text(no_wrap=True, overflow="ellipsis")
        for i, entry in enumerate(self.loras.entries):
            if i:
                text.append("\n")
            text.append("▶ " if i == self.loras.selected else "  ")
            text.append("on  " if entry.on else "off ", style="bold" if entry.on else "dim")
            text.append(f"×{entry.scale:<5g} ")
            text.append(entry.name, style="" if entry.on else "dim")
        self.update(text)
