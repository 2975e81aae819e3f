"""A staged component whose layer list streams layer by layer: a text encoder on a small budget.

Staged whole (offload/stager.py), a T5-XXL-size encoder puts all its layers on the device for the
text phase. Here only its non-layer weights (embeddings, final norm) are staged by a `ModuleStager`,
and its layers stream through the DiT's own machinery, a `LayerwiseStreamer` ring of 2 slots: the
phase holds the non-layer weights, two layers and the activations. The ring's slots exist only
during the stage (opened by `load`, freed by `offload`), so between prompts the device holds nothing
of the encoder. The same weights run through the same kernels: outputs are bit-identical to the
staged (and the plain) encoder.

Host memory: the layers' bytes are held once. Where the encoder was built over one host arena
(engine/loading/arena_load.py, page-locked), the ring reads each layer from its range of that arena in
place (offload/in_place_filler.py) and the stager keeps the non-layer weights there too; otherwise the
layers are copied into the ring's arena (page-locked on CUDA) and their original tensors dropped.

`LayerStage` has the stager's interface (`load`, `offload`, `hold`, `close`, `held`, byte counts), so
`stage_around` and the placement's bookkeeping use it unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .cache import AllocatorCache
from .deferred_weights import DeferredWeights
from .events import EventBus
from .file_stager import FileStager
from .in_place_filler import InPlaceFiller
from .options import DEFAULT_LOAD, LoadOptions
from .residency import BlockResidency
from .stager import ModuleStager
from .streamer import LayerwiseStreamer
from .tier_filler import TieredFiller
from .tiers import Tier

SLOTS = 2


class StageRing(LayerwiseStreamer):
    """A streamer whose ring's slots are allocated only between `open` and `shut` (one stage)."""

    is_open = False

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        if not isinstance(self.filler, TieredFiller):  # layers read from their files keep the tiered filler
            self.filler = InPlaceFiller(self.device, self._ledger, self._load_options)

    @property
    def in_place(self) -> bool:
        """The layers are read from the host storage they were built in (no copy of them held)."""
        return isinstance(self.filler, InPlaceFiller) and self.filler.in_place

    def attach(self) -> None:
        super().attach()
        if self._streamed:
            self._clear_ring()  # no slots until the stage: the idle encoder holds no device memory
        self._park()
        self.is_open = False

    def _park(self) -> None:
        """Between stages a shared bounce ring goes back to the reader that lent it (the DiT's)."""
        if isinstance(self.filler, TieredFiller):
            self.filler.park()

    def open(self) -> None:
        """Allocate the slots and copy the first layers (the stage begins)."""
        if not self.is_open and self._streamed:
            assert self.ring is not None
            self.ring.open(self.residency.slots)
        self.is_open = True

    def shut(self) -> None:
        """Wait for the copies, unbind the layers and free the slots (the stage ends)."""
        if self.is_open and self._streamed:
            self._clear_ring()
        self._park()
        self.is_open = False


class LayerStage:
    """One component: its non-layer weights staged, its `layers` streamed (see the module docstring)."""

    def __init__(self, name: str, module: torch.nn.Module, layers: Sequence[torch.nn.Module],
                 device: torch.device | str, *, bus: EventBus | None = None, cache: AllocatorCache | None = None,
                 pin: bool = True, load_options: LoadOptions = DEFAULT_LOAD, tier: Tier = "pinned",
                 files: DeferredWeights | None = None, log: Callable[[str], None] = lambda _line: None) -> None:
        """`tier` page_cache or disk (with `files`, the tensors' sources: engine/loading/file_sources.py): the
        layers are read from their files into the ring's slots (offload/tier_filler.py) and the rest at each
        stage (offload/file_stager.py); nothing of the encoder stays in host memory."""
        self.name = name
        self.num_layers = len(layers)
        in_files = tier != "pinned" and files is not None
        # the ring first: where it reads the layers in place, the stager keeps the rest in place too
        self.ring = StageRing([(f"{name}.layers", list(layers))], device,
                              residency=BlockResidency.leading(len(layers), 0, SLOTS), bus=bus, pin=pin,
                              load_options=load_options, weights=files if in_files else None,
                              tiers=(tier,) * len(layers) if in_files else ())
        self.ring.attach()
        try:
            if in_files:
                assert files is not None
                self.stager: ModuleStager = FileStager(name, module, device, tier=tier, weights=files, log=log,
                                                       bus=bus, cache=cache, pin=pin, exclude=layers,
                                                       huge_pages=load_options.use_huge_pages)
            else:
                self.stager = ModuleStager(name, module, device, bus=bus, cache=cache, pin=pin, exclude=layers,
                                           huge_pages=load_options.use_huge_pages, in_place=self.ring.in_place)
        except BaseException:
            self.ring.detach()
            raise
        self.changed = self.stager.changed  # the stage is loaded exactly when its stager is

    @property
    def held(self) -> bool:
        return False  # never resident: a resident encoder is not streamed

    @property
    def loaded(self) -> bool:
        return self.stager.loaded

    @property
    def staged_bytes(self) -> int:
        """Bytes one stage moves: the non-layer weights and every layer once."""
        return self.stager.staged_bytes + self.ring.streamed_bytes

    @property
    def device_bytes(self) -> int:
        """Bytes on the device during the stage: the non-layer weights and the ring's slots."""
        return self.stager.staged_bytes + SLOTS * self.ring.largest_block_bytes

    @property
    def pinned_bytes(self) -> int:
        return self.stager.pinned_bytes + self.ring.pinned_bytes

    def host_storages(self) -> dict[int, int]:
        """{address: bytes} of the host storages the non-layer masters and the ring's layers keep alive."""
        held = self.stager.host_storages()
        arena = self.ring.filler.arena
        if arena is not None and not arena.closed:
            held[arena.tensor.data_ptr()] = arena.tensor.untyped_storage().nbytes()
        return held

    @property
    def closed(self) -> bool:
        return self.stager.closed

    def load(self) -> None:
        self.stager.load()
        try:
            self.ring.open()
        except BaseException:
            self.stager.offload()
            raise

    def offload(self) -> None:
        try:
            self.ring.shut()
        finally:
            self.stager.offload()

    def hold(self, on: bool) -> int:
        if on:
            raise RuntimeError(f"{self.name} streams layer by layer: it cannot be held resident")
        return 0

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.offload()
        finally:
            self.ring.detach()
            self.stager.close()
