"""Ctrl+C during a headless run: exactly `omni-console: interrupted`, exit 130, memory released — every time.

SIGINT is delivered for real (to this process, or to a CLI subprocess) at several moments of each
phase of a slowed-down engine: discovery, component loading, denoising.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import slow_engine

from omni_console.console.cli import main
from omni_console.engine.engine import Engine

LINE = "omni-console: interrupted (SIGINT); nothing written\n"
PHASES = ("discovery", "load", "generate")
HERE = Path(__file__).parent
WORKER_THREADS = ("omni-headless-work", "omni-progress", "omni-telemetry")


def interrupted_only(err: str) -> bool:
    """Progress lines (stderr, --json too) up to the interrupt, then the one line; no failure after it."""
    return (err.endswith(LINE) and err.count("interrupted") == 1 and "Traceback" not in err
            and "failed" not in err and "ErrorEvent" not in err)


def run_args(model: Path, out: Path) -> list[str]:
    return ["run", "--model", str(model), "--output", str(out), "--json", "--steps", "4", "--telemetry-hz", "20"]


@pytest.mark.slow
@pytest.mark.parametrize("phase,delay", [pytest.param(p, d, marks=[pytest.mark.slow] if d else [])
                                         for p in PHASES for d in (0.0, 0.04, 0.1, 0.22)])
def test_sigint_in_process_is_one_line_and_130(phase, delay, demo_model_dir, tmp_path, capsys, monkeypatch):
    reached = {p: threading.Event() for p in PHASES}
    slow_engine.install(monkeypatch.setattr, lambda p: reached[p].set())
    engines: list[Engine] = []
    real_close = Engine.close

    def close(self: Engine) -> None:
        engines.append(self)
        real_close(self)

    monkeypatch.setattr(Engine, "close", close)

    def deliver() -> None:
        assert reached[phase].wait(60), f"never reached {phase}"
        time.sleep(delay)
        os.kill(os.getpid(), signal.SIGINT)

    out = tmp_path / "o.png"
    previous = signal.signal(signal.SIGINT, lambda *_: None)  # a stray late signal must not stop pytest
    try:
        sender = threading.Thread(target=deliver)
        sender.start()
        code = main(run_args(demo_model_dir, out))
        sender.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    captured = capsys.readouterr()
    assert (code, captured.out) == (130, "") and interrupted_only(captured.err)
    assert not out.exists()
    for engine in engines:  # memory released: nothing placed, no pipeline held
        assert engine.pipe is None and engine.placement is None
    if phase != "discovery":
        assert engines, "the loaded engine was never closed"
    assert not [t.name for t in threading.enumerate() if t.name in WORKER_THREADS and t.is_alive()]


def _spawn(model: Path, workdir: Path, stuck_load: bool = False) -> tuple[subprocess.Popen, Path, Path]:
    workdir.mkdir()
    phases, out = workdir / "phases", workdir / "o.png"
    phases.touch()
    cmd = [sys.executable, str(HERE / "slow_cli.py"), str(phases), *(["--stuck-load"] if stuck_load else []),
           "--", *run_args(model, out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=workdir)
    return proc, phases, out


def _wait_for(phases: Path, phase: str, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while phase not in phases.read_text().split():
        assert proc.poll() is None, f"exited before {phase}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"never reached {phase}"
        time.sleep(0.01)


def _interrupt_once(model: Path, workdir: Path, phase: str, delay: float) -> tuple[int, str, str, bool]:
    proc, phases, out = _spawn(model, workdir)
    try:
        _wait_for(phases, phase, proc)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc.returncode, stdout, stderr, out.exists()


@pytest.mark.slow
def test_sigint_to_the_cli_process_in_every_phase(demo_model_dir, tmp_path):
    cases = [(p, d) for p in PHASES for d in (0.0, 0.1, 0.25)]
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        results = list(pool.map(lambda c: _interrupt_once(demo_model_dir, tmp_path / f"{c[0]}-{c[1]}", *c), cases))
    for case, (code, stdout, stderr, wrote) in zip(cases, results, strict=True):
        assert (code, stdout, wrote) == (130, "", False) and interrupted_only(stderr), (case, stderr)


@pytest.mark.slow
def test_second_sigint_exits_at_once(demo_model_dir, tmp_path):
    proc, phases, out = _spawn(demo_model_dir, tmp_path / "stuck", stuck_load=True)  # a load that ignores cancel
    try:
        _wait_for(phases, "load", proc)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert proc.poll() is None  # the first Ctrl+C waits for a safe point, which this load never reaches
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert time.monotonic() - start < 10
    assert (proc.returncode, stdout, out.exists()) == (130, "", False) and interrupted_only(stderr)


@pytest.mark.slow
def test_sigint_with_progress_lines_ends_with_the_one_line(demo_model_dir, tmp_path, capsys, monkeypatch):
    reached = threading.Event()
    slow_engine.install(monkeypatch.setattr, lambda p: reached.set() if p == "generate" else None)
    previous = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        timer = threading.Thread(target=lambda: reached.wait(60) and os.kill(os.getpid(), signal.SIGINT))
        timer.start()
        code = main([a for a in run_args(demo_model_dir, tmp_path / "o.png") if a != "--json"])
        timer.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err
    assert code == 130 and err.count("interrupted") == 1 and err.endswith(LINE)
    assert "state discovered → loading" in err  # progress was printed up to the interrupt (a 1 s load) ...
    assert "failed" not in err and "ErrorEvent" not in err and "Traceback" not in err  # ... and nothing after
