"""Resolve a policy against a discovered model and forecast what it costs — before any load.

Residency of each component:
- `streamed`: the denoiser's blocks (a DiT's, or a UNet's units: its blocks' children; DLO owns them), minus
  the `resident_layers` its placement keeps — decided once, by `OffloadPolicy.block_residency`
  (offload/residency.py), and handed as `Plan.residency` to the streamer, so the forecast and the
  placement use the same block list and slot count;
- `staged`: an encoder/VAE whose policy resolves to True (pinned on host, on the device only
  for its stage);
- `resident`: an encoder/VAE whose policy resolves to False, every weighted `other` component, a
  DiT or UNet without block lists, and everything in `mode=resident`;
- `none`: components without weights (tokenizers, schedulers).

Forecast (all figures from the safetensors headers):
- device resident bytes = resident components + DiT non-block bytes + resident DiT layers;
- pinned host bytes = streamed blocks + staged components (one pinned master each, a streamed encoder's
  layers included once);
- streamed per DiT forward = bytes of all streamed blocks (each crosses the link once per forward);
- peak device weight bytes = resident bytes + the streamer's ring (`residency.slots`: the policy's k,
  never more than the streamed blocks) × the largest streamed block (a UNet's ring: those bytes as one
  buffer, offload/byte_ring.py) + the largest staged component
  (only one auxiliary stage runs at a time; an encoder streamed layer by layer stages its non-layer weights
  and two layers, engine/planning/lean.py). With activations and per phase: engine/planning/request_forecast.py.
- with fp8 storage (`Plan.stream_dtype`), a block's bytes are its fp8 bytes (engine/loading/stream_dtype.py):
  pinned, streamed, slot and resident-block bytes all shrink (resident blocks stay fp8 on the device
  and are upcast per forward, as streamed ones are), plus one compute-dtype scratch for the block
  that runs; the non-block layers are upcast once, so they keep the checkpoint's bytes; resident
  blocks kept upcast (`residency.upcast`, the policy's `upcast_resident`) count their compute-dtype
  bytes on the device (`StreamedBlock.device_bytes`) and no per-forward upcast;
- pinned host bytes with live re-plan (the console's load) are every block and encoder/VAE: see
  `Engine(options=EngineOptions(live_replan=True))`; this forecast is `run`'s.

Two experts (Wan 2.2 A14B, engine/planning/experts.py): one runs per forward, so the policy's residency applies
to each expert's own blocks and the device holds only the running one's share: device resident bytes
count the larger expert's resident blocks (not both), streamed per forward and the ring are the running
expert's, and the pinned host holds every block of both (the resident ones too: they move at the switch).
`Plan.forward` is one forward's blocks and residency, what the step forecast replays.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from ...offload.errors import PolicyError
from ...offload.policy import OffloadPolicy
from ...offload.residency import BlockResidency
from ...offload.tiers import ALL_PINNED, HostTiers
from ..model_dir.discovery import ComponentInfo, ModelInfo
from ..model_dir.fp8_names import FP8_NAMES
from ..model_dir.roles import DENOISER_ROLES
from .experts import Expert, blocks_per_forward, plan_experts, streamer_residency
from .lean import encoder_stage_bytes

FLOAT_ITEMSIZE = {"float32": 4, "float64": 8}  # the compute dtype's bytes per element; else 2 (bf16/fp16)
Residency = Literal["streamed", "staged", "resident", "none"]
Why = Literal["explicit", "default", "implicit", "dlo", "mode", "no-weights", "not-auxiliary", "no-blocks", "unused"]


@dataclass(frozen=True, slots=True)
class ComponentPlan:
    """One component's resolved residency, why, and the bytes it puts on device / host."""

    info: ComponentInfo
    residency: Residency
    why: Why
    device_bytes: int
    host_bytes: int
    resident_layers: int = 0


@dataclass(frozen=True, slots=True)
class StreamedBlock:
    """One DiT block in execution order, and whether it is streamed."""

    dit: str
    attr: str
    index: int
    nbytes: int
    streamed: bool
    upcast_elems: int = 0  # fp8 storage: elements upcast to the compute dtype each forward (offload/upcast.py)
    kept_upcast: bool = False  # resident, kept in the compute dtype: converted once at load, never per forward
    compute_itemsize: int = 2  # fp8 storage: bytes per element of the compute dtype (`compute_itemsize`)
    file_nbytes: int = 0  # bytes in its weight files when not `nbytes` (fp8 storage of a 16-bit checkpoint)

    @property
    def read_nbytes(self) -> int:
        """Bytes a page-cache or disk read of it brings from its files (converted on the host after it)."""
        return self.file_nbytes or self.nbytes

    @property
    def upcast_extra_bytes(self) -> int:
        """Device bytes keeping it upcast adds to its fp8 bytes (bf16: one per fp8 element)."""
        return self.upcast_elems * (self.compute_itemsize - 1)

    @property
    def device_bytes(self) -> int:
        """Its bytes on the device when resident: as stored, or kept upcast."""
        return self.nbytes + (self.upcast_extra_bytes if self.kept_upcast else 0)

    @property
    def forward_upcast_elems(self) -> int:
        """Elements upcast before each forward (none for a block kept upcast)."""
        return 0 if self.kept_upcast else self.upcast_elems


@dataclass(frozen=True, slots=True)
class Forecast:
    device_resident_bytes: int
    pinned_host_bytes: int
    streamed_bytes_per_forward: int
    peak_device_weight_bytes: int
    largest_streamed_block_bytes: int
    largest_staged_bytes: int
    num_streamed_blocks: int
    num_resident_blocks: int
    streaming_slots: int = 0
    pinned_host_bytes_live: int = 0  # with live re-plan (the console): every DiT block and encoder/VAE
    upcast_scratch_bytes: int = 0  # fp8 storage: the running block's weights in the compute dtype
    lora_device_bytes: int = 0  # --lora: A/B (and merge's scratch) on the device, in the figures above (lora_cost.py)

    def transfer_seconds(self, bandwidth_bytes_per_s: float | None) -> float | None:
        """Time to stream the DiT once at a given host→device bandwidth (None when unknown)."""
        if not bandwidth_bytes_per_s:
            return None
        return self.streamed_bytes_per_forward / bandwidth_bytes_per_s


@dataclass(frozen=True, slots=True)
class Plan:
    model: ModelInfo
    policy: OffloadPolicy
    components: tuple[ComponentPlan, ...]
    blocks: tuple[StreamedBlock, ...]
    forecast: Forecast
    residency: BlockResidency  # passed as is to the streamer (with experts: the first one running)
    experts: tuple[Expert, ...] = ()  # two experts sharing the budget (engine/planning/experts.py), else ()
    stream_dtype: str | None = None  # the DiT blocks' storage dtype when fp8 (policy's, or the checkpoint's)
    tiers: HostTiers = ALL_PINNED  # where each streamed block and staged master lives on the host (offload/tiers.py)
    lora_device_bytes: int = 0  # --lora's device bytes, counted in `forecast` (engine/planning/lora_cost.py)

    @property
    def active_blocks(self) -> tuple[bool, ...] | None:
        """The streamer's ring mask at load (the first expert's blocks), None without experts."""
        if not self.experts:
            return None
        return streamer_residency(self.experts, 0, len(self.blocks))[1]

    @property
    def forward(self) -> tuple[tuple[StreamedBlock, ...], BlockResidency]:
        """One DiT forward's blocks and their residency: every block, or with experts the first one's
        (the one that runs first; Wan 2.2's two are the same size)."""
        if not self.experts:
            return self.blocks, self.residency
        e = self.experts[0]
        return self.blocks[e.start:e.stop], e.residency


def storage_dtype(model: ModelInfo, policy: OffloadPolicy) -> str | None:
    """The fp8 dtype the DiT weights are stored in: the policy's `stream_dtype`, else the one the DiT
    checkpoint holds fp8 tensors in (an fp8 checkpoint is streamed as stored)."""
    if policy.stream_dtype is not None:
        return policy.stream_dtype
    for dit in model.denoisers:
        held = [d for d in dit.dtypes if d in FP8_NAMES]  # by bytes, largest first
        if held:
            return held[0]
    return None


def compute_itemsize(dtypes: list[str]) -> int:
    """Bytes per element of the dtype fp8 weights are upcast to: the DiT's widest-held float dtype that is not
    fp8 (a `--stream-dtype` cast keeps the checkpoint's as compute; an fp8 checkpoint's norms hold it)."""
    other = [d for d in dtypes if d not in FP8_NAMES]
    return FLOAT_ITEMSIZE.get(other[0], 2) if other else 2


def execution_blocks(model: ModelInfo, residency: BlockResidency, experts: tuple[Expert, ...] = (),
                     fp8: bool = False, modulation: bool = False) -> list[StreamedBlock]:
    """Every denoiser block in execution order (across all DiTs / UNets), streamed as `residency` decided;
    an expert's blocks as its own residency decided (resident = resident while that expert runs); each
    with its bytes as stored (`fp8`: the DiT's weights in fp8, engine/loading/stream_dtype.py)."""
    flags = list(residency.resident)
    for e in experts:
        flags[e.start:e.stop] = e.residency.resident
    kept = residency.upcast_flags if fp8 else (False,) * len(flags)
    blocks: list[StreamedBlock] = []
    for dit in model.denoisers:
        width = compute_itemsize(dit.dtypes)
        for block_list in dit.block_lists:
            elems = block_list.upcast_elements(modulation) if fp8 else (0,) * block_list.count
            for i, nbytes in enumerate(block_list.stored_bytes(fp8, modulation)):
                n = len(blocks)
                in_file = block_list.block_bytes[i]
                blocks.append(StreamedBlock(dit.name, block_list.attr, i, nbytes, not flags[n], elems[i], kept[n],
                                            width, in_file if in_file != nbytes else 0))
    return blocks


def _component_plan(info: ComponentInfo, policy: OffloadPolicy, blocks: list[StreamedBlock],
                    expert: bool = False) -> ComponentPlan:
    if not info.has_weights:
        return ComponentPlan(info, "none", "no-weights", 0, 0)
    if info.unused:  # never called (engine/model_dir/unused.py): built empty, nothing placed or read
        return ComponentPlan(info, "none", "unused", 0, 0)
    if info.role in DENOISER_ROLES:
        if policy.mode == "resident":
            return ComponentPlan(info, "resident", "mode", info.nbytes, 0)
        if not info.block_lists:
            return ComponentPlan(info, "resident", "no-blocks", info.nbytes, 0)
        own = [b for b in blocks if b.dit == info.name]
        streamed = sum(b.nbytes for b in own if b.streamed)
        kept = sum(1 for b in own if not b.streamed)
        # non-block modules as the files hold them (upcast once if fp8), resident blocks as stored (or upcast)
        left = info.non_block_bytes + sum(b.device_bytes for b in own if not b.streamed)
        if expert:  # device: while it runs; host: every block's master (the resident ones move at a switch)
            return ComponentPlan(info, "streamed", "dlo", left, sum(b.nbytes for b in own), kept)
        return ComponentPlan(info, "streamed", "dlo", left, streamed, kept)
    if info.role in ("encoder", "vae"):
        if policy.mode == "resident":
            return ComponentPlan(info, "resident", "mode", info.nbytes, 0)
        why = policy.source_of(info.name)
        if policy.offload_enabled(info.name):
            return ComponentPlan(info, "staged", why, 0, info.nbytes)
        return ComponentPlan(info, "resident", why, info.nbytes, 0)
    return ComponentPlan(info, "resident", "not-auxiliary", info.nbytes, 0)


def live_masters_bytes(plans: tuple[ComponentPlan, ...], blocks: list[StreamedBlock], policy: OffloadPolicy) -> int:
    """Host bytes a live-re-plan load keeps (pinned on CUDA): every DiT block and every encoder/VAE, so
    that any later policy moves from memory; in resident mode nothing is kept (no re-plan applies)."""
    if policy.mode == "resident":
        return 0
    aux = sum(p.info.nbytes for p in plans if p.info.role in ("encoder", "vae") and p.info.has_weights)
    return sum(b.nbytes for b in blocks) + aux


def upcast_scratch(model: ModelInfo, blocks: list[StreamedBlock]) -> int:
    """The upcast scratch (offload/upcast.py): the largest block upcast per forward (not one kept upcast) in
    a 2-byte compute dtype, from the headers (a 16-bit checkpoint's bytes as stored, an fp8 one's twice)."""
    header: list[int] = []
    for dit in model.denoisers:
        scale = 2 if any(d in FP8_NAMES for d in dit.dtypes) else 1
        header.extend(n * scale for block_list in dit.block_lists for n in block_list.block_bytes)
    return max((n for n, b in zip(header, blocks, strict=False) if not b.kept_upcast), default=0)


def make_plan(model: ModelInfo, policy: OffloadPolicy, residency: BlockResidency | None = None) -> Plan:
    """Check the policy against the model (raising PolicyError) and compute residency and forecast.

    `residency`: the blocks' residency as already carried out (a loaded streamer whose block order was
    corrected by the first forward keeps its blocks where they are), instead of the policy's; two experts
    (engine/planning/experts.py) always take their own."""
    policy.check_against(model.auxiliary_names, [d.name for d in model.denoisers], blocks_per_forward(model),
                         unet_names=[d.name for d in model.by_role("unet")])
    for d in model.denoisers:  # engine/model_dir/quant_layouts.py: what the installed libraries could load at all
        if d.quant_method is not None and policy.mode == "dlo":
            raise PolicyError(f"{d.name} is quantized ('{d.quant_method}'): its layers are the quantizer's, not "
                              "tensors DLO can stream; use --mode resident")
    stored = storage_dtype(model, policy)
    if policy.fp8_modulation and stored is None:
        raise PolicyError("fp8 modulation needs fp8 storage: add --stream-dtype float8_e4m3fn (or an fp8 checkpoint)")
    if policy.upcast_count and stored is None:
        raise PolicyError("upcast resident blocks needs fp8 storage: add --stream-dtype float8_e4m3fn (or an fp8 "
                          "checkpoint), or leave --upcast-resident at auto")
    experts = plan_experts(model, policy)
    if experts and policy.upcast_count:
        raise PolicyError("upcast resident blocks is not supported with two experts yet: leave --upcast-resident "
                          "at auto or off")
    if experts:
        residency = streamer_residency(experts, 0, model.num_dit_blocks)[0]
    elif residency is None or residency.num_blocks != model.num_dit_blocks:
        residency = policy.block_residency(model.num_dit_blocks)
    if model.by_role("unet") and residency.num_streamed and not residency.byte_ring:
        residency = replace(residency, byte_ring=True)  # units of 2 MB to 0.7 GB: one buffer (offload/byte_ring.py)
    blocks = execution_blocks(model, residency, experts, stored is not None and policy.mode == "dlo",
                              policy.fp8_modulation)
    names = {e.name for e in experts}
    plans = tuple(_component_plan(c, policy, blocks, c.name in names) for c in model.components)
    streamed_enc = policy.lean_on("stream_encoders")  # a streamed encoder's stage: non-layer weights + 2 layers
    staged_device = [encoder_stage_bytes(p.info, streamed_enc) for p in plans if p.residency == "staged"]
    staged = [p.info.nbytes for p in plans if p.residency == "staged"]
    resident = sum(p.device_bytes for p in plans)
    # one forward's blocks (with experts: each expert's own, the device holding the larger share)
    forwards = [blocks[e.start:e.stop] for e in experts] or [blocks]
    streamed_each = [[b.nbytes for b in f if b.streamed] for f in forwards]
    kept_each = [sum(b.device_bytes for b in f if not b.streamed) for f in forwards]
    resident -= sum(kept_each) - max(kept_each)  # only one expert's resident blocks at a time
    largest_block = max((max(s, default=0) for s in streamed_each), default=0)
    largest_staged = max(staged_device, default=0)
    slots = max(e.residency.slots for e in experts) if experts else residency.slots
    first = streamed_each[0]
    scratch = upcast_scratch(model, blocks) if stored is not None and policy.mode == "dlo" else 0
    forecast = Forecast(
        device_resident_bytes=resident,
        # a streamed encoder's layers are held once: read in place from its arena (offload/in_place_filler.py)
        pinned_host_bytes=sum(p.host_bytes for p in plans if p.residency == "streamed") + sum(staged),
        streamed_bytes_per_forward=max(sum(s) for s in streamed_each),
        peak_device_weight_bytes=resident + slots * largest_block + largest_staged + scratch,
        largest_streamed_block_bytes=largest_block,
        largest_staged_bytes=largest_staged,
        num_streamed_blocks=len(first),
        num_resident_blocks=len(forwards[0]) - len(first),
        streaming_slots=slots,
        pinned_host_bytes_live=live_masters_bytes(plans, blocks, policy),
        upcast_scratch_bytes=scratch,
    )
    return Plan(model, policy, plans, tuple(blocks), forecast, residency, experts, stored)
