"""Find a component's weight files and read their safetensors headers — never tensor data.

Rules for a component folder:
- A sharded checkpoint is named by its `*.safetensors.index.json` (its `weight_map` lists shards).
- A variant (`--variant fp16`) selects `NAME.fp16.safetensors` / `NAME.safetensors.index.fp16.json`
  files; a weights folder without that variant is refused (one line naming the variants it has), never
  quietly read at another dtype. Without a variant, plain files are preferred and a variant-only folder
  uses its variant. Folders without weights (tokenizers, schedulers) are unaffected.
- Pickle formats (`.bin`, `.pt`, `.pth`, `.ckpt`, `.pkl`) are never opened: a weights folder holding
  only those is refused with a clear error.
- Every file named here is a regular file inside the folder (a shard name with `..`, a FIFO, a
  device or a directory is refused), and every parse error is one `ModelDirError` line.
"""

from __future__ import annotations

import json
import re
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from safetensors import SafetensorError, safe_open

from ..errors import ModelDirError
from ..plain_text import plain
from .safe_paths import check_relative_file, kind_of, open_regular, require_regular

__all__ = ["DTYPES", "PICKLE_SUFFIXES", "ModelDirError", "TensorInfo", "WeightSet", "find_weights", "load_json",
           "read_header", "read_weight_set"]

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MAX_JSON_BYTES = 64 * 2**20  # far above any real config or shard index; bounds what a hostile file costs
# tensors in one component (real ones: a few thousand at most); bounds discovery's time and memory
MAX_TENSORS = 65_536

# safetensors dtype tags → (torch-style name, bytes per element)
DTYPES: dict[str, tuple[str, float]] = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1), "F8_E8M0": ("float8_e8m0fnu", 1),
    "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1),
    "U64": ("uint64", 8), "U32": ("uint32", 4), "U16": ("uint16", 2), "U8": ("uint8", 1),
    "BOOL": ("bool", 1), "F4": ("float4_e2m1fn_x2", 0.5), "C64": ("complex64", 8),
}


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor as its header describes it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return int(self.numel * DTYPES[_tag_of(self.dtype)][1])


_NAME_TO_TAG = {name: tag for tag, (name, _) in DTYPES.items()}


def _tag_of(dtype_name: str) -> str:
    return _NAME_TO_TAG[dtype_name]


def header_length(path: Path) -> int | None:
    """The header length a safetensors file claims in its 8-byte prefix (None: the file is shorter than that),
    read with `open_regular`'s checks (ModelDirError, OSError): a bound to check before `read_header` parses it."""
    with open_regular(path) as handle:
        head = handle.read(8)
    return struct.unpack("<Q", head)[0] if len(head) == 8 else None


def read_header(path: Path) -> list[TensorInfo]:
    """Tensor names, dtypes and shapes of one safetensors file, validated against the file's size."""
    require_regular(path, "weight file")  # never hand a FIFO or device to the reader
    try:
        with safe_open(str(path), framework="numpy") as handle:  # headers only: "pt" would import torch
            infos = []
            names = handle.keys()
            _check_tensor_count(path, len(names))
            for name in names:
                tensor_slice = handle.get_slice(name)
                tag = tensor_slice.get_dtype()
                if tag not in DTYPES:
                    raise ModelDirError(f"{path}: tensor {name!r} has unsupported dtype {tag}")
                infos.append(TensorInfo(name, DTYPES[tag][0], tuple(tensor_slice.get_shape()), path))
            return infos
    except SafetensorError as exc:
        raise ModelDirError(f"{path}: corrupt safetensors header ({_short(exc)})") from None
    except PermissionError:
        raise ModelDirError(f"{path}: cannot read (permission denied)") from None
    except OSError as exc:
        raise ModelDirError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _check_tensor_count(where: Path, count: int) -> None:
    if count > MAX_TENSORS:
        raise ModelDirError(f"{where}: {count} tensors, more than the {MAX_TENSORS} omni-console reads for one "
                            "component (no real checkpoint has that many)")


def _short(exc: Exception) -> str:
    """The reader's message on one line: it may quote a tensor name from the file (controls escaped)."""
    return plain(str(exc).replace("Error while deserializing header: ", "").strip())


def load_json(path: Path) -> dict:
    """Read a JSON object file with an error that names the file and the position.

    Hostile documents (nested too deep, huge numbers, not UTF-8, not an object, a FIFO, too large)
    are one `ModelDirError` line each.
    """
    with open_regular(path) as handle:
        try:
            raw = handle.read(MAX_JSON_BYTES + 1)
        except OSError as exc:
            raise ModelDirError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(raw) > MAX_JSON_BYTES:
        raise ModelDirError(f"{path}: larger than {MAX_JSON_BYTES // 2**20} MiB (not a config file)")
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ModelDirError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ModelDirError(f"{path}: malformed JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise ModelDirError(f"{path}: malformed JSON (nested too deeply)") from None
    except ValueError as exc:  # e.g. an integer beyond Python's digit limit
        raise ModelDirError(f"{path}: malformed JSON ({str(exc).splitlines()[0][:80]})") from None
    if not isinstance(value, dict):
        raise ModelDirError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


@dataclass(frozen=True, slots=True)
class WeightSet:
    """The weight files chosen for one component folder."""

    files: tuple[Path, ...]
    index: Path | None
    variant: str | None
    listed: frozenset[str] = frozenset()  # tensor names the index's weight_map lists (read once)


def _variant_of(name: str) -> str | None:
    """`x.fp16.safetensors` → fp16; `x.safetensors.index.fp16.json` → fp16; plain → None."""
    if name.endswith(".safetensors.index.json"):
        return None
    if ".safetensors.index." in name and name.endswith(".json"):
        return name.split(".safetensors.index.", 1)[1][: -len(".json")] or None
    stem = name[: -len(".safetensors")]
    # sharded names (model-00001-of-00002.safetensors) carry no variant unless dotted
    parts = stem.split(".")
    return (parts[-1] or None) if len(parts) > 1 else None


def _list_folder(folder: Path) -> list[str]:
    try:
        return sorted(entry.name for entry in folder.iterdir())
    except PermissionError:
        raise ModelDirError(f"{folder}: cannot list (permission denied)") from None
    except OSError as exc:
        raise ModelDirError(f"{folder}: cannot list ({exc.strerror or exc})") from None


def _require_regular_names(folder: Path, names: list[str]) -> None:
    """A weight-looking entry that is a directory, FIFO or device is refused (never skipped, never opened)."""
    for name in names:
        try:
            mode = (folder / name).stat().st_mode
        except OSError:
            continue  # a broken link: reported when (if) the file is read
        if not stat.S_ISREG(mode):
            raise ModelDirError(f"{folder / name}: is {kind_of(mode)}, not a regular file "
                                "(only regular files are read)")


def _shard_names(index_path: Path) -> tuple[set[str], frozenset[str]]:
    """The shard file names an index lists, each a checked `.safetensors` name inside the folder.

    A library's sharded loader picks its reader by the shard's suffix (`torch.load` for anything that
    is not `.safetensors`), so a name with another suffix is refused here, whatever the file holds."""
    weight_map = load_json(index_path).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelDirError(f"{index_path}: missing or empty 'weight_map'")
    shards = set()
    for tensor, shard in weight_map.items():
        where = f"{index_path}: weight_map[{_clip(tensor)!r}]"
        name = check_relative_file(shard, where)
        if not name.endswith(".safetensors"):
            raise ModelDirError(f"{where} names {_clip(name)!r}, not a .safetensors file (a library would "
                                "unpickle it; only safetensors are read)")
        shards.add(name)
    return shards, frozenset(weight_map)


def _clip(text: str, limit: int = 80) -> str:
    """A name from the directory as an error shows it: at most `limit` characters (names can be 1 MB)."""
    return text if len(text) <= limit else text[:limit] + "…"


def _shards(index_path: Path, folder: Path) -> tuple[list[str], frozenset[str]]:
    """The shard file names of a sharded index (each a checked `.safetensors` file inside the folder)
    and the tensor names it lists."""
    shards, listed = _shard_names(index_path)
    for shard in sorted(shards):
        path = folder / shard
        if not path.exists():
            raise ModelDirError(f"{index_path}: shard {shard} is missing")
        require_regular(path, "shard")
    return sorted(shards), listed


def find_weights(folder: Path, variant: str | None = None, *, pickle_only_is_error: bool = True) -> WeightSet | None:
    """Choose the safetensors files of a component folder; None when it has no weights at all.

    `pickle_only_is_error=False` is for components that hold no weights (tokenizers, schedulers):
    a stray pickle beside them is ignored rather than refused — it is never read either way.
    """
    names = _list_folder(folder)
    indexes = [n for n in names if ".safetensors.index" in n and n.endswith(".json")]
    singles = [n for n in names if n.endswith(".safetensors")]
    pickles = [n for n in names if n.endswith(PICKLE_SUFFIXES)]
    _require_regular_names(folder, indexes + singles)
    if not indexes and not singles:
        if pickles and pickle_only_is_error:
            raise ModelDirError(
                f"{folder}: weights only in pickle format ({', '.join(pickles)}); omni-console loads "
                "safetensors only and never unpickles checkpoints — convert them to .safetensors"
            )
        return None
    variants_present = sorted({v for v in map(_variant_of, indexes + singles) if v})
    has_plain = any(_variant_of(n) is None for n in indexes + singles)
    if variant is not None and variant not in variants_present:
        # never fall back to other files quietly: the operator asked for this dtype/size
        named = sorted({re.sub(r"-\d+-of-\d+$", "", v) for v in variants_present})  # a variant's shards
        present = ", ".join((["plain"] if has_plain else []) + named)
        raise ModelDirError(f"--variant {variant}: {folder.name} has no {variant} files (it has: {present}) "
                            f"in {folder}")
    chosen = variant
    if variant is None and not has_plain:
        chosen = variants_present[0]  # variant-only folder
    for other in indexes:  # an index we do not read names only safetensors too: a library might read it
        if _variant_of(other) != chosen:
            _shard_names(folder / other)
    index = next((n for n in indexes if _variant_of(n) == chosen), None)
    if index is not None:
        index_path = folder / index
        shards, listed = _shards(index_path, folder)
        return WeightSet(tuple(folder / s for s in shards), index_path, chosen, listed)
    files = [n for n in singles if _variant_of(n) == chosen and "-of-" not in n]
    if not files:
        return None
    return WeightSet(tuple(folder / f for f in files), None, chosen)


def read_weight_set(weights: WeightSet) -> list[TensorInfo]:
    """All tensors of a component; the index's weight_map must agree with the shards' headers."""
    tensors: list[TensorInfo] = []
    for file in weights.files:
        tensors.extend(read_header(file))
        _check_tensor_count(weights.index or file, len(tensors))
    if weights.index is not None:
        found = {t.name for t in tensors}
        missing = sorted(weights.listed - found)
        if missing:
            raise ModelDirError(
                f"{weights.index}: {len(missing)} tensors listed but absent from shards, e.g. {missing[0]}")
    return tensors
