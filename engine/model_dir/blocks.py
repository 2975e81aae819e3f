"""DiT block lists from tensor names, ordered as the model executes them, checked against the config.

A block list is a top-level attribute whose tensors are named `ATTR.<i>.<rest>` with indices
0..n-1, n >= 2, where every entry repeats the structure of entry 0: at least half of the smaller
entry's `<rest>` names (with shapes) appear in both — the repeated transformer block (Flux
`transformer_blocks` and `single_transformer_blocks`, Wan `blocks`). Variants of one block type
stay in the list (SD3's last block is `context_pre_only` and has fewer tensors).
Nested lists (`context_embedder.token_refiner.refiner_blocks.0`) belong to non-block modules.

Execution order: the order the model class's `__init__` assigns those attributes (which is the
order its forward runs them in every diffusers DiT). It is read from the installed diffusers
package's *source text* (`ast`), never by importing or building the class: building it from a
config made discovery cost whatever the config's numbers asked for (`num_layers: 1000000` meant a
million modules), while reading source costs the same for every config. When the source cannot
be found, a fallback order of known names applies, then alphabetical.

Config agreement: the same source says which config key sizes each `nn.ModuleList([... for _ in
range(KEY)])`. A config whose KEY is not a whole number >= 0, or differs from the number of
`ATTR.<i>.` entries the tensors hold (numbered 0..n-1), is refused with one line (`ModelDirError`)
before anything loads. A key the config leaves out, or a count the source computes any other way,
is not checked (no false refusals). The check costs one pass over the tensor names, whatever the
config's numbers.

UNets (`unet_block_lists`): a `UNet2DConditionModel` (SD1.5, SD2, SDXL) runs `down_blocks`, then
`mid_block`, then `up_blocks`, each block once per forward (its `__init__` assigns `up_blocks` before
`mid_block`, so registration order would be wrong). Whole blocks are too coarse a unit (SDXL's
`up_blocks.0` alone is 2.4 GB, and the ring's slots are the largest unit's size), so each block is a
block list of its own (`down_blocks.1`, `mid_block`) whose units are its children, in the order that
block class's forward calls them (`UNIT_ORDERS`: resnet, attention, resnet, ..., then the down/up
sampler). A block of a class not in that table, or whose tensors are not exactly those children,
stays one unit: an order is never guessed. The skip connections between blocks are activations:
nothing here or in the streamer moves them.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .fp8_names import fp8_block_bytes, fp8_block_elements, header_stored_fp8
from .init_layout import PACKAGE, init_layout
from .weights import ModelDirError, TensorInfo

# An index is a canonical decimal (no leading zeros) short enough to be a real list position.
_INDEXED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\.(0|[1-9][0-9]{0,8})\.(.+)$")
FALLBACK_ORDER = (
    "double_blocks", "transformer_blocks", "joint_blocks", "blocks", "layers",
    "single_transformer_blocks", "single_blocks",
)


@dataclass(frozen=True, slots=True)
class BlockList:
    """One list of streamed blocks: a DiT's repeated blocks, or a UNet block's children (`items`)."""

    attr: str
    block_bytes: tuple[int, ...]
    items: tuple[str, ...] = ()
    """Paths of the units under `attr`, in execution order (`resnets.0`); empty: `attr`'s entries by index."""
    # each block's bytes with its weights stored in fp8 (engine/loading/stream_dtype.py), without / with the
    # modulation opt-in; empty: not computed (the checkpoint's bytes apply)
    fp8_bytes: tuple[int, ...] = ()
    fp8_mod_bytes: tuple[int, ...] = ()
    fp8_elems: tuple[int, ...] = ()  # each block's elements stored in fp8 (upcast per forward), without /
    fp8_mod_elems: tuple[int, ...] = ()  # with the modulation opt-in; empty: not computed

    def stored_bytes(self, fp8: bool, modulation: bool = False) -> tuple[int, ...]:
        """Each block's bytes in the arena: as the checkpoint stores them, or with fp8 storage."""
        chosen = (self.fp8_mod_bytes if modulation else self.fp8_bytes) if fp8 else ()
        return chosen or self.block_bytes

    def upcast_elements(self, modulation: bool = False) -> tuple[int, ...]:
        """Each block's elements stored in fp8 with fp8 storage (0 each when not computed)."""
        return (self.fp8_mod_elems if modulation else self.fp8_elems) or (0,) * self.count

    @property
    def count(self) -> int:
        return len(self.block_bytes)

    @property
    def total_bytes(self) -> int:
        return sum(self.block_bytes)

    @property
    def largest_bytes(self) -> int:
        return max(self.block_bytes)


def find_block_lists(tensors: Iterable[TensorInfo]) -> list[BlockList]:
    """Block lists in tensor-name (alphabetical) order; see `order_block_lists` for execution order."""
    members: dict[str, dict[int, dict[str, TensorInfo]]] = defaultdict(lambda: defaultdict(dict))
    for tensor in tensors:
        match = _INDEXED.match(tensor.name)
        if match:
            attr, index, rest = match.groups()
            members[attr][int(index)][rest] = tensor
    lists = []
    for attr, entries in sorted(members.items()):
        n = len(entries)
        if n < 2 or sorted(entries) != list(range(n)):
            continue
        if not all(_repeats(entries[0], entries[i]) for i in range(1, n)):
            continue  # not a repeated structure: a list of heterogeneous modules
        lists.append(BlockList(attr, tuple(sum(t.nbytes for t in entries[i].values()) for i in range(n)),
                               fp8_bytes=tuple(fp8_block_bytes(attr, i, entries[i]) for i in range(n)),
                               fp8_mod_bytes=tuple(fp8_block_bytes(attr, i, entries[i], True) for i in range(n)),
                               fp8_elems=tuple(fp8_block_elements(attr, i, entries[i]) for i in range(n)),
                               fp8_mod_elems=tuple(fp8_block_elements(attr, i, entries[i], True) for i in range(n))))
    return lists


def _repeats(first: dict[str, TensorInfo], other: dict[str, TensorInfo]) -> bool:
    a = {(r, t.shape) for r, t in first.items()}
    b = {(r, t.shape) for r, t in other.items()}
    return len(a & b) * 2 >= min(len(a), len(b))


def registration_order(library: str | None, class_name: str | None) -> list[str] | None:
    """Attributes the model class's `__init__` assigns, in order, or None if its source is not found."""
    if library != PACKAGE or not class_name:
        return None
    layout = init_layout(class_name)
    return list(layout.order) if layout and layout.order else None


def order_block_lists(lists: list[BlockList], order: list[str] | None) -> list[BlockList]:
    """Sort block lists into execution order (registration order, else FALLBACK_ORDER)."""
    def key(block_list: BlockList) -> tuple[int, int, str]:
        if order and block_list.attr in order:
            return (0, order.index(block_list.attr), block_list.attr)
        if block_list.attr in FALLBACK_ORDER:
            return (1, FALLBACK_ORDER.index(block_list.attr), block_list.attr)
        return (2, 0, block_list.attr)

    return sorted(lists, key=key)


# --- UNets -----------------------------------------------------------------------------------------

UNET_ORDER = ("down_blocks", "mid_block", "up_blocks")
UNET_STREAMED_CLASSES = frozenset({"UNet2DConditionModel", "DreamLiteUNetModel", "UNetSpatioTemporalConditionModel",
                                   "UNetMotionModel"})
"""UNet classes whose forward is known to run each of `UNET_ORDER`'s blocks once, in that order
(`UNet2DConditionModel`'s, which DreamLite's subclass keeps; Stable Video Diffusion's spatio-temporal UNet;
AnimateDiff's motion UNet)."""

UNIT_ORDERS = {
    # class: (its children lists, the sampler last where it has one; what its forward calls, a kind of
    # PER_LAYER or MID_INNER below)
    "CrossAttnDownBlock2D": (("resnets", "attentions", "downsamplers"), "pairs"),
    "DownBlock2D": (("resnets", "downsamplers"), "resnets"),
    "UNetMidBlock2DCrossAttn": (("resnets", "attentions"), "mid"),
    "CrossAttnUpBlock2D": (("resnets", "attentions", "upsamplers"), "pairs"),
    "UpBlock2D": (("resnets", "upsamplers"), "resnets"),
    # Stable Video Diffusion's (unets/unet_3d_blocks.py): the same call orders
    "CrossAttnDownBlockSpatioTemporal": (("resnets", "attentions", "downsamplers"), "pairs"),
    "DownBlockSpatioTemporal": (("resnets", "downsamplers"), "resnets"),
    "UNetMidBlockSpatioTemporal": (("resnets", "attentions"), "mid"),
    "CrossAttnUpBlockSpatioTemporal": (("resnets", "attentions", "upsamplers"), "pairs"),
    "UpBlockSpatioTemporal": (("resnets", "upsamplers"), "resnets"),
    # AnimateDiff's UNetMotionModel (unets/unet_motion_model.py): a motion module after each layer
    "CrossAttnDownBlockMotion": (("resnets", "attentions", "motion_modules", "downsamplers"), "triples"),
    "DownBlockMotion": (("resnets", "motion_modules", "downsamplers"), "motion"),
    "UNetMidBlockCrossAttnMotion": (("resnets", "attentions", "motion_modules"), "motion_mid"),
    "CrossAttnUpBlockMotion": (("resnets", "attentions", "motion_modules", "upsamplers"), "triples"),
    "UpBlockMotion": (("resnets", "motion_modules", "upsamplers"), "motion"),
}
"""UNet block classes (diffusers' unets/unet_2d_blocks.py, unet_3d_blocks.py, unet_motion_model.py) whose
forward's call order of children is known."""
PER_LAYER = {"resnets": ("resnets",), "pairs": ("resnets", "attentions"), "motion": ("resnets", "motion_modules"),
             "triples": ("resnets", "attentions", "motion_modules")}
"""Down and up blocks: the children each layer calls, in order (then the block's sampler)."""
MID_INNER = {"mid": ("attentions",), "motion_mid": ("attentions", "motion_modules")}
"""Mid blocks: what each layer calls between one resnet and the next."""
_CHILD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\.(0|[1-9][0-9]{0,8})\.")


def mid_block_type(class_name: str | None, config: dict) -> object:
    """The mid block's class: the config's `mid_block_type`, else what the UNet class builds."""
    if class_name == "UNetSpatioTemporalConditionModel":
        return "UNetMidBlockSpatioTemporal"
    if class_name == "UNetMotionModel":  # its config has no mid_block_type: a flag picks the motion one
        return "UNetMidBlockCrossAttnMotion" if config.get("use_motion_mid_block", True) is True \
            else "UNetMidBlock2DCrossAttn"
    return config.get("mid_block_type", "UNetMidBlock2DCrossAttn")


def unit_order(block_class: str | None, unit_bytes: dict[str, int]) -> list[str] | None:
    """The children (`resnets.0`, ...) a block of `block_class` calls, in call order, when its tensors
    (`unit_bytes`: child path → bytes, `""` for tensors outside an indexed child) are exactly those
    children; None for an unknown class or any other layout (the block is then one unit)."""
    known = UNIT_ORDERS.get(block_class or "")
    if known is None or "" in unit_bytes:
        return None
    lists, kind = known
    found: dict[str, set[int]] = defaultdict(set)
    for path in unit_bytes:
        name, _, index = path.partition(".")
        found[name].add(int(index))
    if not set(found) <= set(lists) or any(sorted(v) != list(range(len(v))) for v in found.values()):
        return None
    counts = {name: len(found[name]) for name in ("resnets", "attentions", "motion_modules")}
    layers = counts["resnets"]
    if layers == 0:
        return None
    if kind in PER_LAYER:  # each layer's children in turn, then the sampler
        children = PER_LAYER[kind]
        if any(counts[c] != layers for c in children):
            return None
        sampler = [f"{lists[-1]}.{i}" for i in range(len(found[lists[-1]]))]
        return [f"{c}.{i}" for i in range(layers) for c in children] + sampler
    inner = MID_INNER[kind]  # a mid block: resnets.0, then each layer's inner children and the next resnet
    if any(counts[c] != layers - 1 for c in inner):
        return None
    return ["resnets.0", *(p for i in range(layers - 1) for p in (*(f"{c}.{i}" for c in inner), f"resnets.{i + 1}"))]


def _block_types(config: dict, key: str, count: int) -> list[str | None]:
    """The block class names the config gives (`UNetRes` prefix dropped, as diffusers does), else None each."""
    declared = config.get(key)
    if not isinstance(declared, list) or len(declared) != count:
        return [None] * count
    return [t.removeprefix("UNetRes") if isinstance(t, str) else None for t in declared]


def unet_block_lists(folder: Path, class_name: str | None, config: dict,
                     tensors: Iterable[TensorInfo]) -> list[BlockList]:
    """A UNet's blocks in execution order, one block list each whose units are the block's children in
    call order (none for a class not in `UNET_STREAMED_CLASSES`); refuses a config whose
    `down_block_types` / `up_block_types` disagree with the blocks the tensors hold."""
    if class_name not in UNET_STREAMED_CLASSES:
        return []
    # attr -> block index -> child path ("" outside an indexed child) -> bytes
    sizes: dict[str, dict[int, dict[str, int]]] = {
        attr: defaultdict(lambda: defaultdict(int)) for attr in UNET_ORDER}
    held: dict[tuple[str, int, str], list[TensorInfo]] = defaultdict(list)  # each unit's tensors (fp8 bytes)
    for tensor in tensors:
        attr, _, rest = tensor.name.partition(".")
        if attr == "mid_block":
            index = 0
        elif attr in sizes:
            match = _INDEXED.match(tensor.name)
            if not match:
                continue
            index, rest = int(match.group(2)), match.group(3)
        else:
            continue
        child = _CHILD.match(rest)
        sizes[attr][index][child.group(0)[:-1] if child else ""] += tensor.nbytes
        held[attr, index, child.group(0)[:-1] if child else ""].append(tensor)
    lists = []
    for attr in UNET_ORDER:
        found = sizes[attr]
        if found and sorted(found) != list(range(len(found))):
            raise ModelDirError(f"{folder}: the weights' {attr} are not numbered 0..{len(found) - 1}")
        key = {"down_blocks": "down_block_types", "up_blocks": "up_block_types"}.get(attr)
        declared = config.get(key) if key else None
        if isinstance(declared, list) and len(declared) != len(found):
            raise ModelDirError(f"{folder / 'config.json'}: {key} names {len(declared)} blocks but the weights "
                                f"hold {len(found)} {attr} (config and tensors disagree)")
        if not found:
            continue
        if key:
            types = _block_types(config, key, len(found))
        else:
            mid = mid_block_type(class_name, config)
            types = [mid if isinstance(mid, str) else None]
        for i in range(len(found)):
            name = attr if attr == "mid_block" else f"{attr}.{i}"
            units = found[i]
            order = unit_order(types[i], units)
            if order is None:  # unknown class or layout: the whole block is one unit
                fp8 = (sum(_fp8_bytes(held[attr, i, p])[0] for p in units),)
                elems = (sum(_fp8_bytes(held[attr, i, p])[1] for p in units),)
                lists.append(BlockList(name, (sum(units.values()),), (), fp8, fp8, elems, elems))
            else:
                fp8 = tuple(_fp8_bytes(held[attr, i, p])[0] for p in order)
                elems = tuple(_fp8_bytes(held[attr, i, p])[1] for p in order)
                lists.append(BlockList(name, tuple(units[p] for p in order), tuple(order), fp8, fp8, elems, elems))
    return lists


# --- config agreement -----------------------------------------------------------------------------

def check_config_block_counts(folder: Path, library: str | None, class_name: str | None, config: dict,
                              tensors: Iterable[TensorInfo]) -> None:
    """Refuse a config whose block counts are not whole numbers or disagree with the tensors held."""
    layout = init_layout(class_name) if library == PACKAGE and class_name else None
    if layout is None or not layout.counts:
        return
    sized = {c.attr for c in layout.counts}
    held: dict[str, set[int]] = defaultdict(set)
    for tensor in tensors:
        match = _INDEXED.match(tensor.name)
        if match and match.group(1) in sized:
            held[match.group(1)].add(int(match.group(2)))
    where = folder / "config.json"
    for spec in layout.counts:
        if spec.key not in config:
            continue  # only what the config says is checked
        value = config[spec.key]
        shown = _shown(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ModelDirError(f"{where}: {spec.key} = {shown} is not a block count (expected a whole number >= 0)")
        indices = held.get(spec.attr, set())
        if len(indices) != value:
            raise ModelDirError(f"{where}: {spec.key} = {shown} but the weights hold {len(indices)} {spec.attr} "
                                "(config and tensors disagree)")
        if indices and max(indices) != value - 1:
            raise ModelDirError(f"{where}: {spec.key} = {shown} but the weights' {spec.attr} are not numbered "
                                f"0..{value - 1} (config and tensors disagree)")


def _shown(value: object, limit: int = 40) -> str:
    """The value as the config spells it, cut short: a hostile config must not make a long line."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _fp8_bytes(tensors: list[TensorInfo]) -> tuple[int, int]:
    """A UNet unit's (bytes, elements stored in fp8) with fp8 storage (engine/model_dir/fp8_names.py's header rule;
    UNets have no AdaLN, so the modulation opt-in stores nothing more)."""
    chosen = header_stored_fp8((t.name, t.shape) for t in tensors)
    return (sum(t.numel if t.name in chosen else t.nbytes for t in tensors),
            sum(t.numel for t in tensors if t.name in chosen))
