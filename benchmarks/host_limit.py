"""A host of N GB on a large machine: another process page-locks all but N GB of the available RAM.

Issue 35's targets are hosts of 16 and 32 GB; the GPU machines have 128 GB or more. As `ballast.py` does
for the card, a child process holds the rest: it maps anonymous memory in 1 GiB chunks (then smaller
ones) and `mlock`s each, re-reading the available memory before every chunk, until N GB are left.
"Available" is MemAvailable, or less where the process's memory cgroup (v1 or v2) allows less: a
container's limit, not the machine's RAM, is then the host. It never holds more than available - N
(each chunk is sized from a fresh reading), and refuses when the machine has no more than N GB
available to begin with or cannot lock (RLIMIT_MEMLOCK without root).
Locked pages cannot be swapped or reclaimed, so the kernel's page cache and the process under test
share the N GB, as on a real host of that size. The child lowers its own OOM score (when allowed) so
that the kernel, short of memory, kills the process under test, as it would on the real host, and not
the ballast. It prints one READY line and holds until a line (or EOF) arrives on its stdin.

    from benchmarks.host_limit import host_limit
    with host_limit(16e9) as host:     # MemAvailable is now about 16 GB
        subprocess.run([...])
    python3 -m benchmarks.host_limit 16   # by hand: hold until Enter
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

GB = 10**9
MIN_CHUNK = 2**21  # the smallest chunk locked: stop within this much of the target
_ROOT = Path(__file__).resolve().parents[1]  # the child runs as `python -m benchmarks.host_limit`

def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _stat_field(path: Path, name: str) -> int:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except OSError:
        pass
    return 0


def cgroup_available() -> int | None:
    """What this process's memory cgroup still allows (limit - usage + its inactive file pages), or None
    without a limit: a container's limit can be far below the machine's MemAvailable."""
    v2 = Path("/sys/fs/cgroup")
    limit = _read_int(v2 / "memory.max")
    if limit is not None:
        usage, stat, inactive = _read_int(v2 / "memory.current"), v2 / "memory.stat", "inactive_file"
    else:
        v1 = Path("/sys/fs/cgroup/memory")
        limit, usage = _read_int(v1 / "memory.limit_in_bytes"), _read_int(v1 / "memory.usage_in_bytes")
        stat, inactive = v1 / "memory.stat", "total_inactive_file"
    if limit is None or usage is None or limit >= 2**60:
        return None
    return limit - usage + _stat_field(stat, inactive)


def available() -> int:
    """MemAvailable, or less where the memory cgroup allows less."""
    cgroup = cgroup_available()
    return mem_available() if cgroup is None else min(mem_available(), cgroup)


def _hold(host: int, max_hold: int) -> int:
    """The limiter child: lock memory chunk by chunk until `available()` is `host`, say READY, hold."""
    import ctypes
    import mmap
    import os

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mlock.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    try:  # the kernel, short of memory, must kill the process under test, not this one
        Path("/proc/self/oom_score_adj").write_text("-1000")
        oom = "protected"
    except OSError:
        oom = "not-protected"
    before = available()
    if before <= host:
        print(f"REFUSE only {before} bytes available, not more than the {host} the host should have", flush=True)
        return 3
    held, total = [], 0
    for chunk in (2**30, 2**26, MIN_CHUNK):
        while min(available() - host, max_hold - total) >= chunk:
            m = mmap.mmap(-1, chunk, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
            if libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(chunk)) != 0:
                print(f"REFUSE mlock failed after {total} bytes: {os.strerror(ctypes.get_errno())} (root or a "
                      "larger RLIMIT_MEMLOCK is needed)", flush=True)
                return 4
            held.append(m)
            total += chunk
    print(f"READY {before} {available()} {total} {oom}", flush=True)
    sys.stdin.readline()  # "stop", or EOF when the parent is gone
    return 0


@dataclass(frozen=True, slots=True)
class Host:
    """What the limiter left: MemAvailable before and after it locked, the bytes it holds, its pid."""

    host_bytes: int
    available_before: int
    available_after: int
    held: int
    oom: str
    pid: int


def mem_available() -> int:
    """MemAvailable from /proc/meminfo, in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable")


class HostLimitError(RuntimeError):
    """The machine cannot simulate the host asked for (too little available, or no right to lock)."""


@contextlib.contextmanager
def host_limit(host_bytes: float, *, max_hold: int | None = None) -> Iterator[Host]:
    """Page-lock all but `host_bytes` of the available RAM in a child process while the block runs.

    `max_hold` caps the bytes locked (tests). Raises HostLimitError (one line) when the machine has no more
    than `host_bytes` available or the child cannot lock; the memory is released when the block ends."""
    host = int(host_bytes)
    cap = max_hold if max_hold is not None else 2**62
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.host_limit", "--child", str(host), str(cap)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=_ROOT)
    try:
        assert proc.stdout is not None
        words = proc.stdout.readline().split()
        if not words or words[0] != "READY":
            reason = " ".join(words[1:]) if words else f"the limiter exited ({proc.wait()})"
            raise HostLimitError(f"cannot simulate a {host / GB:.2f} GB host: {reason}")
        before, after, held = (int(x) for x in words[1:4])
        yield Host(host, before, after, held, " ".join(words[4:]), proc.pid)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError):
                assert proc.stdin is not None
                proc.stdin.write("stop\n")
                proc.stdin.close()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        sys.exit(_hold(int(sys.argv[2]), int(sys.argv[3])))
    host_gb = float(sys.argv[1]) if len(sys.argv) > 1 else 16.0
    try:
        with host_limit(host_gb * GB) as host:
            print(f"a {host_gb:g} GB host: MemAvailable {host.available_before / GB:.2f} -> "
                  f"{host.available_after / GB:.2f} GB; limiter pid {host.pid} locks {host.held / GB:.2f} GB "
                  f"(OOM: {host.oom}). Enter stops it.", flush=True)
            sys.stdin.readline()
    except HostLimitError as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
