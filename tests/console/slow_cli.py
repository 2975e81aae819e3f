"""`python slow_cli.py PHASE_FILE [--stuck-load] -- CLI ARGS...`: the real CLI on a slowed engine.

Each phase the engine reaches is appended to PHASE_FILE (one name a line), so the test that
started this process knows when to send SIGINT.
"""

from __future__ import annotations

import sys
from pathlib import Path

import slow_engine

from omni_console.console.cli import main

if __name__ == "__main__":
    phase_file = Path(sys.argv[1])
    split = sys.argv.index("--")
    stuck = "--stuck-load" in sys.argv[2:split]

    def on_phase(name: str) -> None:
        with phase_file.open("a") as f:
            f.write(name + "\n")

    slow_engine.install(setattr, on_phase, stuck_load=stuck)
    sys.exit(main(sys.argv[split + 1:]))
