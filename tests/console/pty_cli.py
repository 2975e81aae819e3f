"""The real CLI on a pseudo-terminal of 80x24, as a shell runs it (the pty is its controlling terminal)."""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path


def controlling_terminal() -> None:
    """In the child, after setsid: the pty is its terminal, so Ctrl+C there is SIGINT as in a shell."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Pty:
    """`omni-console ARGS` on a pseudo-terminal (stderr there too); everything it writes is kept in `out`."""

    def __init__(self, *args: str, cwd: Path | None = None) -> None:
        self.master, self.slave = os.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "80", "LINES": "24"}
        self.started = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "omni_console.console.cli", *args], stdin=self.slave,
                                     stdout=self.slave, stderr=self.slave, env=env, start_new_session=True,
                                     preexec_fn=controlling_terminal, cwd=cwd)
        self.out = bytearray()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.out.extend(data)

    def wait_for(self, text: bytes, limit_s: float = 120, count: int = 1) -> float:
        """Seconds from start until `text` has been written `count` times."""
        deadline = time.monotonic() + limit_s
        while self.out.count(text) < count:
            assert self.proc.poll() is None or self.out.count(text) >= count, bytes(self.out)[-600:]
            assert time.monotonic() < deadline, bytes(self.out)[-600:]
            time.sleep(0.005)
        return time.perf_counter() - self.started

    def finish(self, timeout_s: float = 120) -> tuple[int, bytes, bool]:
        """(exit status, everything written, whether the terminal echoes typed keys again)."""
        try:
            code = self.proc.wait(timeout=timeout_s)
        finally:
            self.proc.kill()
        echo = bool(termios.tcgetattr(self.slave)[3] & termios.ECHO)
        os.close(self.slave)
        self.reader.join(5)
        os.close(self.master)
        return code, bytes(self.out), echo
