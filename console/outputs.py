"""Where the console saves generated images: a new file every time, never one that exists.

Names carry the local time and the request number, `20250301-142501-request-3.png`; a second
image in the same second with the same number (two consoles in one directory) gets `-2`, `-3`, …
Request numbers restart at 1 in every process, so a name from the number alone would replace an
earlier run's image. Each file is created with `open(path, "xb")` (O_CREAT | O_EXCL), so even two
processes racing for one name never replace each other's file: the loser takes the next suffix.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

MAX_SUFFIX = 1000
"""Collisions tried within one second before giving up (a real directory never gets near)."""
now = time.time
"""The clock of the names (a module attribute so tests can pin it)."""


def output_stem(request_id: int, when: float | None = None) -> str:
    """`YYYYmmdd-HHMMSS-request-N` in local time (sorts chronologically in a listing)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now() if when is None else when))
    return f"{stamp}-request-{request_id}"


def save_image(image: Any, out_dir: Path, request_id: int, when: float | None = None) -> Path:
    """Write `image` (PIL) as PNG under a new name in `out_dir`; returns the absolute path.

    Raises OSError (disk full, no permission) or FileExistsError when every suffix is taken; a
    file this call created and could not finish writing is removed again (it is ours, half-written).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = output_stem(request_id, when)
    for suffix in range(1, MAX_SUFFIX + 1):
        path = out_dir / (f"{stem}.png" if suffix == 1 else f"{stem}-{suffix}.png")
        try:
            handle = open(path, "xb")  # noqa: SIM115 - closed below; exclusive creation is the point
        except FileExistsError:
            continue
        try:
            with handle:
                image.save(handle, format="PNG")
        except BaseException:
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        return path.resolve()
    raise FileExistsError(f"no free name for {stem}.png in {out_dir} after {MAX_SUFFIX} tries")
