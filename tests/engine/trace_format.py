"""The trace-event format (Chrome's "Trace Event Format" document: the JSON object form), as a pydantic model,
written from the published description, and the nesting rule its viewers hold complete events to.

- The object form: `traceEvents` (a list of events), optional `displayTimeUnit` ("ms" or "ns"), `otherData`.
- Every event: `name`, `ph` (its phase), `pid`, `tid`, `ts` (microseconds), optional `cat` and `args`.
- "X" complete events add `dur` (microseconds, not negative); "i"/"I" instant events an optional scope `s`
  ("g" global, "p" process, "t" thread; default t); "C" counter events carry numbers in `args`;
  "M" metadata events name a process or thread (`process_name`, `thread_name`: args.name) or order them
  (`process_sort_index`, `thread_sort_index`: args.sort_index).
- Complete events on one thread must nest: a slice that starts inside another ends inside it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, field_validator, model_validator

Number = StrictInt | StrictFloat


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str
    pid: StrictInt
    tid: StrictInt
    ts: Number = Field(ge=0)
    cat: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)


class Complete(_Base):
    ph: Literal["X"]
    dur: Number = Field(ge=0)
    tdur: Number | None = None


class Instant(_Base):
    ph: Literal["i", "I"]
    s: Literal["g", "p", "t"] = "t"


class Counter(_Base):
    ph: Literal["C"]

    @field_validator("args")
    @classmethod
    def numbers(cls, args: dict[str, Any]) -> dict[str, Any]:
        assert args and all(isinstance(v, int | float) and not isinstance(v, bool) for v in args.values()), args
        return args


class Metadata(_Base):
    ph: Literal["M"]
    name: Literal["process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"]

    @model_validator(mode="after")
    def has_value(self) -> Metadata:
        key = "sort_index" if self.name.endswith("sort_index") else ("labels" if self.name == "process_labels"
                                                                     else "name")
        assert key in self.args, (self.name, self.args)
        return self


TraceEvent = Annotated[Complete | Instant | Counter | Metadata, Field(discriminator="ph")]


class TraceFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    traceEvents: list[TraceEvent]  # noqa: N815 - the format's own key
    displayTimeUnit: Literal["ms", "ns"] = "ms"  # noqa: N815
    otherData: dict[str, Any] = Field(default_factory=dict)  # noqa: N815


def check_nesting(trace: TraceFile) -> None:
    """Complete events on each (pid, tid) nest: none starts inside another and ends past it."""
    tracks: dict[tuple[int, int], list[Complete]] = {}
    for e in trace.traceEvents:
        if isinstance(e, Complete):
            tracks.setdefault((e.pid, e.tid), []).append(e)
    for track, spans in tracks.items():
        open_ends: list[float] = []
        for e in sorted(spans, key=lambda e: (e.ts, -e.dur)):
            while open_ends and e.ts >= open_ends[-1] - 1e-3:
                open_ends.pop()
            end = e.ts + e.dur
            assert not open_ends or end <= open_ends[-1] + 1e-3, f"{track}: {e.name} ends past its parent"
            open_ends.append(end)
