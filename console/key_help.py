"""The help screen's sections: every binding of the app, its screens and dialogs, from their BINDINGS.

Generated from the bindings themselves so the list cannot go stale; the few keys that belong to a
widget rather than a binding (navigation, the table's arrows, enter in a form) are added by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from textual.binding import Binding, BindingType

from .screens import GenerateDialog, HelpScreen, LiveScreen, NoticeLogScreen, PlanScreen
from .screens.help import Section, binding_rows
from .screens.live import LORA_BINDINGS, RANK_BINDING
from .widgets import FilterBar

NAVIGATION_ROWS = [
    ("tab / shift+tab", "focus the next / previous panel (its title is shown reversed)"),
    ("pgup / pgdn, home / end", "scroll the focused panel (or the screen around it)"),
]
PLAN_TABLE_ROWS = [("↑ / ↓", "move the selection in the component table (as j / k)")]
PALETTE_TEXT = "command palette: load, unload, generate, cancel, copy, theme, help"


def help_sections(app_bindings: Iterable[BindingType], palette_key: str,
                  key_display: Callable[[Binding], str], world: int = 1, lora_keys: bool = False) -> list[Section]:
    """(title, rows) per place a key works, in the order an operator meets them; `world` > 1 (a
    multi-GPU group) adds the live screen's rank key, `lora_keys` (started with --lora) its LoRA keys."""
    def rows(bindings: Iterable[BindingType]) -> list[tuple[str, str]]:
        return binding_rows(bindings, key_display)

    return [
        ("anywhere", [*rows(app_bindings), (palette_key, PALETTE_TEXT), *NAVIGATION_ROWS]),
        ("plan screen (before load)", [*PLAN_TABLE_ROWS, *rows(PlanScreen.BINDINGS)]),
        ("live screen (after load)", rows([*LiveScreen.BINDINGS, *([RANK_BINDING] if world > 1 else []),
                                               *(LORA_BINDINGS if lora_keys else [])])),
        ("staging log filter (after /)", [*rows(FilterBar.BINDINGS), ("enter", "keep the filter, close the bar")]),
        ("generate dialog (after g)", [*rows(GenerateDialog.BINDINGS), ("enter", "run the request")]),
        ("plots (after v)", rows(_plot_bindings())),
        ("notice log (after n)", [("pgup / pgdn, home / end", "scroll"), *rows(NoticeLogScreen.BINDINGS)]),
        ("this help", rows(HelpScreen.BINDINGS)),
    ]


def _plot_bindings() -> list[BindingType]:
    from .screens.plots import PlotScreen  # the plotting library loads when it is first needed

    return list(PlotScreen.BINDINGS)
