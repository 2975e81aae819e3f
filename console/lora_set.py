"""The console's LoRA set: the `--lora` files it started with, each on or off at its own scale.

The live screen's LoRA panel edits it (toggle, scale ±0.1, selection); each request the console submits
takes a copy (`request_loras`) into `GenerateRequest.loras`, so a queued request keeps the set it was
queued with and the engine switches to it between requests. Torch-free: the files were checked when the
engine opened them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from .lora_flags import MAX_SCALE

SCALE_STEP = 0.1


@dataclass(frozen=True)
class LoraEntry:
    """One `--lora` file as the panel shows it."""

    path: str
    scale: float
    on: bool = True

    @property
    def name(self) -> str:
        return Path(self.path).name


class LoraSet:
    """The files in `--lora` order, the selected row, and the `--lora-mode` they are applied with."""

    def __init__(self, loras: Iterable[tuple[str, float]], mode: str = "auto") -> None:
        self.entries = [LoraEntry(str(path), float(scale)) for path, scale in loras]
        self.mode = mode
        self.selected = 0

    def __bool__(self) -> bool:
        return bool(self.entries)

    def move(self, delta: int) -> None:
        if self.entries:
            self.selected = (self.selected + delta) % len(self.entries)

    def toggle(self) -> LoraEntry | None:
        return self._change(lambda e: replace(e, on=not e.on))

    def rescale(self, delta: float) -> LoraEntry | None:
        """The selected file's scale by `delta`, rounded to the step (no float drift), within ±MAX_SCALE."""
        return self._change(lambda e: replace(e, scale=max(-MAX_SCALE, min(MAX_SCALE, round(e.scale + delta, 6)))))

    def _change(self, edit) -> LoraEntry | None:
        if not self.entries:
            return None
        self.entries[self.selected] = edit(self.entries[self.selected])
        return self.entries[self.selected]

    def request_loras(self) -> tuple[tuple[str, float], ...]:
        """What a request carries: the files that are on, in order, at their scales."""
        return tuple((e.path, e.scale) for e in self.entries if e.on)


def lora_text(loras: tuple[tuple[str, float], ...] | None) -> str:
    """A request's set in a few characters for the queue and history: `LoRA a×0.8 b×1`, `LoRA off`."""
    if loras is None:
        return ""
    if not loras:
        return "LoRA off"
    return "LoRA " + " ".join(f"{Path(path).stem}×{scale:g}" for path, scale in loras)
