"""Command palette entries (ctrl+p) for the console's main actions, next to Textual's own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from textual.app import SystemCommand

if TYPE_CHECKING:
    from .host import ConsoleHost


def console_commands(app: ConsoleHost) -> Iterator[SystemCommand]:
    """Load / unload / generate / cancel / copy / theme / help, each naming its key."""
    entries: list[tuple[str, str, Callable[[], object]]] = [
        ("Load model", "load with the current policy (l on the plan screen)", app.action_load),
        ("Unload model", "unload and return to the plan screen (u)", app.action_unload),
        ("Generate", "open the generate dialog (g on the live screen)", app.action_generate),
        ("Cancel", "cancel the load or request in flight (esc)", app.action_cancel),
        ("Copy vLLM-Omni command", "copy the equivalent vllm serve line (c)", app.action_copy_command),
        ("Next theme", "cycle the omni themes (t)", app.action_cycle_theme),
        ("Help", "list every key binding (?)", app.action_help),
        ("Request history", "the requests served so far, newest first (run's too)", app.action_history),
    ]
    for title, help_text, callback in entries:
        yield SystemCommand(title, help_text, callback)
