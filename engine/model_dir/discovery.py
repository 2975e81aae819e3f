"""Read a diffusers-layout model directory without loading any weights.

`discover_model(path)` reads `model_index.json`, each component's `config.json` and its
safetensors headers, and returns what the plan and the console show: every component with its
role, library, class, dtypes, parameter count and bytes, and for each denoiser (a DiT or a UNet) its
block lists in execution order with bytes per block and the non-block remainder.

The directory is untrusted: every name, class and path in it is checked before anything reads it
(`safe_paths`, `trusted_classes`, `config_checks`, `dir_audit`); files nothing will read (code,
pickles) are listed in `ModelInfo.notes`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .blocks import (
    BlockList,
    check_config_block_counts,
    find_block_lists,
    order_block_lists,
    registration_order,
    unet_block_lists,
)
from .config_checks import check_config_document, is_config_file
from .dir_audit import audit_component, audit_root
from .encoder_layers import find_layer_list
from .order_cache import apply_observed
from .pipeline_values import is_component_entry, pipeline_values
from .quant_layouts import check_quantization
from .roles import DENOISER_ROLES, Role, classify
from .safe_paths import allowed_roots, check_inside, check_segment
from .size_bounds import check_added_tokens, check_sizes
from .trusted_classes import check_component, check_pipeline
from .unused import mark_unused
from .weights import ModelDirError, find_weights, load_json, read_weight_set

CONFIG_NAMES = ("config.json", "scheduler_config.json", "tokenizer_config.json", "preprocessor_config.json")
# Far above any real pipeline (Flux: 7 components, 57 blocks; the largest video DiTs: under 100 blocks),
# and low enough that the planner answers within a second (docs/security.md, "Bounded work")
MAX_COMPONENTS = 256
MAX_DIT_BLOCKS = 4096


@dataclass(frozen=True, slots=True)
class ComponentInfo:
    """One pipeline component as discovered from its folder."""

    name: str
    role: Role
    library: str | None
    class_name: str | None
    folder: Path
    files: tuple[Path, ...] = ()
    variant: str | None = None
    dtype_bytes: dict[str, int] = field(default_factory=dict)
    num_params: int = 0
    nbytes: int = 0
    block_lists: tuple[BlockList, ...] = ()
    notes: tuple[str, ...] = ()
    order_observed: bool = False  # block_lists in the order a real forward ran (engine/model_dir/order_cache.py)
    quant_method: str | None = None  # config.json's quantization_config method (engine/model_dir/quant_layouts.py)
    layers: BlockList | None = None  # an encoder's layer list, streamable layer by layer (model_dir/encoder_layers.py)
    unused: str | None = None  # why the pipeline never calls it (model_dir/unused.py): built empty, never placed

    @property
    def dtypes(self) -> list[str]:
        """Dtypes by bytes held, largest first."""
        return [d for d, _ in sorted(self.dtype_bytes.items(), key=lambda kv: -kv[1])]

    @property
    def block_bytes(self) -> int:
        return sum(b.total_bytes for b in self.block_lists)

    @property
    def non_block_bytes(self) -> int:
        return self.nbytes - self.block_bytes

    @property
    def num_blocks(self) -> int:
        return sum(b.count for b in self.block_lists)

    @property
    def has_weights(self) -> bool:
        return bool(self.files)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """A discovered model directory."""

    path: Path
    pipeline_class: str
    components: tuple[ComponentInfo, ...]
    notes: tuple[str, ...] = ()  # files ignored on purpose (code, pickles), one line each
    # model_index.json's values that are not components (`boundary_ratio`, ...), checked plain JSON
    pipeline_values: dict[str, object] = field(default_factory=dict, hash=False)

    def by_role(self, role: Role) -> list[ComponentInfo]:
        return [c for c in self.components if c.role == role]

    @property
    def dits(self) -> list[ComponentInfo]:
        return self.by_role("dit")

    @property
    def denoisers(self) -> list[ComponentInfo]:
        """The components DLO streams block by block: DiTs and UNets (`roles.DENOISER_ROLES`)."""
        return [c for c in self.components if c.role in DENOISER_ROLES]

    @property
    def auxiliary_names(self) -> list[str]:
        """Names the policy map may key: encoders and VAEs."""
        return [c.name for c in self.components if c.role in ("encoder", "vae")]

    @property
    def block_kind(self) -> str:
        """What the streamed blocks are called where they are shown: "UNet" when every denoiser with
        blocks is a UNet, else "DiT"."""
        streamed = [c for c in self.denoisers if c.block_lists]
        return "UNet" if streamed and all(c.role == "unet" for c in streamed) else "DiT"

    @property
    def num_dit_blocks(self) -> int:
        """Blocks DLO streams (every denoiser's, a UNet's included): the bound of `resident_layers`."""
        return sum(c.num_blocks for c in self.denoisers)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.components)

    def component(self, name: str) -> ComponentInfo:
        for c in self.components:
            if c.name == name:
                return c
        raise KeyError(name)


def _component_entries(index: dict, index_path: Path) -> list[tuple[str, str, str]]:
    """The `[library, class]` pairs; `[null, null]` (left out) and pipeline values are not components."""
    entries = []
    for name, value in index.items():
        if name.startswith("_") or not is_component_entry(value) or value == [None, None]:
            continue
        if len(value) != 2:
            raise ModelDirError(f"{index_path}: component {name!r} must be [library, class], got {value!r:.80}")
        library, class_name = value
        check_segment(name, str(index_path))
        if not isinstance(library, str) or not isinstance(class_name, str):
            raise ModelDirError(f"{index_path}: component {name!r} must be [library, class] strings, "
                                f"got {value!r:.80}")
        entries.append((name, library, class_name))
    return entries


def _check_left_out_firsts(index: dict, index_path: Path, pipeline: str) -> None:
    """Refuse `NAME: [null, null]` beside a given `NAME_2` (Wan 2.2's `transformer` left out, `transformer_2`
    kept): the pipeline runs NAME first (Wan: every step at or above the boundary, all of them without one),
    so diffusers loads it and then fails at the first step; here it is one line before load."""
    for name in ("transformer", "unet", "prior"):  # denoisers only: SDXL's refiner leaves out text_encoder, rightly
        value, second = index.get(name), index.get(f"{name}_2")
        if value == [None, None] and is_component_entry(second) and second != [None, None]:
            raise ModelDirError(f"{index_path}: {name!r} is left out ([null, null]) but {name + '_2'!r} is given: "
                                f"{pipeline} runs {name!r} first (Wan 2.2: the high-noise steps), so it cannot run "
                                "without it (refused before load)")


def _read_config(folder: Path) -> dict:
    for config_name in CONFIG_NAMES:
        if (folder / config_name).is_file():
            return load_json(folder / config_name)
    return {}


def discover_component(root: Path, name: str, library: str | None, class_name: str | None,
                       variant: str | None = None) -> ComponentInfo:
    """Discover one component folder (headers only)."""
    folder = root / check_segment(name, str(root / "model_index.json"))
    ref = check_component(library, class_name, f"{root / 'model_index.json'}: {name!r}")  # imports nothing
    if ref.library == "transformers":  # also a pipeline package's re-export of a transformers class
        library = "transformers"
    roots = allowed_roots(root)
    check_inside(folder, roots)
    if not folder.is_dir():
        raise ModelDirError(f"{folder}: component folder for {name!r} ({class_name}) is missing")
    package = ref.library if ref.library not in ("diffusers", "transformers") else None  # diffusers.pipelines.X
    notes = audit_component(root, folder, roots, package)  # links, special files, code references in configs
    config = _read_config(folder)  # also validates that configs are well-formed JSON
    weights = find_weights(folder, variant, pickle_only_is_error=ref.kind == "weights")
    role = classify(name, library, class_name, weights is not None)
    tensors = read_weight_set(weights) if weights is not None else None
    if role == "dit" and tensors is not None:  # the sharper line for a block count the tensors contradict
        check_config_block_counts(folder, library, class_name, config, tensors)
    _check_config_sizes(folder, tensors)  # before any class sees a number (engine/model_dir/size_bounds.py)
    if weights is None or tensors is None:
        return ComponentInfo(name, role, library, class_name, folder, notes=tuple(notes))
    quantized = check_quantization(folder, library, config, tensors)  # what the libraries cannot load exactly
    dtype_bytes: Counter[str] = Counter()
    for tensor in tensors:
        dtype_bytes[tensor.dtype] += tensor.nbytes
    block_lists: tuple[BlockList, ...] = ()
    order_observed = False
    if role == "dit":
        lists = find_block_lists(tensors)
        _check_block_count(folder, sum(len(b.block_bytes) for b in lists))
        order = registration_order(library, class_name) if len(lists) > 1 else None
        block_lists, order_observed = apply_observed(root, name, class_name, order_block_lists(lists, order))
    elif role == "unet":
        block_lists = tuple(unet_block_lists(folder, class_name, config, tensors))
    layers = find_layer_list(tensors) if role == "encoder" else None
    notes += unstreamed_denoiser_notes(name, role, library, class_name, block_lists)
    return ComponentInfo(
        name=name, role=role, library=library, class_name=class_name, folder=folder,
        files=weights.files, variant=weights.variant, dtype_bytes=dict(dtype_bytes),
        num_params=sum(t.numel for t in tensors), nbytes=sum(t.nbytes for t in tensors),
        block_lists=block_lists, notes=tuple(notes), order_observed=order_observed, quant_method=quantized,
        layers=layers,
    )


def _check_config_sizes(folder: Path, tensors: list | None) -> None:
    configs = {path: load_json(path) for path in sorted(folder.iterdir())
               if path.is_file() and not path.is_symlink() and is_config_file(path.name)}
    for path, document in configs.items():
        check_sizes(path, document, tensors)
    check_added_tokens(folder, configs)


DENOISER_NAMES = ("unet", "prior", "transformer", "transformer_2")
"""Component names diffusers' pipelines give their denoiser."""


def unstreamed_denoiser_notes(name: str, role: str, library: str | None, class_name: str | None,
                              block_lists: tuple[BlockList, ...]) -> list[str]:
    """One line when a pipeline's denoiser gets no streaming, so the plan never shows it resident silently:
    a DiT/UNet without a repeated block list in its weights, or a denoiser of a class no role rule names a
    denoiser (Kandinsky 3's `Kandinsky3UNet`)."""
    if role in ("dit", "unet") and not block_lists:
        return [f"{name} ({class_name}): no block list of two or more repeated blocks in its weights, so nothing "
                "of it is streamed: it stays on the device whole"]
    if role == "other" and library == "diffusers" and (name in DENOISER_NAMES or "UNet" in (class_name or "")):
        return [f"{name} ({class_name}): the pipeline's denoiser, of a class DLO does not stream: it stays on the "
                "device whole"]
    return []


def _check_block_count(where: Path, count: int, kind: str = "DiT") -> None:
    """At most MAX_DIT_BLOCKS streamed blocks; `kind` ("DiT" or "UNet") names them as the plan does."""
    if count > MAX_DIT_BLOCKS:
        raise ModelDirError(f"{where}: {count} {kind} blocks, more than the {MAX_DIT_BLOCKS} omni-console plans for "
                            f"(no real {kind} has that many)")


def discover_model(path: str | Path, variant: str | None = None) -> ModelInfo:
    """Discover a diffusers-layout model directory; raises ModelDirError with one clear line."""
    root = Path(path).expanduser()
    if not root.exists():
        raise ModelDirError(f"{root}: no such model directory")
    if not root.is_dir():
        raise ModelDirError(f"{root}: is a file, expected a diffusers model directory")
    index_path = root / "model_index.json"
    if not index_path.exists() and not index_path.is_symlink():
        raise ModelDirError(f"{root}: no model_index.json (not a diffusers-layout model directory)")
    root_notes = audit_root(root, allowed_roots(root))
    index = load_json(index_path)
    check_config_document(index_path, index, top_class_name=False)
    pipeline = index.get("_class_name")
    if pipeline is None or pipeline == "":
        raise ModelDirError(f"{index_path}: missing '_class_name' (the pipeline class)")
    if not isinstance(pipeline, str):
        raise ModelDirError(f"{index_path}: '_class_name' must name a diffusers pipeline, got {pipeline!r:.60} "
                            "(custom pipelines are never run)")
    check_pipeline(pipeline, str(index_path))
    values = pipeline_values(index, str(index_path))  # before any component folder is read
    entries = _component_entries(index, index_path)
    _check_left_out_firsts(index, index_path, pipeline)
    if len(entries) > MAX_COMPONENTS:
        raise ModelDirError(f"{index_path}: {len(entries)} components, more than the {MAX_COMPONENTS} "
                            "omni-console plans for (no real pipeline has that many)")
    components = mark_unused([discover_component(root, name, library, class_name, variant)
                              for name, library, class_name in entries])
    denoisers = [c for c in components if c.role in DENOISER_ROLES]
    kind = "UNet" if any(c.num_blocks for c in denoisers) and all(  # as ModelInfo.block_kind names them
        c.role == "unet" for c in denoisers if c.num_blocks) else "DiT"
    _check_block_count(root, sum(c.num_blocks for c in denoisers), kind)
    notes = tuple(root_notes) + tuple(n for c in components for n in c.notes)
    return ModelInfo(root, pipeline, components, notes, values)
