"""How long the everyday commands take, from a fresh process: `plan`, the console's first frames, quitting.

1. `plan --model M`: wall time of the whole process (interpreter start to exit), --runs runs, median.
   Target: under 1 s on a 2-core machine. Also its CPU time (user + sys), which a loaded machine
   does not inflate.
2. the real `omni-console --model M` on a pseudo-terminal: seconds from the process's start to the
   first frame on the terminal (the alternate screen entered and the title written; target < 0.5 s)
   and to the app's first drawn screen (Textual, with the plan).
3. `q` on that idle console: once the app has sat idle for --idle-s, `q` is written to the terminal
   and the time to process exit is measured. The terminal must be back (alternate screen left) every
   time. Target: under 300 ms.
4. `q` under load (--busy-runs): the console loads the model and starts a long request (--busy-steps
   steps); once the request has run --idle-s, `q` is written and both the time until the terminal is
   restored (alternate screen left) and the time until the process is gone are measured. Target: the
   terminal back at once (< 300 ms), the process gone within 2 s.

Usage: python -m benchmarks.startup [--model PATH] [--runs 5] [--idle-s 1.0] [--out startup.json]
Without --model the demo model is written to a temporary folder first.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import harness

ALT_SCREEN_ON, ALT_SCREEN_OFF = b"\x1b[?1049h", b"\x1b[?1049l"

# The console as the CLI runs it, writing a ready file once its first screen has been drawn.
IDLE_APP = r"""
import os, sys
from pathlib import Path
from omni_console.console import app_main
from omni_console.console.cli import main

ready, model = Path(sys.argv[1]), sys.argv[2]
real_build = app_main.build_app

def build_app(*args, **kwargs):  # wrapped after the app module is imported: the start-up order stays the CLI's
    app = real_build(*args, **kwargs)
    real_mount = type(app).on_mount

    def on_mount(self):
        real_mount(self)
        self.call_after_refresh(lambda: ready.write_text(str(os.getpid())))

    type(app).on_mount = on_mount
    return app

app_main.build_app = build_app
sys.exit(main(["--model", model]))
"""

# The same console, which loads the model and starts a long request once its first screen is drawn;
# the ready file is written once the request has been running for a moment.
BUSY_APP = r"""
import os, sys, threading, time
from pathlib import Path
from omni_console.console import app_main
from omni_console.console.cli import main
from omni_console.console.headless import default_request

ready, model, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
real_build = app_main.build_app

def build_app(*args, **kwargs):
    app = real_build(*args, **kwargs)
    real_mount = type(app).on_mount

    def watch():
        while app.engine.state.value != "running":
            time.sleep(0.005)
        ready.write_text(str(os.getpid()))

    def start():
        if app.phase == "plan":
            app.action_load()
        if app.phase == "live" and not app.generating:
            app.start_generate(default_request(app.engine, prompt="a lighthouse", steps=steps, seed=0))
            threading.Thread(target=watch, daemon=True).start()
            return
        app.set_timer(0.05, start)

    def on_mount(self):
        real_mount(self)
        self.call_after_refresh(start)

    type(app).on_mount = on_mount
    return app

app_main.build_app = build_app
sys.exit(main(["--model", model]))
"""


def time_plan(model: Path, runs: int) -> tuple[list[float], list[float]]:
    """Wall seconds and CPU seconds (user + sys of the child) of each run."""
    times, cpu = [], []
    for _ in range(runs):
        before = os.times()
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "omni_console.console.cli", "plan", "--model", str(model)],
                              capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        after = os.times()
        cpu.append(after.children_user - before.children_user + after.children_system - before.children_system)
        if done.returncode != 0:
            raise SystemExit(f"plan failed ({done.returncode}): {done.stderr.strip()}")
    return times, cpu


def time_console(model: Path, idle_s: float, busy_steps: int | None = None) -> dict[str, float]:
    """Seconds from the process's start to the first frame and to the app's first screen, and from `q`
    written to the terminal to the terminal restored and to the console's process having exited.
    With `busy_steps` the console first loads the model and runs a request of that many steps."""
    import fcntl
    import struct
    import termios

    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready"
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 140, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "140", "LINES": "40"}
        spawned = time.perf_counter()
        script = [IDLE_APP] if busy_steps is None else [BUSY_APP]
        extra = [] if busy_steps is None else [str(busy_steps)]
        proc = subprocess.Popen([sys.executable, "-c", *script, str(ready), str(model), *extra], stdin=slave,
                                stdout=slave, stderr=slave, env=env, cwd=tmp, start_new_session=True)
        output = bytearray()

        def read() -> None:
            while True:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    return
                if not data:
                    return
                output.extend(data)

        first_frame: list[float] = []

        def read_first() -> None:
            while not first_frame:
                if ALT_SCREEN_ON in output and b"omni-console" in output[output.find(ALT_SCREEN_ON):]:
                    first_frame.append(time.perf_counter() - spawned)
                    return
                time.sleep(0.002)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        threading.Thread(target=read_first, daemon=True).start()
        try:
            deadline = time.monotonic() + 120
            while not ready.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the console did not start: {bytes(output)[-800:]!r}")
                time.sleep(0.005)
            app_frame = time.perf_counter() - spawned
            time.sleep(idle_s)
            restored: list[float] = []
            offset = len(output)

            def watch_restore() -> None:
                while proc.poll() is None and not restored:
                    if ALT_SCREEN_OFF in output[offset:]:
                        restored.append(time.perf_counter())
                    time.sleep(0.001)

            watcher = threading.Thread(target=watch_restore, daemon=True)
            start = time.perf_counter()
            watcher.start()
            os.write(master, b"q")
            code = proc.wait(timeout=60)
            elapsed = time.perf_counter() - start
            watcher.join(1)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            os.close(slave)
            reader.join(5)
            os.close(master)
        out = bytes(output)
        if code != 0 or out.rfind(ALT_SCREEN_OFF) < out.rfind(ALT_SCREEN_ON):
            raise SystemExit(f"q: exit status {code}, terminal restored: {out.rfind(ALT_SCREEN_OFF) > 0}")
        return {"first_frame_s": first_frame[0] if first_frame else app_frame, "app_frame_s": app_frame,
                "quit_s": elapsed, "restored_s": (restored[0] - start) if restored else elapsed}


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], out=None)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--idle-s", type=float, default=1.0)
    parser.add_argument("--busy-runs", type=int, default=0, help="also time q while a request runs, this many times")
    parser.add_argument("--busy-steps", type=int, default=10000, help="steps of that request")
    parser.add_argument("--skip-idle", action="store_true", help="only the q-under-load runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            model = Path(tmp) / "demo"
            subprocess.run([sys.executable, "-m", "omni_console.console.cli", "demo-model", str(model)], check=True,
                           capture_output=True)
        load_before = os.getloadavg()[0]
        busy = [time_console(model, args.idle_s, args.busy_steps) for _ in range(args.busy_runs)]
        if busy:
            restored = ", ".join(f"{b['restored_s'] * 1000:.0f}" for b in busy)
            gone = ", ".join(f"{b['quit_s'] * 1000:.0f}" for b in busy)
            print(f"q under load: terminal restored after {restored} ms; process gone after {gone} ms "
                  "(targets < 300 ms, < 2000 ms)")
        if args.skip_idle:
            harness.write({"q_busy": busy, "busy_steps": args.busy_steps}, args, device="cpu")
            return
        plan, plan_cpu = time_plan(model, args.runs)
        console = [time_console(model, args.idle_s) for _ in range(args.runs)]
    first = [c["first_frame_s"] for c in console]
    app_frame = [c["app_frame_s"] for c in console]
    quit_ = [c["quit_s"] for c in console]
    result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "load_avg_1m_before": load_before, "load_avg_1m": os.getloadavg()[0]},
              "plan_s": {"median": statistics.median(plan), "runs": plan},
              "plan_cpu_s": {"median": statistics.median(plan_cpu), "runs": plan_cpu},
              "first_frame_s": {"median": statistics.median(first), "runs": first},
              "app_frame_s": {"median": statistics.median(app_frame), "runs": app_frame},
              "quit_idle_s": {"median": statistics.median(quit_), "runs": quit_}, "q_busy": busy}

    def line(label: str, key: str, target: str) -> None:
        runs = ", ".join(f"{t * 1000:.0f}" for t in result[key]["runs"])
        print(f"{label}: median {result[key]['median'] * 1000:.0f} ms (runs {runs} ms{target})")

    line("plan --model (wall)", "plan_s", "; target < 1000 ms")
    line("plan --model (CPU, user + sys)", "plan_cpu_s", "")
    line("console: first frame on the terminal", "first_frame_s", "; target < 500 ms")
    line("console: the app's first screen", "app_frame_s", "")
    line("q on an idle console", "quit_idle_s", "; target < 300 ms")
    print(f"load average (1 min) at the end: {result['machine']['load_avg_1m']:.1f} on {os.cpu_count()} cores")
    harness.write(result, args, device="cpu")


if __name__ == "__main__":
    main()
