"""The process's host memory per phase, before any load: what a 32 GB machine needs to know (issue 35).

The figure is RSS: anonymous memory (pinned pages included) and the libraries' file-backed pages the
process touches, but not the page cache the kernel may drop. It is the sum of named parts, each held in
some phases (load, text encoding, denoise, VAE decode):

- the process baseline: python, torch, diffusers, transformers and (on CUDA) the CUDA context's host side.
  Measured on an H100 (benchmarks/results/host_rss_breakdown-flux-2026-12-05-h100-*.json): 1.05 GB when
  the load starts, 2.05 GB once a request has run (CUDA's kernel libraries, cuBLAS and the allocator's
  host side arrive with the first request; RSS fell back to 2.02-2.05 GB once the engine released
  everything). A CPU process has no CUDA libraries (`CPU_BASELINE_*`). The profile learns the
  baseline of this model and plan from a measured request (`learned_baseline`);
- pinned blocks: the streamer's arena (every block with live re-plan or two experts, else the
  streamed ones); the tier of each (`Plan.tiers`): a block in the page cache or on disk costs no bytes (`run`'s
  live load keeps its resident blocks' masters there: engine/planning/run_masters.py);
- pinned staged masters: each staged encoder/VAE's master (with live re-plan every encoder/VAE), unless
  its tier is the page cache or disk (then no master: it is read from its files at each stage, and it is built
  with its weights left in their files, nothing read: engine/loading/file_build.py; one that cannot be, a
  quantized one say, is in host memory once during the load, from its build until it gives its bytes back: a
  load read buffer);
- a layer-streamed encoder's ring arena: its layers packed again for the layer ring while its master is
  held (the 9.26 GB double pin of a Flux-size 8 GB plan; `Forecast.pinned_host_bytes` counts it while
  the loader does);
- the bounce rings (`offload.tiers.bounce_ring_bytes`): one shared by the streamer's file-tier blocks and the
  layer-streamed encoders read from their files (offload/bounce_pool.py: lent to each in turn), sized by the
  largest such block or layer, and the staged components' when any is read from a file tier
  (offload/file_stager.py: `stage_chunk_bytes` slots);
- the load's read buffers: arena reads land in place (a batch of `LoadOptions` is a view of the arena and
  costs nothing more), so what a load holds beyond the arenas is a component read into host memory before
  it moves to the device (a resident one, the DiT's non-block layers, or a resident block of a load that keeps
  no masters: read into its host tensors, moved, and its pages given back before the next one,
  offload/resident_blocks.py `move_resident`), the largest of them;
- on a CPU the device is the host: the device's weights (resident, ring slots, a staged copy) count too;
- the decoded output: frames x height x width x 3 as float32 plus its uint8 copy.

Measured (same files): a no-budget Flux-size run peaked at 35.9 GB = 33.9 GB of masters + 2.05 GB; a
`--vram-budget 8` one (live re-plan, encoder streamed by layer) at 45.3 GB = 43.1 GB + 2.2 GB.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...offload.tiers import bounce_ring_bytes, stage_chunk_bytes
from ..model_dir.discovery import ComponentInfo
from .lean import streamable
from .plan import Plan
from .request_profile import RequestSize

GB = 1_000_000_000
CUDA_BASELINE_LOAD = 1_050_000_000  # RSS when the load starts (H100, torch 2.11, CUDA 13): see the docstring
CUDA_BASELINE_RUN = 2_050_000_000  # RSS once a request ran and the engine released everything
# a CPU process (python + torch + diffusers + transformers, no CUDA): VmHWM of `run` on the tiny demo Flux,
# torch 2.13 CPU, 0.47 GB; its load-time share is not measured apart (taken as the run's less the heap's growth)
CPU_BASELINE_LOAD = 420_000_000
CPU_BASELINE_RUN = 470_000_000
PHASES = ("load", "text_encoding", "denoise", "vae_decode")
PINNED_PARTS = ("pinned blocks", "pinned staged masters", "encoder layer ring arena", "bounce ring")
RUN_PHASES = PHASES[1:]


@dataclass(frozen=True, slots=True)
class HostPart:
    """One named share of the host peak and the phases that hold it."""

    name: str
    nbytes: int
    phases: tuple[str, ...] = PHASES


@dataclass(frozen=True, slots=True)
class HostForecast:
    """The process's host peak (RSS) per phase, the overall peak and the parts it is made of."""

    phase_peaks: dict[str, int]
    peak_bytes: int
    peak_phase: str
    parts: tuple[HostPart, ...]
    baseline_source: str = "default"  # "default" (the measured constant) or "cached" (learned from a request)
    notes: tuple[str, ...] = ()
    live_replan: bool = False  # masters of everything a re-plan may move are kept (the console's load)

    def part(self, name: str) -> int:
        """Bytes of one named part (0 when absent)."""
        return sum(p.nbytes for p in self.parts if p.name == name)


def decoded_output_bytes(request: RequestSize | None) -> int:
    """The decoded frames on the host: float32 RGB plus the uint8 copy written out (0: size not known)."""
    if request is None or not request.height or not request.width:
        return 0
    return (request.frames or 1) * request.height * request.width * 3 * (4 + 1)


def block_bytes(plan: Plan, keep_masters: bool) -> tuple[int, int, int]:
    """(pinned, largest read through the bounce ring, largest read once) bytes of the block arena's blocks.
    `Plan.tiers.blocks` is indexed over every block of `Plan.blocks` (execution order, as the streamer takes it;
    two experts: the first's, then the second's); a resident block kept as a master is in its tier too (two
    experts read it from its file at each switch, through the bounce ring; a live load whose resident blocks'
    masters are their files reads each once to the device through a buffer of its own size, freed at once:
    offload/tier_filler.py, engine/planning/run_masters.py)."""
    pinned = largest_ring = largest_once = 0
    for i, b in enumerate(plan.blocks):
        if not (b.streamed or keep_masters):
            continue
        tier = plan.tiers.block(i)
        if tier == "pinned":
            pinned += b.nbytes
        elif b.streamed or plan.experts:
            largest_ring = max(largest_ring, b.read_nbytes)  # the bounce slot holds the file's bytes
        else:
            largest_once = max(largest_once, b.read_nbytes)
    return pinned, largest_ring, largest_once


def master_bytes(plan: Plan, live_replan: bool) -> tuple[int, int, int]:
    """(pinned bytes of staged encoder/VAE masters, the largest bounce slot a file-tier one reads through in its own
    ring, the largest layer a file-tier layer-streamed one reads through the shared ring: 0 when none is in a file
    tier); with live re-plan every encoder/VAE keeps a master (engine/loading/placement.py), in resident mode
    none."""
    pinned, chunk, layer = 0, 0, 0
    live = live_replan and plan.policy.mode == "dlo"
    for c in plan.components:
        kept = c.residency == "staged" or (live and c.info.role in ("encoder", "vae") and c.info.has_weights)
        if not kept:
            continue
        if plan.tiers.component(c.info.name) == "pinned":
            pinned += c.info.nbytes
        elif c.residency == "staged":  # a resident one whose master is its files is read once, at placement
            chunk = max(chunk, stage_chunk(plan, c.info))
            layer = max(layer, layer_slot(plan, c.info))
    return pinned, chunk, layer


def moved_block_bytes(plan: Plan) -> int:
    """The largest resident block of a load that keeps no block masters: read from its files into host tensors,
    then moved to the device, one block at a time (offload/resident_blocks.py `move_resident`)."""
    return max((b.nbytes for b in plan.blocks if not b.streamed), default=0)


def layer_streamed(plan: Plan, info: ComponentInfo) -> bool:
    """Whether the plan streams this staged encoder layer by layer (offload/layer_stage.py)."""
    return info.layers is not None and plan.policy.lean_on("stream_encoders") and streamable(info)


def stage_chunk(plan: Plan, info: ComponentInfo) -> int:
    """The slot of the ring of its own a file-tier staged component reads through: `stage_chunk_bytes` of it, or
    the whole component if smaller (offload/file_stager.py); where the plan streams it layer by layer, that of the
    rest (its layers go through the shared ring: `layer_slot`)."""
    if layer_streamed(plan, info):
        rest = info.non_block_bytes
        return min(rest, stage_chunk_bytes(rest))
    return min(info.nbytes, stage_chunk_bytes(info.nbytes))


def layer_slot(plan: Plan, info: ComponentInfo) -> int:
    """The slot a file-tier layer-streamed encoder's layers take in the ring it shares with the DiT's file-tier
    blocks (its largest layer: offload/layer_stage.py, offload/bounce_pool.py); 0 for one staged whole."""
    return max(info.layers.block_bytes, default=0) if layer_streamed(plan, info) and info.layers else 0


def layer_ring_arena_bytes(plan: Plan) -> int:
    """The layer ring's own arena of a layer-streamed encoder: what `Forecast.pinned_host_bytes` counts
    above the streamed blocks and the staged masters (0 once the loader reuses the master)."""
    f = plan.forecast
    streamed = sum(c.host_bytes for c in plan.components if c.residency == "streamed")
    staged = sum(c.info.nbytes for c in plan.components if c.residency == "staged")
    return max(0, f.pinned_host_bytes - streamed - staged)


def built_from_files(info: ComponentInfo) -> bool:
    """Whether a page-cache/disk-tier staged component is built with its weights left in their files, nothing read
    (engine/loading/file_build.py: a diffusers or transformers model with safetensors files, not quantized);
    else its library reads it whole into host memory once at load, then gives the bytes back."""
    return info.library in ("diffusers", "transformers") and bool(info.files) and info.quant_method is None


def read_whole_at_load(plan: Plan) -> list[ComponentInfo]:
    """The file-tier staged components a load reads whole into host memory once (`built_from_files` says no)."""
    return [c.info for c in plan.components if c.residency == "staged" and c.info.has_weights
            and plan.tiers.component(c.info.name) != "pinned" and not built_from_files(c.info)]


def load_buffer_bytes(plan: Plan, on_cpu: bool, once: int = 0) -> int:
    """The largest component read into host memory before it moves to the device: a resident one (a CUDA
    load reads it to the host first), a DiT's non-block layers, or a file-tier staged component that cannot be
    built over its files (`read_whole_at_load`; one that can costs nothing here), or `once`: the largest resident
    block read from its files to the device (`block_bytes`). On a CPU nothing else moves."""
    files = [info.nbytes for info in read_whole_at_load(plan)] + [once]  # given back once built (file_sources.py)
    if on_cpu:
        return max(files, default=0)
    sizes = [c.info.nbytes for c in plan.components if c.residency == "resident" and c.info.has_weights]
    sizes += [c.info.non_block_bytes for c in plan.components if c.residency == "streamed"]
    return max(sizes + files, default=0)


def learned_baseline(measured_peak: int, modelled: HostForecast) -> int:
    """The process base that makes `modelled` meet a measured peak (VmHWM): the peak less the largest run phase's
    other parts (the base is a run phase's; a load phase above the measured peak was over-counted, not the
    base). What the profile keeps for the next forecast of the model (engine/planning/host_profile.py)."""
    base = modelled.part("process baseline")
    others = max(modelled.phase_peaks[p] for p in RUN_PHASES) - base
    return max(0, measured_peak - others)


def host_forecast(plan: Plan, request: RequestSize | None = None, *, live_replan: bool = False,
                  on_cpu: bool = False, baseline: int | None = None) -> HostForecast:
    """The host peak of a load and one request under `plan` (see the module docstring).

    `live_replan`: the console's load (masters of everything a re-plan may move). `baseline`: a learned
    run baseline (the profile's), else the measured constant."""
    keep_masters = (live_replan and plan.policy.mode == "dlo") or bool(plan.experts)
    blocks_pinned, largest_file_block, read_once = block_bytes(plan, keep_masters)
    if not (keep_masters or on_cpu):  # on a CPU the block's host copy is its device copy (counted below)
        read_once = max(read_once, moved_block_bytes(plan))
    masters_pinned, master_chunk, layer = master_bytes(plan, live_replan)
    shared = max(largest_file_block, layer)  # the DiT's blocks and the encoders' layers take turns in one ring
    rings = (bounce_ring_bytes(shared) if shared else 0) + (bounce_ring_bytes(master_chunk) if master_chunk else 0)
    run_base = baseline if baseline is not None else (CPU_BASELINE_RUN if on_cpu else CUDA_BASELINE_RUN)
    load_base = min(run_base, CPU_BASELINE_LOAD if on_cpu else CUDA_BASELINE_LOAD)
    parts = [
        HostPart("process baseline at load", load_base, ("load",)),
        HostPart("process baseline", run_base, RUN_PHASES),
        HostPart("pinned blocks", blocks_pinned),
        HostPart("pinned staged masters", masters_pinned),
        HostPart("encoder layer ring arena", layer_ring_arena_bytes(plan)),
        HostPart("bounce ring", rings),
        HostPart("load read buffers", load_buffer_bytes(plan, on_cpu, read_once), ("load",)),
        HostPart("device weights (CPU)", plan.forecast.peak_device_weight_bytes if on_cpu else 0, RUN_PHASES),
        HostPart("decoded output", decoded_output_bytes(request), ("vae_decode",)),
    ]
    parts = [p for p in parts if p.nbytes > 0]
    peaks = {phase: sum(p.nbytes for p in parts if phase in p.phases) for phase in PHASES}
    phase = max(PHASES, key=lambda k: peaks[k])
    notes = () if decoded_output_bytes(request) or request is None else (
        "decoded output not counted: the request's size is the pipeline's default",)
    return HostForecast(peaks, peaks[phase], phase, tuple(parts),
                        "cached" if baseline is not None else "default", notes, live_replan)
