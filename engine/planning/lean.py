"""Lean phases: what each costs and saves, for the forecast and the `--vram-budget` planner (no torch).

A request's peak is its largest phase (engine/planning/request_forecast.py). Each phase has a leaner way to run:
- text encoding: a staged encoder *streamed* layer by layer (`stream_encoders`) through a ring of 2
  slots, as DiT blocks are (offload/layer_stage.py): on the device only its non-layer weights (embeddings,
  final norm) and two layers instead of the whole encoder. Exact (same kernels on the same weights);
  costs about one layer's copy per call (the ring's wrap-around prefetch of layer 0).
- VAE decode: *tiled* (`vae_tiling`, diffusers' `enable_tiling()`, defaults of each VAE class): the
  decoder's activations shrink to one tile's; overlapping tiles are decoded and blended, so the
  decode does more work and **the pixels differ** from an untiled decode. *Sliced* (`vae_slicing`,
  `enable_slicing()`): one sample of a batch at a time, each exactly as a batch of one decodes it;
  on a CPU a batched decode differs from that in the last bits (2e-5 on the tiny VAE: batch-size
  dependent kernels), so sliced is *not* bit-identical to the batched decode
  (tests/engine/test_lean_phases.py). No saving at batch 1 (a single prompt): `auto` never picks it.
- denoise: feed-forward chunking (`ff_chunking`, diffusers' `enable_forward_chunking()` with its
  defaults: chunks of one over the batch, i.e. guidance's two halves one after the other) where the
  class has it (SD3, HunyuanDiT, the video UNets); bit-identical on a CPU for the tiny SD3; its saving
  is not modelled yet, so only `on` applies it.

The models here scale a measured (or estimated) phase figure; a GPU benchmark calibrates them
(`benchmarks/lean_phases.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...offload.units import align_up, format_bytes
from ..model_dir.discovery import ComponentInfo
from ..model_dir.weights import DTYPES, ModelDirError, load_json

if TYPE_CHECKING:
    from ...offload.policy import OffloadPolicy
    from .plan import Plan
    from .request_profile import RequestSize

ENCODER_SLOTS = 2
LABELS = {"stream_encoders": "text encoders streamed layer by layer", "vae_tiling": "VAE decode tiled",
          "vae_slicing": "VAE decode sliced", "ff_chunking": "feed-forward chunked"}
PHASE_OF = {"stream_encoders": "text_encoding", "vae_tiling": "vae_decode", "vae_slicing": "vae_decode",
            "ff_chunking": "denoise"}
EXACTNESS = {"stream_encoders": "exact (bit-identical)",
             "vae_tiling": "pixels differ from an untiled decode",
             "vae_slicing": "each sample exactly as decoded alone (a batched decode may differ in the last bits)",
             "ff_chunking": "bit-identical on a CPU (tiny SD3, tested), not verified on a GPU"}
# diffusers 0.42 classes with `enable_forward_chunking` (a DiT's or UNet's)
FF_CHUNKING_CLASSES = frozenset({"SD3Transformer2DModel", "HunyuanDiT2DModel", "UNet3DConditionModel",
                                 "UNetMotionModel", "I2VGenXLUNet", "UNetSpatioTemporalConditionModel"})


@dataclass(frozen=True, slots=True)
class Tiles:
    """A VAE's tiling in output pixels: tile height/width and the stride between tiles."""

    height: int
    width: int
    stride_h: int
    stride_w: int


# `enable_tiling()`'s defaults per class, as diffusers 0.42.1 sets them (in output pixels)
_FIXED_TILES = {
    "AutoencoderKLWan": Tiles(256, 256, 192, 192),
    "AutoencoderKLQwenImage": Tiles(256, 256, 192, 192),
    "AutoencoderKLHunyuanVideo": Tiles(256, 256, 192, 192),
    "AutoencoderKLMochi": Tiles(256, 256, 192, 192),
    "AutoencoderKLLTXVideo": Tiles(512, 512, 448, 448),
}


def vae_tiles(info: ComponentInfo) -> Tiles | None:
    """The tiling `enable_tiling()` gives this VAE, or None where the class has none we know."""
    if info.class_name in _FIXED_TILES:
        return _FIXED_TILES[info.class_name]
    if info.class_name not in ("AutoencoderKL", "AutoencoderKLCogVideoX"):
        return None
    try:
        config = load_json(info.folder / "config.json")
    except (ModelDirError, OSError):
        return None
    if info.class_name == "AutoencoderKL":  # tile = sample_size, overlap 0.25
        size = config.get("sample_size")
        size = size[0] if isinstance(size, list | tuple) and size else size
        if not isinstance(size, int) or size < 8:
            return None
        return Tiles(size, size, int(size * 0.75), int(size * 0.75))
    h, w = config.get("sample_height", 480), config.get("sample_width", 720)
    if not isinstance(h, int) or not isinstance(w, int) or h < 16 or w < 16:
        return None
    return Tiles(h // 2, w // 2, int(h // 2 * (1 - 1 / 6)), int(w // 2 * (1 - 1 / 5)))


@dataclass(frozen=True, slots=True)
class TiledDecode:
    """What tiling does to one decode: the share of the activations one tile needs, and the work done
    (tiles overlap: every clipped tile's area over the frame's)."""

    peak_fraction: float
    work_factor: float
    tiles: int


def tiled_decode(tiles: Tiles, height: int, width: int) -> TiledDecode:
    """Tiling a `height` x `width` decode: diffusers tiles only when the frame exceeds a tile."""
    if height <= tiles.height and width <= tiles.width:
        return TiledDecode(1.0, 1.0, 1)
    rows = [min(tiles.height, height - y) for y in range(0, height, tiles.stride_h)]
    cols = [min(tiles.width, width - x) for x in range(0, width, tiles.stride_w)]
    area = sum(rows) * sum(cols)
    return TiledDecode(min(tiles.height, height) * min(tiles.width, width) / (height * width),
                       area / (height * width), len(rows) * len(cols))


def output_bytes(info: ComponentInfo, size: RequestSize) -> int:
    """The decoded output held on the device: 3 channels x frames x pixels in the VAE's dtype."""
    item = {name: n for name, n in DTYPES.values()}.get(info.dtypes[0] if info.dtypes else "", 4)
    return int(3 * (size.frames or 1) * (size.height or 0) * (size.width or 0) * item)


def tiled_decode_extra(untiled_extra: int, tiled: TiledDecode, out_bytes: int) -> int:
    """The decode's bytes above the weights when tiled: one tile's share of the untiled activations,
    plus the decoded tiles kept for blending and the assembled output (twice the output)."""
    if tiled.tiles <= 1:
        return untiled_extra
    return min(untiled_extra, int(untiled_extra * tiled.peak_fraction) + 2 * out_bytes)


def untiled_decode_extra(plan: Plan, size: RequestSize, measured: int) -> int:
    """A decode's bytes above the weights as if untiled, from one measured under the plan's policy (the
    inverse of `decode_extra`): a profile always stores the untiled figure, so that a later plan can
    decide whether to tile; forecasting the tiled decode again gives back exactly what was measured."""
    if not plan.policy.lean_on("vae_tiling"):
        return measured
    geometry = decode_geometry(plan, size)
    if geometry is None or geometry[0].tiles <= 1:
        return measured
    tiled, out = geometry
    return max(measured, int((measured - 2 * out) / tiled.peak_fraction))


def encoder_stage_bytes(info: ComponentInfo, streamed: bool) -> int:
    """Device bytes of an encoder's stage: whole, or streamed (non-layer weights + the ring's slots)."""
    if not streamed or not streamable(info) or info.layers is None:
        return info.nbytes
    return info.nbytes - info.layers.total_bytes + ENCODER_SLOTS * align_up(info.layers.largest_bytes)


def streamable(info: ComponentInfo) -> bool:
    return info.role == "encoder" and info.layers is not None and info.layers.count > ENCODER_SLOTS


def applicable(plan: Plan, name: str) -> bool:
    """Whether lean phase `name` changes anything for this model (staged encoders with a layer list,
    a VAE with tiling, a denoiser class with feed-forward chunking)."""
    staged = [c.info for c in plan.components if c.residency == "staged"]
    if name == "stream_encoders":
        return any(streamable(i) for i in staged)
    vaes = [c.info for c in plan.components if c.info.role == "vae" and c.info.has_weights]
    if name == "vae_tiling":
        return any(vae_tiles(i) is not None for i in vaes)
    if name == "vae_slicing":
        return bool(vaes)
    return any(c.class_name in FF_CHUNKING_CLASSES for c in plan.model.denoisers)


def text_stage_bytes(plan: Plan) -> int:
    """The largest staged encoder's stage on the device under the plan's policy."""
    streamed = plan.policy.lean_on("stream_encoders")
    return max((encoder_stage_bytes(c.info, streamed) for c in plan.components
                if c.residency == "staged" and c.info.role == "encoder"), default=0)


def decode_geometry(plan: Plan, size: RequestSize) -> tuple[TiledDecode, int] | None:
    """Tiling's effect on this request's decode (the largest VAE's), or None when it cannot be modelled
    (no known tiling, or the size is not known)."""
    vaes = sorted((c.info for c in plan.components if c.info.role == "vae" and c.info.has_weights),
                  key=lambda i: -i.nbytes)
    tiles = vae_tiles(vaes[0]) if vaes else None
    if tiles is None or not (size.height and size.width):
        return None
    return tiled_decode(tiles, size.height, size.width), output_bytes(vaes[0], size)


def decode_extra(plan: Plan, size: RequestSize, untiled_extra: int) -> int:
    """The decode's bytes above the weights under the plan's policy (tiled or not)."""
    if not plan.policy.lean_on("vae_tiling"):
        return untiled_extra
    geometry = decode_geometry(plan, size)
    return untiled_extra if geometry is None else tiled_decode_extra(untiled_extra, *geometry)


@dataclass(frozen=True, slots=True)
class LeanCost:
    """One lean phase in effect: its phase's peak without and with it, what it costs, and whether the
    output is exactly the plain pipeline's."""

    name: str
    phase: str
    peak_before: int | None
    peak_after: int | None
    cost: str
    exact: bool

    @property
    def label(self) -> str:
        return LABELS[self.name]

    @property
    def peak_text(self) -> str:
        if self.peak_before is None or self.peak_after is None:
            return "peak not modelled"
        return f"peak {format_bytes(self.peak_before)} -> {format_bytes(self.peak_after)}"

    @property
    def note(self) -> str:
        return f"{self.cost}, {EXACTNESS[self.name]}"

    @property
    def value(self) -> str:
        """`peak 11.9 GB -> 3.1 GB, +66 % decode time (15 overlapping tiles), pixels differ ...`."""
        return f"{self.peak_text}, {self.note}"

    @property
    def line(self) -> str:
        """`VAE decode tiled: peak 11.9 GB -> 3.1 GB, +66 % decode time, pixels differ ...`."""
        return f"{self.label}: {self.value}"


def lean_costs(plan: Plan, size: RequestSize, without: dict[str, int], with_: dict[str, int],
               bandwidth: float | None) -> list[LeanCost]:
    """A `LeanCost` per lean phase the plan applies (`without` / `with_`: phase peaks of the same plan
    with every lean phase off / as planned)."""
    out: list[LeanCost] = []
    for name in LABELS:
        if not plan.policy.lean_on(name) or not applicable(plan, name):
            continue
        phase = PHASE_OF[name]
        before, after = without.get(phase), with_.get(phase)
        if name == "stream_encoders":
            layer = max((c.info.layers.largest_bytes for c in plan.components
                         if c.residency == "staged" and streamable(c.info) and c.info.layers), default=0)
            cost = (f"+{layer / bandwidth:.3f} s a prompt (one layer's copy)" if bandwidth
                    else f"+one layer's copy a prompt ({format_bytes(layer)})")
            out.append(LeanCost(name, phase, before, after, cost, True))
        elif name == "vae_tiling":
            geometry = decode_geometry(plan, size)
            cost = "decode time not modelled (size unknown)" if geometry is None else \
                f"+{(geometry[0].work_factor - 1) * 100:.0f} % decode time ({geometry[0].tiles} overlapping tiles)"
            out.append(LeanCost(name, phase, before, after, cost, False))
        elif name == "vae_slicing":
            out.append(LeanCost(name, phase, None, None, "no saving at batch 1", False))
        else:
            out.append(LeanCost(name, phase, None, None, "saving and time not modelled", False))
    return out


def leaner_policy(plan: Plan, phase: str) -> OffloadPolicy | None:
    """The plan's policy with the next leaner phase for `phase` on (`leaner_after_oom`), or None. Tiling,
    slicing and chunking switch between requests (`Engine.replan`); streaming the encoders is a new load."""
    name = leaner_after_oom(plan, phase)
    return None if name is None else plan.policy.model_copy(update={name: "on"})


def leaner_after_oom(plan: Plan, phase: str) -> str | None:
    """The lean phase to turn on after running out of memory in `phase` (text_encoding, vae_decode),
    or None if none is left: for an OOM step-down (set it to "on" in the policy and retry the phase)."""
    order = {"text_encoding": ("stream_encoders",), "vae_decode": ("vae_tiling", "vae_slicing"),
             "denoise": ("ff_chunking",)}.get(phase, ())
    for name in order:
        if getattr(plan.policy, name) != "off" and not plan.policy.lean_on(name) and applicable(plan, name):
            return name
    return None
