"""`EngineOptions`: every load and stream switch of an `Engine`, one frozen value passed down.

In the style of diffusers' `GroupOffloadingConfig`: the engine takes it whole
(`Engine(path, device=..., options=EngineOptions(...))`) and hands each layer its part explicitly —
the loader its reader and arena choices, placement the streamer's and stagers' `LoadOptions`, an
AllGather rank's streamer its `StreamOptions` (both `offload.options`, since offload never imports
engine). No module holds a switch that is read at call time: a benchmark or a test that measures a
variant builds other options (`dataclasses.replace(options, ...)`) instead of patching a module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..offload.options import LoadOptions, StreamOptions

if TYPE_CHECKING:
    from ..offload.pinned import PageLocker


@dataclass(frozen=True)
class EngineOptions:
    """How an `Engine` loads and streams; the defaults are what the console and `run` use."""

    pin: bool = True
    """Page-lock the host masters (block arena, stagers); CUDA only."""
    loras: tuple[tuple[str, float], ...] = ()
    """`--lora PATH[:SCALE]` files, in order (engine/loading/lora_files.py checks them when the engine opens)."""
    lora_mode: str = "sidecar"
    """How they apply: `sidecar` (A/B on the device, PEFT's forward), `merge` (into each block's slot on
    upload), `auto` (engine/loading/lora_apply.py)."""
    live_replan: bool = False
    """Keep pinned masters of everything a re-plan may move (host memory = the whole model), so that
    `Engine.replan` can change the policy between requests."""
    direct_read: bool = True
    """DiT weights read straight into place, in parallel (`engine.loading.direct_load`)."""
    read_threads: int | None = None
    """Readers of the one reader pool (None: `offload.deferred_weights`' default)."""
    aux_in_place: bool | None = None
    """Encoders and VAEs read in parallel into arenas and built beside the DiTs' reads (None: on CUDA
    only: on a CPU the library's own loader keeps the addresses `offload.address_phase` needs). Needs
    `direct_read`."""
    share_readers: bool = True
    """The DiT's blocks and the other components read on one pool: 16 readers, not 16 per component,
    and the encoders' reads queue between the DiT's batches, so they finish early instead of last
    (measured on one H200: Flux-size warm loads at 1.02-1.06x the read floor, against 1.07-1.19x with
    16 readers each)."""
    dit_in_arena: bool = True
    """A DiT's weights as views into one arena that is never written where its blocks are (they are
    read into the streamer's arena): one mapping, where a thousand empty tensors made a thousand, each
    one then unmapped while the blocks' reads fault pages in (with `aux_in_place` only)."""
    batch_bytes: int = LoadOptions.batch_bytes
    """Blocks read per batch before it is handed to the registering threads (`offload.arena_fill`)."""
    read_ahead_batches: int | None = LoadOptions.read_ahead_batches
    """Batches of blocks queued beyond the one being finished (None: all)."""
    register_threads: int = LoadOptions.register_threads
    """Threads page-locking the blocks' batches as they land."""
    use_huge_pages: bool = LoadOptions.use_huge_pages
    """Large host arenas advised to use transparent huge pages (`offload.pinned`)."""
    page_locker: PageLocker | None = None
    """What page-locks the streamed blocks (None: CUDA's `cudaHostRegister`); a test's double refuses part
    way to check the fallback to the page cache (`offload.pin_fallback`)."""
    shard_buffers: int = StreamOptions.shard_buffers
    """AllGather: shard buffers a rank cycles through (`offload.allgather_streamer`)."""
    gather_in_place: bool = StreamOptions.gather_in_place
    """AllGather: each rank's shard copied into its place in the slot and gathered in place."""
    comm_priority: int = StreamOptions.comm_priority
    """AllGather: the gathers' CUDA stream priority (0: as compute; -1: ahead of compute's kernels)."""
    lean_decode: Callable[[Any], str | None] | None = None
    """For a VAE decode that ran out of device memory with nothing left to move (`running.oom_guard`):
    given the pipeline, switch its VAE to a leaner decode (tiled or sliced) and say what changed (a note
    that tiling changes pixels belongs there), or None when it has none. None: no leaner decode is tried."""
    step_previews: bool = False
    """Publish each denoise step's latent, small, as a `StepPreview` (the console's step preview; `run`: off)."""
    preview_decoder: str | None = None
    """`--preview-decoder PATH`: a TAESD-style decoder's safetensors (checked when the engine opens); step
    previews are then its decoded pictures instead of the latent→RGB factors'."""
    compile: str = "off"
    """`--compile off|regional|auto`: the denoisers' repeated blocks compiled with `torch.compile`, their streaming
    hooks left outside the graphs (offload/block_compile.py; auto: engine/planning/compile_choice.py)."""
    compile_backend: str = "inductor"
    """`torch.compile`'s backend for `compile` (tests and CPU smoke runs: "eager" or "aot_eager")."""

    def __post_init__(self) -> None:
        if self.read_threads is not None and self.read_threads < 1:
            raise ValueError(f"read_threads must be >= 1 or None, got {self.read_threads}")
        if self.compile not in ("off", "regional", "auto"):
            raise ValueError(f"compile must be off, regional or auto, got {self.compile!r}")
        self.load_options  # noqa: B018  (their own checks, at construction)
        self.stream_options  # noqa: B018

    @property
    def load_options(self) -> LoadOptions:
        """The part the offload layer's arenas, fills and stagers take."""
        return LoadOptions(batch_bytes=self.batch_bytes, read_ahead_batches=self.read_ahead_batches,
                           register_threads=self.register_threads, use_huge_pages=self.use_huge_pages,
                           page_locker=self.page_locker)

    @property
    def stream_options(self) -> StreamOptions:
        """The part an AllGather rank's streamer takes."""
        return StreamOptions(shard_buffers=self.shard_buffers, gather_in_place=self.gather_in_place,
                             comm_priority=self.comm_priority)
