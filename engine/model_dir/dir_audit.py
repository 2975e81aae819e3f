"""Audit a model directory's files before anything reads them: what is refused, what is ignored.

Refused (one `ModelDirError` line): a symlink leaving the model directory, an entry of a
component folder that is not a regular file or directory (FIFO, device, socket), a config file
that references code (`config_checks`). Ignored with a note that `plan` shows: code files (`.py`)
and pickle files (`.bin`, `.pt`, `.ckpt`, `.pkl`, …) that nothing loaded would read — the engine
never runs the one nor unpickles the other. (A weights folder holding only pickle files is refused
by `weights.find_weights`: there is nothing safe to load.)
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelDirError
from .config_checks import check_config_document, is_config_file
from .safe_paths import check_inside, check_tree
from .weights import PICKLE_SUFFIXES, load_json

CODE_SUFFIXES = (".py", ".pyc")


def note_for(path: Path, root: Path) -> str | None:
    """The note for a file nothing will read, or None for an ordinary file."""
    rel = path.relative_to(root).as_posix()
    if path.name.endswith(PICKLE_SUFFIXES):
        return f"ignored {rel}: pickle files are never read"
    if path.name.endswith(CODE_SUFFIXES):
        return f"ignored {rel}: code in a model directory is never run"
    return None


def audit_root(root: Path, roots: tuple[Path, ...]) -> list[str]:
    """`model_index.json` must be inside the directory; notes for stray code/pickle files at the top."""
    check_inside(root / "model_index.json", roots)
    try:
        entries = sorted(root.iterdir())
    except OSError as exc:
        raise ModelDirError(f"{root}: cannot list ({exc.strerror or exc})") from None
    notes = []
    for path in entries:
        if (not path.is_symlink() or _safe_link(path, roots)) and path.is_file() and (note := note_for(path, root)):
            notes.append(note)
    return notes


def _safe_link(path: Path, roots: tuple[Path, ...]) -> bool:
    try:
        check_inside(path, roots)
    except ModelDirError:
        return False  # an unread top-level link: not ours to open, so not ours to note either
    return True


def audit_component(root: Path, folder: Path, roots: tuple[Path, ...], package: str | None = None) -> list[str]:
    """Check every entry under a component folder and its config files; return notes for ignored files.
    `package`: the diffusers pipeline package that defines the component's class, if one does."""
    files = check_tree(folder, roots)
    notes = []
    for path in files:
        if path.parent == folder and is_config_file(path.name):
            check_config_document(path, load_json(path), roots=roots, package=package)
        if path.parent == folder and (note := note_for(path, root)):
            notes.append(note)
    return notes
