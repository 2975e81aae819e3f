"""A model file that shrinks while it is mapped: one line and exit 1, not a silent SIGBUS.

The libraries read safetensors files through a memory mapping (as the plain pipeline does, which the
CPU exactness of staged encoders relies on). When another process cuts such a file short, the next
read of a page past its new end raises SIGBUS. Python cannot turn that into an exception: its own
handler only sets a flag, and the faulting read would repeat forever. So a native handler (a ctypes
callback given to libc's `signal`) writes one line to stderr and ends the process with exit 1, the
code of a failed load. Installed by the command line only (never inside a library user's process).
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

EXIT_FAILED = 1
LINE = ("omni-console: error: a model file shrank while it was read (bus error: is something rewriting "
        "the model directory?)")
_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int)
_kept: list[object] = []  # the callback must outlive the call that installs it


def install_bus_error_line(line: str = LINE) -> bool:
    """Make SIGBUS print `line` and exit 1; False where the platform has no SIGBUS or no libc."""
    if not hasattr(signal, "SIGBUS"):
        return False
    try:
        libc = ctypes.CDLL(None)
        install = libc.signal
    except (OSError, AttributeError):
        return False
    data = (line + "\n").encode("utf-8", "backslashreplace")
    fired: list[int] = []

    def on_bus_error(_signum: int) -> None:
        # The load reads on several threads, so several can fault at once. The GIL is held from the check
        # to the append, so one thread reports; the others wait for its exit (returning would repeat the
        # faulting read, and exiting could cut its line short).
        if fired:
            while True:
                time.sleep(1.0)
        fired.append(1)
        os.write(2, data)
        os._exit(EXIT_FAILED)

    callback = _HANDLER(on_bus_error)
    install.restype = ctypes.c_void_p
    install.argtypes = [ctypes.c_int, _HANDLER]
    install(signal.SIGBUS, callback)
    _kept[:] = [callback]
    return True
