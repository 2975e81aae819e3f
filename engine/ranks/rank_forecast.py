"""What each rank holds and moves when one model is served by several GPUs — before any load.

From the single-GPU plan (engine/planning/plan.py), the rank layout and the single-GPU request forecast:

- AllGather (sharded): each rank pins `ceil(block / N)` bytes of every streamed block (offload/sharding.py:
  the short last shard is zero-padded) plus its own whole master of every staged encoder/VAE (those are
  staged rank-locally). Before a streamed block runs, each rank copies its shard host→device (PCIe) into
  one of two shard buffers and the ranks all-gather the whole block into a ring slot; the (N-1)/N of the
  block that comes from the other ranks crosses NVLink. Resident blocks are whole on every rank.
- rank-local: every rank pins and streams whole blocks, exactly as one GPU does.

Every rank holds the same sizes (shards are equal by construction), so one rank's figures stand for all.
The step floor is max(compute, shard copy + exposed gather) per forward: the gather waits for the copy,
so the two are counted in series; compute comes from a measured profile only (None, "unknown", else).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...offload.options import StreamOptions
from ...offload.sharding import Shard
from ..planning.plan import Plan
from ..planning.request_forecast import RequestForecast, Source, dit_profile, known_profile
from ..planning.request_profile import RequestSize
from ..planning.stream_choice import DitProfile
from .rank_layout import RankLayout

NVLINK_BYTES_PER_S = 0.26e12
"""An estimate of the gather's rate over the bytes that cross the link: measured on 2 H200s with NV18,
0.68 GB gathered in 1.31 ms (0.34 GB of it from the other rank), i.e. ~0.26 TB/s effective."""


@dataclass(frozen=True, slots=True)
class RankForecast:
    """One rank's share of a plan under a layout (every rank the same); sizes in bytes."""

    layout: RankLayout
    describe: str
    requests_at_once: int  # requests (prompts or seeds) the ranks serve together: N for dp, 1 for cfg
    streamed_pinned_bytes: int  # this rank's shards of the streamed blocks (whole blocks rank-local)
    staged_pinned_bytes: int  # whole encoder/VAE masters, on every rank
    padding_bytes: int  # zero bytes that make the shards equal, all ranks together (< N per block)
    shard_buffer_bytes: int  # the two device buffers a shard lands in before its gather (0 rank-local)
    device_peak_bytes: int
    device_peak_source: Source
    pcie_bytes_per_forward: int  # host→device, this rank, one DiT forward
    nvlink_bytes_per_forward: int  # gathered from the other ranks, this rank, one DiT forward
    forwards_per_step: int | None  # DiT forwards per denoise step on a rank (None: no profile yet)
    compute_s_per_step: float | None
    step_floor_s: float | None
    step_floor_source: Source
    pcie_bandwidth: float | None
    nvlink_bandwidth: float | None  # None: no rate known for this link (ranks on a CPU gather over gloo)
    gather_link: Literal["NVLink", "gloo"] = "NVLink"  # GPUs gather over NVLink, CPU rank processes over gloo
    notes: tuple[str, ...] = ()

    @property
    def pinned_host_bytes(self) -> int:
        return self.streamed_pinned_bytes + self.staged_pinned_bytes

    @property
    def pinned_host_bytes_all_ranks(self) -> int:
        """What the ranks pin together: host memory of one machine when they share it."""
        return self.pinned_host_bytes * self.layout.gpus


def shard_sizes(block_bytes: list[int], world: int) -> list[int]:
    """Each block's shard per rank: ceil(bytes / world), as the AllGather streamer cuts its regions."""
    return [Shard(nbytes, world, 0).size for nbytes in block_bytes]


def rank_forwards_per_step(layout: RankLayout, profile: DitProfile | None) -> int | None:
    """Forwards a rank runs per step: the profile's; with CFG-parallel each rank runs one of the two branches."""
    if profile is None:
        return None
    if layout.parallel == "cfg" and layout.distributed:
        return max(profile.forwards_per_step // 2, 1)
    return profile.forwards_per_step


def _notes(plan: Plan, layout: RankLayout, profile: DitProfile | None, cpu: bool) -> list[str]:
    notes: list[str] = []
    f = plan.forecast
    if layout.sharded and f.num_resident_blocks:
        notes.append("resident layers with AllGather: allowed here — resident blocks are whole on every rank; "
                     "vLLM-Omni rejects them because its resident blocks come from a TP-aware loader")
    if layout.sharded and f.largest_staged_bytes:
        notes.append("encoders and VAEs are staged rank-locally: every rank pins its own whole master")
    if layout.parallel == "cfg" and profile is not None and profile.forwards_per_step < 2:
        notes.append("the profile ran both guidance branches as one batched forward: a rank's half-batch "
                     "forward is counted as a whole one (an upper bound)")
    if cpu and layout.sharded:
        notes.append("on a CPU the ranks are processes that gather over gloo: no rate known, step floor unknown")
    return notes


def _step_floor(compute_fwd: float | None, forwards: int | None, pcie: int, nvlink: int,
                bandwidth: float | None, nvlink_bandwidth: float | None, overlap: bool) -> float | None:
    if compute_fwd is None or forwards is None:
        return None
    copy = gather = 0.0
    if pcie:
        if not bandwidth:
            return None
        copy = pcie / bandwidth
    if nvlink:
        if not nvlink_bandwidth:
            return None
        gather = nvlink / nvlink_bandwidth
    transfer = copy + gather
    per_forward = max(compute_fwd, transfer) if overlap else compute_fwd + transfer
    return per_forward * forwards


def rank_forecast(plan: Plan, layout: RankLayout, request: RequestForecast | None = None,
                  profile: DitProfile | None = None, cpu: bool = False,
                  nvlink_bandwidth: float | None = NVLINK_BYTES_PER_S) -> RankForecast:
    """Per-rank figures of `plan` under `layout` (see the module docstring).

    `request` gives the single-GPU device peak and the host→device rate (else: weights only, no rate);
    `profile` the measured compute (else the step floor is unknown). On a CPU (`cpu`) copies do not
    overlap compute and the gather has no known rate."""
    f = plan.forecast
    streamed = [b.nbytes for b in plan.blocks if b.streamed]
    staged = sum(c.info.nbytes for c in plan.components if c.residency == "staged")
    n = layout.gpus
    if layout.sharded:
        shards = shard_sizes(streamed, n)
        streamed_pinned = sum(shards)
        padding = n * streamed_pinned - sum(streamed)
        largest = Shard(f.largest_streamed_block_bytes, n, 0)
        # the default shard buffers (two), and each ring slot holds the gathered block with its padding
        extra = StreamOptions.shard_buffers * largest.size if streamed else 0
        slot_padding = f.streaming_slots * (largest.gathered - largest.total)
        pcie, nvlink = streamed_pinned, (n - 1) * streamed_pinned
    else:
        streamed_pinned, padding, extra, slot_padding = sum(streamed), 0, 0, 0
        pcie, nvlink = sum(streamed), 0
    if request is not None:
        single_peak, peak_source, bandwidth = request.peak_bytes, request.peak_source, request.bandwidth
    else:
        single_peak, peak_source, bandwidth = f.peak_device_weight_bytes, "unknown", None
    link_rate = None if cpu else nvlink_bandwidth
    forwards = rank_forwards_per_step(layout, profile)
    compute_fwd = None if profile is None else sum(profile.compute_s) + profile.other_s
    floor = _step_floor(compute_fwd, forwards, pcie, nvlink, bandwidth, link_rate, overlap=not cpu)
    # the gather's rate is an estimate; without one, the floor is as good as the single-GPU step's figures
    floor_source: Source = "unknown" if floor is None else "estimated"
    if floor is not None and not nvlink and request is not None and request.step_source != "unknown":
        floor_source = request.step_source
    return RankForecast(
        layout=layout, describe=layout.describe(), requests_at_once=n if layout.parallel == "dp" else 1,
        streamed_pinned_bytes=streamed_pinned, staged_pinned_bytes=staged, padding_bytes=padding,
        shard_buffer_bytes=extra, device_peak_bytes=single_peak + extra + slot_padding,
        device_peak_source=peak_source, pcie_bytes_per_forward=pcie, nvlink_bytes_per_forward=nvlink,
        forwards_per_step=forwards,
        compute_s_per_step=None if compute_fwd is None or forwards is None else compute_fwd * forwards,
        step_floor_s=floor, step_floor_source=floor_source,
        pcie_bandwidth=bandwidth, nvlink_bandwidth=link_rate if nvlink else None,
        gather_link="gloo" if cpu else "NVLink",
        notes=tuple(_notes(plan, layout, profile, cpu)))


def rank_forecast_for(plan: Plan, layout: RankLayout, request: RequestForecast | None, size: RequestSize,
                      device: str) -> RankForecast:
    """`rank_forecast` with the compute of the profile the single-GPU forecast used (`known_profile`)."""
    profile, _ = known_profile(plan, size, device)
    return rank_forecast(plan, layout, request, dit_profile(plan, profile), cpu=device == "cpu")
