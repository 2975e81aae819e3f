"""The message a worker command's completion comes back as (posted from the engine thread)."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

from textual.message import Message


class CommandDone(Message):
    """A worker future finished (posted from the engine thread; handled on the UI thread)."""

    def __init__(self, kind: str, future: Future, output: Path | None = None, save_error: str | None = None) -> None:
        super().__init__()
        self.kind = kind
        self.future = future
        self.output = output
        self.save_error = save_error


