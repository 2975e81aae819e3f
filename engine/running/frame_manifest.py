"""Which numbered frames beside an output this tool wrote: the only files `--overwrite` may delete.

A PNG-sequence output (`NAME-0001.png`, `NAME-0002.png`, …) is recorded in a manifest beside it,
`.NAME.png.omni-frames.json`: each frame's name, size and SHA-256. A later `--overwrite` run of the same
output that writes fewer frames removes the earlier frames it did not rewrite, but only those the
manifest lists and that still hold exactly the recorded bytes. Files named like frames that no manifest
lists (the operator's own `shot-0001.png`) are never deleted, and a single-file output deletes nothing.

The manifest sits in a folder anyone may have written to, so it is untrusted input: at most
MAX_MANIFEST_BYTES, validated by a pydantic model (unknown keys refused), signed with an HMAC whose key
only this user's cache holds (`frames.key`, 0600, created on first use: a manifest this tool did not
write, or one written before the key was lost, deletes nothing), and each listed name must be
exactly a frame name this tool writes for that output (`NAME-<4 to 9 ASCII digits>.SUF`, index from 1),
which rules out separators, `..` and absolute paths. Every file is opened and removed relative to the
output's folder (`dir_fd`), never through a symbolic link: a link, a folder or a file whose bytes
changed is left alone. A manifest that does not validate deletes nothing and is not replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..cache_dir import cache_root
from .atomic_write import write_new, write_replacing

SCHEMA = "omni-console.frames/1"
MAX_MANIFEST_BYTES = 4 << 20
MAX_FRAMES = 100_000
MANIFEST_SUFFIX = ".omni-frames.json"
_HASH_CHUNK = 1 << 20
KEY_NAME = "frames.key"
KEY_BYTES = 32


class FrameRecord(BaseModel):
    """One frame as written: its name in the output's folder, its size and its SHA-256 (hex)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(max_length=255)
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class FrameManifest(BaseModel):
    """The frames written for `output` (a file name in the same folder)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    schema_: Literal["omni-console.frames/1"] = Field(alias="schema")
    output: str = Field(max_length=255)
    frames: list[FrameRecord] = Field(max_length=MAX_FRAMES)
    mac: str = Field(default="", pattern=r"^([0-9a-f]{64})?$")

    def signed_body(self) -> bytes:
        return self.model_dump_json(by_alias=True, exclude={"mac"}).encode()


def _key(create: bool) -> bytes | None:
    """This user's manifest key (cache root, regular file of ours, 0600), made on first write; None if unusable."""
    path = cache_root() / KEY_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        if not create:
            return None
        key = secrets.token_bytes(KEY_BYTES)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                write_new(path, lambda stream: stream.write(key), mode=0o600)
        except OSError:
            return None
        return _key(create=False)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as stream:
        info = os.fstat(stream.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            return None
        key = stream.read(KEY_BYTES + 1)
    return key if len(key) == KEY_BYTES else None


def sign(manifest: FrameManifest, key: bytes) -> str:
    """The manifest's HMAC-SHA256 under `key` (hex)."""
    return hmac.new(key, manifest.signed_body(), hashlib.sha256).hexdigest()


def manifest_path(output: Path) -> Path:
    """Where the manifest of `output`'s frames lives (a hidden file beside it)."""
    return output.with_name(f".{output.name}{MANIFEST_SUFFIX}")


def frame_name_pattern(output: Path) -> re.Pattern[str]:
    """Names of the frames this tool writes for `output`: NAME-<4..9 ASCII digits>.SUF."""
    return re.compile(re.escape(output.stem) + r"-([0-9]{4,9})" + re.escape(output.suffix))


def is_frame_name(output: Path, name: str) -> bool:
    """True if `name` is exactly a frame name this tool would write for `output` (index 1 or more)."""
    match = frame_name_pattern(output).fullmatch(name)
    return match is not None and int(match.group(1)) >= 1


@contextlib.contextmanager
def _folder(output: Path) -> Iterator[int]:
    fd = os.open(output.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


def _open_regular(name: str, folder: int) -> BinaryIO | None:
    """`name` in `folder` opened for reading if it is a regular file (never through a link, never blocking)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except OSError:
        return None
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        regular = False
    if not regular:
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def _regular_digest(name: str, folder: int) -> tuple[int, str] | None:
    """(size, sha256) of the regular file `name` in `folder`, never through a link; None otherwise."""
    stream = _open_regular(name, folder)
    if stream is None:
        return None
    with stream:
        digest, size = hashlib.sha256(), 0
        while chunk := stream.read(_HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _read_manifest(output: Path, folder: int) -> FrameManifest | None:
    """The manifest beside `output` if it is a regular file that validates (signature not checked)."""
    stream = _open_regular(manifest_path(output).name, folder)
    if stream is None:
        return None
    with stream:
        raw = stream.read(MAX_MANIFEST_BYTES + 1)
    if len(raw) > MAX_MANIFEST_BYTES:
        return None
    try:
        manifest = FrameManifest.model_validate_json(raw)
    except (ValueError, RecursionError, ValidationError):
        return None
    if manifest.output != output.name or not all(is_frame_name(output, f.name) for f in manifest.frames):
        return None
    return manifest


def _signed_by_us(manifest: FrameManifest) -> bool:
    key = _key(create=False)
    return key is not None and hmac.compare_digest(manifest.mac, sign(manifest, key))


def _unchanged(record: FrameRecord, folder: int) -> os.stat_result | None:
    """The file's identity if it is still the regular file holding exactly the recorded bytes, else None."""
    try:
        before = os.lstat(record.name, dir_fd=folder)
    except OSError:
        return None
    if _regular_digest(record.name, folder) != (record.size, record.sha256):
        return None
    return before


def _remove_if_same(name: str, folder: int, identity: os.stat_result) -> bool:
    """Unlink `name` only if it is still the very file that was checked (same device, inode, size, mtime)."""
    try:
        now = os.lstat(name, dir_fd=folder)
    except OSError:
        return False
    same = (now.st_dev, now.st_ino, now.st_size, now.st_mtime_ns) == \
        (identity.st_dev, identity.st_ino, identity.st_size, identity.st_mtime_ns)
    if not same or not stat.S_ISREG(now.st_mode):
        return False
    try:
        os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        return False
    return True


def record_frames(output: Path, written: Sequence[Path], *, overwrite: bool) -> list[Path]:
    """After a sequence of `written` frames for `output`: with overwrite, remove the frames an earlier run
    of this tool recorded and this run did not rewrite (unchanged since); then record this run's frames
    (and, without overwrite, the earlier recorded frames still there). Returns what was removed.

    Nothing is removed or recorded for a single-file output, or where the manifest's name holds something
    that is not a valid manifest (a later --overwrite then removes nothing)."""
    if len(written) <= 1 or any(p.parent != output.parent or not is_frame_name(output, p.name) for p in written):
        return []
    removed: list[Path] = []
    with _folder(output) as folder:
        place = manifest_path(output).name
        exists = _lexists(place, folder)
        old = _read_manifest(output, folder)
        if exists and old is None:
            return []  # not ours, or damaged: leave it, record nothing
        names = {p.name for p in written}
        kept: list[FrameRecord] = []
        trusted = old.frames if old is not None and _signed_by_us(old) else []  # unsigned: replaced, not obeyed
        for record in trusted:
            identity = None if record.name in names else _unchanged(record, folder)
            if identity is None:
                continue
            if not overwrite:
                kept.append(record)
            elif _remove_if_same(record.name, folder, identity):
                removed.append(output.with_name(record.name))
        records = [*kept]
        for path in written:
            digest = _regular_digest(path.name, folder)
            if digest is not None:
                records.append(FrameRecord(name=path.name, size=digest[0], sha256=digest[1]))
    key = _key(create=True)
    if key is None:
        return removed
    manifest = FrameManifest.model_validate({"schema": SCHEMA, "output": output.name, "frames": records})
    manifest.mac = sign(manifest, key)
    body = manifest.model_dump_json(by_alias=True, indent=1).encode()
    with contextlib.suppress(FileExistsError):  # one that appeared meanwhile is not ours: left alone
        (write_replacing if exists else write_new)(manifest_path(output), lambda stream: stream.write(body))
    return removed


def _lexists(name: str, folder: int) -> bool:
    try:
        os.lstat(name, dir_fd=folder)
    except FileNotFoundError:
        return False
    return True
