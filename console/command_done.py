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




class EngineAnswered(Message):
    """An `EngineAnswers` value came back from the engine thread (`kind`: "plan" for the plan screen's request
    forecast, "dialog" for the generate dialog's); the UI thread keeps it and redraws what shows it."""

    def __init__(self, kind: str, answers: object, key: object, future: Future) -> None:
        super().__init__()
        self.kind = kind
        self.answers = answers
        self.key = key
        self.future = future
