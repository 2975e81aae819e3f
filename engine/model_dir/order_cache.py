"""The DiT block order a real forward ran, cached per model, so a plan made before any load shows it.

Discovery orders a DiT's block lists by its class's `__init__` (engine/model_dir/blocks.py): a guess, since a
forward may run them in another order (Lumina2 runs `context_refiner` before `noise_refiner`, which
`__init__` registers second). The engine records the order of the first real forward
(engine/running/order_watch.py) and keeps it here; discovery then applies it (`observed_order`).

The cache is only a cache, and never trusted beyond that: a file that is unreadable, too large, of
another version, or whose order is not exactly a permutation of the block lists the tensors hold is
ignored (the order read from source applies, and the next forward checks again). Keyed by the model
directory, the DiT component, its class, its block lists and the installed diffusers version (a new
diffusers may run another order). No torch here: `plan` reads it without importing torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from ..cache_dir import cache_root, write_cache_file
from .blocks import BlockList
from .weights import ModelDirError, load_json

ORDER_VERSION = 1
MAX_ORDER_BYTES = 64 * 1024  # a few block-list names; anything larger is not ours


def _diffusers_version() -> str:
    try:
        return metadata.version("diffusers")
    except metadata.PackageNotFoundError:
        return "unknown"


def order_path(model_root: Path, dit: str, class_name: str | None, lists: Sequence[BlockList]) -> Path:
    """Where the observed order of this DiT (as its block lists are now) is kept."""
    shape = sorted((b.attr, b.count, b.total_bytes) for b in lists)
    key = json.dumps([ORDER_VERSION, str(Path(model_root).resolve()), dit, class_name, _diffusers_version(), shape])
    return cache_root() / "block_order" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def observed_order(model_root: Path, dit: str, class_name: str | None, lists: Sequence[BlockList]) -> list[str] | None:
    """The block lists' order a forward of this DiT ran, if cached and valid for these lists, else None."""
    path = order_path(model_root, dit, class_name, lists)
    try:
        if not path.is_file() or path.stat().st_size > MAX_ORDER_BYTES:
            return None
        document = load_json(path)
    except (OSError, ValueError, ModelDirError):
        return None
    if not isinstance(document, dict) or document.get("version") != ORDER_VERSION:
        return None
    order = document.get("order")
    attrs = [b.attr for b in lists]
    if not isinstance(order, list) or len(order) != len(attrs) or sorted(map(str, order)) != sorted(attrs):
        return None
    return [str(a) for a in order] if all(isinstance(a, str) for a in order) else None


def apply_observed(model_root: Path, dit: str, class_name: str | None,
                   lists: Sequence[BlockList]) -> tuple[tuple[BlockList, ...], bool]:
    """(the block lists in the cached observed order, True) when one is cached, else (as given, False)."""
    order = observed_order(model_root, dit, class_name, lists) if len(lists) > 1 else None
    if order is None:
        return tuple(lists), False
    return tuple(sorted(lists, key=lambda b: order.index(b.attr))), True


def save_observed_order(model_root: Path, dit: str, class_name: str | None, lists: Sequence[BlockList],
                        order: Sequence[str]) -> Path:
    """Keep `order` (block-list names, as the forward ran them) for this DiT; written atomically."""
    path = order_path(model_root, dit, class_name, lists)
    document = {"version": ORDER_VERSION, "dit": dit, "class": class_name, "order": list(order)}
    return write_cache_file(path, json.dumps(document), ".order-")
