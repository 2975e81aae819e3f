"""`run`'s use case in the engine (`service.run_once`): the demo model on the CPU, opened, checked, loaded, run,
written and reported with no console at all; bad input refused before a weight loads; a face's stop at a
cancel point leaves no output and the engine closed; a failed load is one line with the engine closed."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from PIL import Image

from omni_console.engine.engine import Engine
from omni_console.engine.errors import ConfigError
from omni_console.engine.running.runner import GenerateRequest
from omni_console.engine.service.run_once import NoSignals, RunFace, RunSpec, run_once
from omni_console.offload.policy import OffloadPolicy


def spec_for(model: Path, out: Path, **request: object) -> RunSpec:
    fields = {"prompt": "a red square", "steps": 2, "height": 64, "width": 64, "seed": 5, **request}
    return RunSpec(model=model, policy=OffloadPolicy(), output=out, device="cpu",
                   request=lambda engine: GenerateRequest(**fields))  # type: ignore[arg-type]


@pytest.fixture
def closed_engines(monkeypatch: pytest.MonkeyPatch) -> list[Engine]:
    """Every engine closed during the test, as it was after `close` (memory released: nothing placed)."""
    closed: list[Engine] = []
    real_close = Engine.close

    def close(self: Engine) -> None:
        real_close(self)
        closed.append(self)

    monkeypatch.setattr(Engine, "close", close)
    return closed


def test_run_once_writes_the_image_and_reports_it(demo_model_dir: Path, tmp_path: Path, closed_engines):
    out = tmp_path / "o.png"
    events, notes = [], []
    face = RunFace(event=events.append, note=notes.append, final_lines=lambda snapshot: ["last sample"])
    done = run_once(spec_for(demo_model_dir, out), NoSignals(), face)
    assert done.failure is None
    report = done.document()
    assert report["files"] == [str(out)] and Image.open(out).size == (64, 64)
    assert [s["step"] for s in report["steps"]] == [1, 2]
    assert report["telemetry"]["final"] == ["last sample"]
    assert report["model"] == str(demo_model_dir) and report["device"] == "cpu"
    assert any(type(e).__name__ == "StepTiming" for e in events)  # the face saw the progress as it came
    assert closed_engines and all(e.pipe is None and e.placement is None for e in closed_engines)


def test_bad_input_is_refused_before_anything_loads(demo_model_dir: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(Engine, "load", lambda *a, **k: pytest.fail("loaded before the request was checked"))
    with pytest.raises(ConfigError, match="--height 63"):
        run_once(spec_for(demo_model_dir, tmp_path / "o.png", height=63), NoSignals())
    assert not (tmp_path / "o.png").exists()


class Stop(BaseException):
    """A face's own stop (the console's is `Interrupted`)."""


class StopAfter(NoSignals):
    """Cancel points that stop the run at the `n`-th `check` (a signal arriving between two phases)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.checks = n, 0
        self.ran: list[str] = []

    def check(self) -> None:
        self.checks += 1
        if self.checks >= self.n:
            self.cancel.set()
            raise Stop

    def run(self, fn, *args):
        self.ran.append(getattr(fn, "__name__", "open"))
        return fn(*args)


@pytest.mark.parametrize("n", [1, 2])
def test_a_stop_at_a_cancel_point_leaves_no_output_and_the_engine_closed(n, demo_model_dir, tmp_path,
                                                                         closed_engines):
    """The first check comes before the load, the second after the run, before the write."""
    out = tmp_path / "o.png"
    points = StopAfter(n)
    with pytest.raises(Stop):
        run_once(spec_for(demo_model_dir, out), points)
    assert not out.exists() and not list(tmp_path.iterdir())
    assert ("load" in points.ran) == (n > 1)
    assert closed_engines and all(e.pipe is None and e.placement is None for e in closed_engines)
    assert not [t.name for t in threading.enumerate() if t.name in ("omni-progress", "omni-telemetry")]


def test_a_failed_load_is_one_line_and_the_engine_closed(demo_model_dir, tmp_path, monkeypatch, closed_engines):
    def refuse(self, *args, **kwargs):
        raise OSError("disk went away\nmore detail")

    monkeypatch.setattr(Engine, "load", refuse)
    done = run_once(spec_for(demo_model_dir, tmp_path / "o.png"), NoSignals())
    assert done.failure == "load failed: OSError: disk went away" and done.report is None
    assert closed_engines and not (tmp_path / "o.png").exists()


def test_the_collector_is_off_until_loaded_then_on_over_a_frozen_model_and_everything_collectable_after(
        demo_model_dir: Path, tmp_path: Path):
    """A full collection inside a step holds the GIL for a pass over every object (0.3-0.4 s with the libraries
    imported), stalling the streamer and the compute: what the load built is frozen while the request runs, and
    handed back to the collector when the run ends (a process that goes on, as this one, collects it)."""
    import gc
    import weakref

    frozen_at_steps: list[int] = []
    pipes: list[weakref.ref] = []
    real_load = Engine.load

    def load(self: Engine, *args, **kwargs):
        assert not gc.isenabled()  # no full passes while the libraries import and the model loads
        out = real_load(self, *args, **kwargs)
        pipes.append(weakref.ref(self.pipe))
        return out

    collecting_at_steps: list[bool] = []

    def event(e: object) -> None:
        if type(e).__name__ == "StepTiming":
            frozen_at_steps.append(gc.get_freeze_count())
            collecting_at_steps.append(gc.isenabled())

    with pytest.MonkeyPatch.context() as m:
        m.setattr(Engine, "load", load)
        done = run_once(spec_for(demo_model_dir, tmp_path / "o.png"), NoSignals(), RunFace(event=event))
    assert done.failure is None
    assert len(frozen_at_steps) == 2 and min(frozen_at_steps) > 1000  # the pipeline's and the imports' objects
    assert collecting_at_steps == [True, True]  # on for what the request makes: a cycle may hold a device tensor
    assert gc.get_freeze_count() == 0 and gc.isenabled()  # as the caller had it
    gc.collect()
    assert pipes and pipes[0]() is None  # the released pipeline did not stay frozen
