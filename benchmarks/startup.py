"""How long the two everyday commands take, from a fresh process: `plan` and quitting an idle console.

1. `plan --model M`: wall time of the whole process (interpreter start to exit), --runs runs, median.
   Target: under 1 s on a 2-core machine.
2. `q` on an idle console: the real `omni-console --model M` on a pseudo-terminal; once the first
   screen is drawn and the app has sat idle for --idle-s, `q` is written to the terminal and the
   time to process exit is measured. The terminal must be back (alternate screen left) every time.
   Target: under 300 ms.

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
from omni_console.console.app import OmniConsoleApp
from omni_console.console.cli import main

ready, model = Path(sys.argv[1]), sys.argv[2]
real_mount = OmniConsoleApp.on_mount

def on_mount(self):
    real_mount(self)
    self.call_after_refresh(lambda: ready.write_text(str(os.getpid())))

OmniConsoleApp.on_mount = on_mount
sys.exit(main(["--model", model]))
"""


def time_plan(model: Path, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "omni_console.console.cli", "plan", "--model", str(model)],
                              capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"plan failed ({done.returncode}): {done.stderr.strip()}")
    return times


def time_quit(model: Path, idle_s: float) -> float:
    """Seconds from `q` written to the terminal to the console's process having exited."""
    import fcntl
    import struct
    import termios

    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready"
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 140, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "140", "LINES": "40"}
        proc = subprocess.Popen([sys.executable, "-c", IDLE_APP, str(ready), str(model)], stdin=slave, stdout=slave,
                                stderr=slave, env=env, cwd=tmp, start_new_session=True)
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

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + 120
            while not ready.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the console did not start: {bytes(output)[-800:]!r}")
                time.sleep(0.02)
            time.sleep(idle_s)
            start = time.perf_counter()
            os.write(master, b"q")
            code = proc.wait(timeout=60)
            elapsed = time.perf_counter() - start
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
        return elapsed


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], out=None)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--idle-s", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            model = Path(tmp) / "demo"
            subprocess.run([sys.executable, "-m", "omni_console.console.cli", "demo-model", str(model)], check=True,
                           capture_output=True)
        plan = time_plan(model, args.runs)
        quit_ = [time_quit(model, args.idle_s) for _ in range(args.runs)]
    result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "load_avg_1m": os.getloadavg()[0]},
              "plan_s": {"median": statistics.median(plan), "runs": plan},
              "quit_idle_s": {"median": statistics.median(quit_), "runs": quit_}}
    print(f"plan --model: median {result['plan_s']['median'] * 1000:.0f} ms "
          f"(runs {', '.join(f'{t * 1000:.0f}' for t in plan)} ms; target < 1000 ms)")
    print(f"q on an idle console: median {result['quit_idle_s']['median'] * 1000:.0f} ms "
          f"(runs {', '.join(f'{t * 1000:.0f}' for t in quit_)} ms; target < 300 ms)")
    print(f"load average (1 min) at the end: {result['machine']['load_avg_1m']:.1f} on {os.cpu_count()} cores")
    harness.write(result, args, device="cpu")


if __name__ == "__main__":
    main()
