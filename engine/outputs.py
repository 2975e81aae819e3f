"""Check where an image will be written before anything loads, and write it without a race.

A bad `--output` found after a long load and generation wastes the whole run, so everything that
can be known up front is checked first: the path is not a directory, its nearest existing
ancestor is a directory we can actually create files in (checked by creating and removing a
temporary file there: `os.access` answers "yes" to root on a read-only mount or directory), a
Pillow writer exists for the suffix and can write an RGB image, and an existing file is replaced
only when the operator said so. Writing uses exclusive creation, or (with overwrite) a temporary
file in the same directory moved over the old one with `os.replace`, so a half-written image never
stands at the output path and a file that appears meanwhile is never clobbered unasked.
"""

from __future__ import annotations

import functools
import io
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..offload.errors import ConfigError

SUGGESTED_SUFFIXES = (".png", ".jpg", ".webp", ".tiff", ".bmp")
PROBE_PREFIX = ".omni-console-probe-"


@dataclass(frozen=True, slots=True)
class OutputTarget:
    """A checked output path and the Pillow format its suffix selects."""

    path: Path
    image_format: str
    overwrite: bool


@functools.cache
def _writer_for(suffix: str) -> str | None:
    """Pillow's format for `suffix` if it has a save handler that writes RGB images."""
    from PIL import Image

    Image.init()
    image_format = Image.registered_extensions().get(suffix)
    if image_format is None or image_format not in Image.SAVE:
        return None
    try:  # some registered writers are stubs without a handler, or refuse RGB (XBM, MSP, Palm)
        Image.new("RGB", (2, 2)).save(io.BytesIO(), format=image_format)
    except Exception:  # noqa: BLE001 - any failure means: no usable writer
        return None
    return image_format


def _nearest_existing(path: Path) -> Path:
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def _probe_writable(directory: Path) -> str | None:
    """None if a file can be created in `directory`, else the reason (the OS's words)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=directory)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(fd)
    os.unlink(probe)
    return None


def check_output(path: Path, *, overwrite: bool = False, flag: str = "--output") -> OutputTarget:
    """Refuse, with one line, an output the run could not write; reads the file system only."""
    shown = f"{flag} {str(path)!r}"
    if path.is_dir():
        raise ConfigError(f"{shown} is a directory (name an image file, e.g. {path / 'out.png'})")
    parent = path.parent
    anchor = _nearest_existing(parent)
    if not anchor.is_dir():
        raise ConfigError(f"{shown}: {anchor} is not a directory")
    reason = _probe_writable(anchor)
    if reason is not None:
        raise ConfigError(f"{shown}: cannot create files in {anchor} ({reason})")
    suffix = path.suffix.lower()
    image_format = _writer_for(suffix) if suffix else None
    if image_format is None:
        what = f"no image writer for {suffix!r}" if suffix else "no file suffix to choose an image format"
        raise ConfigError(f"{shown}: {what} (use {', '.join(SUGGESTED_SUFFIXES)}, …)")
    if os.path.lexists(path) and not overwrite:
        raise ConfigError(f"{shown} exists; pass --overwrite to replace it")
    return OutputTarget(path, image_format, overwrite)


def write_image(image: Any, target: OutputTarget) -> None:
    """Write a PIL image to a checked target: exclusive create, or replace only with overwrite."""
    path = target.path
    path.parent.mkdir(parents=True, exist_ok=True)
    if target.overwrite and os.path.lexists(path):
        _replace(image, target)
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        if target.overwrite:
            _replace(image, target)
            return
        raise ConfigError(f"--output {str(path)!r} appeared while generating; not replaced "
                          "(pass --overwrite to replace it)") from None
    try:
        with os.fdopen(fd, "wb") as stream:
            image.save(stream, format=target.image_format)
    except BaseException:
        path.unlink(missing_ok=True)  # our own partial file: created above, exclusively
        raise


def _replace(image: Any, target: OutputTarget) -> None:
    """Write next to the old file, keep its permission bits, then move over it in one step."""
    path = target.path
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = None
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as stream:
            image.save(stream, format=target.image_format)
            if mode is not None:
                os.fchmod(stream.fileno(), mode)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
