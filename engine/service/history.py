"""The requests served so far, newest last: persisted under the cache dir, read back as untrusted input.

Each entry holds what re-running it needs (the request's fields, the policy) and what the history screen
shows (figures, output paths, status), plus the run report. The file is bounded (`MAX_ENTRIES`,
`MAX_BYTES`, each report at most `MAX_REPORT_BYTES`), pruned oldest first, written atomically, and read
through `cache_dir.read_cache_file`: a file that is not a regular file, is too large or fails validation
is ignored with one note, and the history starts empty (the next save replaces it).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..cache_dir import CacheFileError, cache_root, read_cache_file, write_cache_file
from ..errors import ConfigError
from ..running.cache_spec import parse_cache

MAX_ENTRIES = 200
MAX_BYTES = 8 * 2**20
MAX_REPORT_BYTES = 256 * 2**10
HISTORY_SCHEMA = "omni-console.history/1"

Status = Literal["done", "failed", "cancelled"]
_Text = Field(max_length=4096)
_Path = Annotated[str, Field(max_length=4096)]
_Scale = Annotated[float, Field(allow_inf_nan=False)]


class HistoryRequest(BaseModel):
    """A request's fields as submitted (enough to submit it again)."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(max_length=65536)
    steps: int | None = Field(None, ge=1, le=100_000)
    height: int | None = Field(None, ge=1, le=1_000_000)
    width: int | None = Field(None, ge=1, le=1_000_000)
    seed: int = Field(0, ge=0, le=2**64 - 1)
    guidance: float | None = Field(None, allow_inf_nan=False)
    frames: int | None = Field(None, ge=1, le=1_000_000)
    negative_prompt: str | None = Field(None, max_length=65536)
    max_sequence_length: int | None = Field(None, ge=1, le=1_000_000)
    image: str | None = Field(None, max_length=4096)
    params: dict[str, Any] = Field(default_factory=dict)
    output: str = _Text
    overwrite: bool = False
    fps: float | None = Field(None, gt=0, allow_inf_nan=False)
    cache: str | None = Field(None, max_length=4096, description="--cache as given (kind:key=value,...); null: off")
    loras: list[tuple[_Path, _Scale]] | None = Field(None, max_length=256,
                                                  description="the LoRA set it carried (path, scale), shown in the "
                                                              "history; null: the set as loaded")

    @field_validator("cache")
    @classmethod
    def _cache_parses(cls, value: str | None) -> str | None:
        """A history file is cache input: a --cache text that does not parse makes the entry invalid."""
        if value is not None:
            try:
                parse_cache(value)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return value


class HistoryEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ticket: int = Field(ge=1)
    finished_at: str = Field(max_length=64, description="ISO 8601, UTC")
    model: str = _Text
    request: HistoryRequest
    policy: dict[str, Any] = Field(default_factory=dict)
    status: Status
    error: str = Field("", max_length=4096)
    seconds: float | None = Field(None, ge=0, allow_inf_nan=False)
    step_s: float | None = Field(None, ge=0, allow_inf_nan=False, description="median step")
    peak_bytes: int | None = Field(None, ge=0)
    files: list[str] = Field(default_factory=list, max_length=100_000)
    report: dict[str, Any] | None = Field(None, description="the run report (null when over MAX_REPORT_BYTES)")


class HistoryFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_id: Literal["omni-console.history/1"] = Field(HISTORY_SCHEMA, alias="schema")
    entries: list[HistoryEntry] = Field(default_factory=list, max_length=MAX_ENTRIES)


def history_path() -> Path:
    return cache_root() / "history.json"


def bounded_report(report: dict[str, Any] | None) -> dict[str, Any] | None:
    """The report if its JSON fits `MAX_REPORT_BYTES`, else None (the entry's own figures remain)."""
    if report is None:
        return None
    return report if len(json.dumps(report)) <= MAX_REPORT_BYTES else None


class History:
    """The entries in memory, saved after each `add`; `note`: why the file on disk was ignored, if it was."""

    def __init__(self, path: Path | None = None, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.path = path or history_path()
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.note: str | None = None
        self._lock = threading.Lock()
        self._entries = self._read()

    def _read(self) -> list[HistoryEntry]:
        try:
            raw = read_cache_file(self.path, self.max_bytes)
            if raw is None:
                return []
            return HistoryFile.model_validate_json(raw).entries[-self.max_entries:]
        except (CacheFileError, ValidationError, ValueError, RecursionError) as exc:
            reason = str(exc) if isinstance(exc, CacheFileError) else "is not a valid history file"
            self.note = f"history {self.path} ignored: {reason}"[:300]
            return []

    @property
    def entries(self) -> list[HistoryEntry]:
        """Oldest first."""
        with self._lock:
            return list(self._entries)

    def add(self, entry: HistoryEntry) -> None:
        """Append, prune oldest first to the bounds, save (OSError: unwritable cache; kept in memory)."""
        with self._lock:
            self._entries.append(entry)
            del self._entries[:-self.max_entries]
            text = self._text()
            while len(text.encode()) > self.max_bytes and len(self._entries) > 1:
                del self._entries[0]
                text = self._text()
            self._save(text)

    def _text(self) -> str:
        return HistoryFile(entries=self._entries).model_dump_json(by_alias=True)

    def _save(self, text: str) -> None:
        write_cache_file(self.path, text, ".history-")
