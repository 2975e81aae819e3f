"""Resolve a policy against a discovered model and forecast what it costs — before any load.

Residency of each component:
- `streamed`: the denoiser's blocks (a DiT's, or a UNet's down/mid/up blocks; DLO always owns them), minus
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
- pinned host bytes = streamed blocks + staged components (one pinned master each);
- streamed per DiT forward = bytes of all streamed blocks (each crosses the link once per forward);
- peak device weight bytes = resident bytes + the streamer's ring (`residency.slots`: the policy's k,
  never more than the streamed blocks) × the largest streamed block + the largest staged component
  (only one auxiliary stage runs at a time). With activations and per phase: engine/request_forecast.py.
- pinned host bytes with live re-plan (the console's load) are every block and encoder/VAE: see
  `Engine(live_replan=True)`; this forecast is `run`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..offload.policy import OffloadPolicy
from ..offload.residency import BlockResidency
from .discovery import ComponentInfo, ModelInfo
from .roles import DENOISER_ROLES

Residency = Literal["streamed", "staged", "resident", "none"]
Why = Literal["explicit", "default", "implicit", "dlo", "mode", "no-weights", "not-auxiliary", "no-blocks"]


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
    residency: BlockResidency  # the decision `blocks` shows, passed as is to the streamer


def execution_blocks(model: ModelInfo, residency: BlockResidency) -> list[StreamedBlock]:
    """Every denoiser block in execution order (across all DiTs / UNets), streamed as `residency` decided."""
    blocks: list[StreamedBlock] = []
    for dit in model.denoisers:
        for block_list in dit.block_lists:
            for i, nbytes in enumerate(block_list.block_bytes):
                streamed = not residency.resident[len(blocks)]
                blocks.append(StreamedBlock(dit.name, block_list.attr, i, nbytes, streamed))
    return blocks


def _component_plan(info: ComponentInfo, policy: OffloadPolicy, blocks: list[StreamedBlock]) -> ComponentPlan:
    if not info.has_weights:
        return ComponentPlan(info, "none", "no-weights", 0, 0)
    if info.role in DENOISER_ROLES:
        if policy.mode == "resident":
            return ComponentPlan(info, "resident", "mode", info.nbytes, 0)
        if not info.block_lists:
            return ComponentPlan(info, "resident", "no-blocks", info.nbytes, 0)
        own = [b for b in blocks if b.dit == info.name]
        streamed = sum(b.nbytes for b in own if b.streamed)
        kept = sum(1 for b in own if not b.streamed)
        return ComponentPlan(info, "streamed", "dlo", info.nbytes - streamed, streamed, kept)
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


def make_plan(model: ModelInfo, policy: OffloadPolicy, residency: BlockResidency | None = None) -> Plan:
    """Check the policy against the model (raising PolicyError) and compute residency and forecast.

    `residency`: the blocks' residency as already carried out (a loaded streamer whose block order was
    corrected by the first forward keeps its blocks where they are), instead of the policy's."""
    policy.check_against(model.auxiliary_names, [d.name for d in model.denoisers], model.num_dit_blocks,
                         unet_names=[d.name for d in model.by_role("unet")])
    if residency is None or residency.num_blocks != model.num_dit_blocks:
        residency = policy.block_residency(model.num_dit_blocks)
    blocks = execution_blocks(model, residency)
    plans = tuple(_component_plan(c, policy, blocks) for c in model.components)
    streamed = [b.nbytes for b in blocks if b.streamed]
    staged = [p.info.nbytes for p in plans if p.residency == "staged"]
    resident = sum(p.device_bytes for p in plans)
    largest_block = max(streamed, default=0)
    largest_staged = max(staged, default=0)
    forecast = Forecast(
        device_resident_bytes=resident,
        pinned_host_bytes=sum(streamed) + sum(staged),
        streamed_bytes_per_forward=sum(streamed),
        peak_device_weight_bytes=resident + residency.slot_bytes(largest_block) + largest_staged,
        largest_streamed_block_bytes=largest_block,
        largest_staged_bytes=largest_staged,
        num_streamed_blocks=len(streamed),
        num_resident_blocks=len(blocks) - len(streamed),
        streaming_slots=residency.slots,
        pinned_host_bytes_live=live_masters_bytes(plans, blocks, policy),
    )
    return Plan(model, policy, plans, tuple(blocks), forecast, residency)
