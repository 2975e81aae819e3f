"""The request history as a table (no Textual): one row per served request, newest first.

What an operator looks for again: the prompt, the size, the policy, the step time, the peak, where the
output went and how it ended. Every value from the file is data (`plain`): the history is cache input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from ..engine.api import plain
from ..offload.units import format_bytes, format_seconds
from .lora_set import lora_text

STATUS_STYLE = {"done": "", "failed": "bold red", "cancelled": "yellow"}


def size_text(request: Any) -> str:
    """`64x64`, with frames for a video (`64x64x9`); `default` where the pipeline chose; then the LoRA set the
    request carried, if any (`64x64 · LoRA a×0.8`)."""
    lora = plain(lora_text(getattr(request, "loras", None)))  # file names from a history file: data
    if request.width is None or request.height is None:
        return "default" + (f" · {lora}" if lora else "")
    return (f"{request.width}x{request.height}" + (f"x{request.frames}" if request.frames else "")
            + (f" · {lora}" if lora else ""))


def policy_text(policy: dict[str, Any]) -> str:
    """`dlo r1 k2` (resident blocks, ring slots) or the mode alone; its values are the history file's (data)."""
    mode = plain(policy.get("mode", "?"))
    if mode != "dlo":
        return mode
    return plain(f"dlo r{policy.get('resident_layers', '?')} k{policy.get('prefetch_slots', '?')}")


def history_table(entries: Sequence[Any], selected: int | None = None) -> Table | Text:
    """Newest first; `no requests yet` when there are none. `selected`: the row (0: the newest) shown
    highlighted, the one `enter` re-runs."""
    if not entries:
        return Text("no requests yet")
    table = Table(box=None, padding=(0, 1), expand=True, header_style="bold")
    for name, options in (("#", {"justify": "right"}), ("status", {}), ("prompt", {"ratio": 2}), ("size", {}),
                          ("policy", {}), ("step", {"justify": "right"}), ("peak", {"justify": "right"}),
                          ("output", {"ratio": 3})):
        table.add_column(name, no_wrap=True, overflow="ellipsis", **options)
    for row, e in enumerate(reversed(entries)):
        output = e.files[0] if e.files else (e.error or "—")
        table.add_row(str(e.ticket), Text(e.status, style=STATUS_STYLE.get(e.status, "")),
                      Text(plain(e.request.prompt)), size_text(e.request), Text(policy_text(e.policy)),
                      format_seconds(e.step_s) if e.step_s is not None else "—",
                      format_bytes(e.peak_bytes) if e.peak_bytes is not None else "—",
                      Text(plain(output) + (f" (+{len(e.files) - 1})" if len(e.files) > 1 else "")),
                      style="reverse" if row == selected else "")
    return table
