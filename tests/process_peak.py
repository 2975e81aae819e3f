"""The process's peak RSS set back to its RSS now, for tests that measure how far one step raises it."""

from __future__ import annotations


def reset_peak() -> bool:
    """This process's VmHWM set back to its RSS now (Linux clear_refs 5); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
