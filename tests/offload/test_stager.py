"""ModuleStager on CPU: host masters keep aliasing, load/offload, OOM retry, failure restore, stage_around."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

from omni_console.offload.cache import AllocatorCache, MemoryReading
from omni_console.offload.events import CacheDecision, EventBus, OomRetry, StagingEvent
from omni_console.offload.staged_calls import stage_around
from omni_console.offload.stager import ModuleStager, default_allocate


class Aux(nn.Module):
    """An encoder/VAE stand-in whose weights alias in every way the stager must preserve."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.enc = nn.Linear(32, 32)
        self.dec = nn.Linear(32, 32)
        self.dec.weight = self.enc.weight  # tied Parameter
        base = torch.randn(200)
        self.a = nn.Parameter(base[0:120].view(10, 12))  # two Parameters that overlap
        self.b = nn.Parameter(base[80:200].view(12, 10))  # in one storage
        self.register_buffer("tview", self.enc.weight.detach().t()[::2])  # strided view of enc.weight
        self.register_buffer("steps", torch.arange(5))  # int64 buffer
        self.scale = nn.Parameter(torch.randn(32, dtype=torch.bfloat16))
        self.depth_seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dec(torch.relu(self.enc(x))) * self.scale.float()
        h = h + self.tview.sum(0)
        h = h + self.a.sum() - self.b[0, 0] + self.steps.float().mean()
        return self.decode(h)

    def decode(self, h: torch.Tensor) -> torch.Tensor:
        return h * 2 + self.b.flatten()[:32].sum()


def aliasing(m: Aux) -> dict[str, bool]:
    w = m.enc.weight
    return {
        "tied": m.dec.weight is m.enc.weight,
        "overlap": m.b.data_ptr() == m.a.data_ptr() + 80 * 4,
        "tview_is_view": m.tview.data_ptr() == w.data_ptr() and m.tview.stride() == (2, 32),
        "overlap_values": torch.equal(m.a.flatten()[80:], m.b.flatten()[:40]),
    }


ALIASED = {"tied": True, "overlap": True, "tview_is_view": True, "overlap_values": True}


def _x() -> torch.Tensor:
    return torch.randn(3, 32, generator=torch.Generator().manual_seed(7))


def _expected() -> torch.Tensor:
    with torch.no_grad():
        return Aux()(_x())


def _out(m: Aux) -> torch.Tensor:
    with torch.no_grad():
        return m(_x())


def _in_arena(stager: ModuleStager, t: torch.Tensor) -> bool:
    arena = stager._arena
    assert arena is not None
    start = arena.tensor.data_ptr()
    return start <= t.data_ptr() < start + arena.nbytes


def _fake_cache(bus: EventBus) -> tuple[AllocatorCache, list[int]]:
    released: list[int] = []
    cache = AllocatorCache(
        "cpu",
        bus=bus,
        read_memory=lambda: MemoryReading(reserved=10, allocated=10, free=900, total=1000),
        empty_cache=lambda: released.append(1),
    )
    return cache, released


def _events(sub, kind):
    return [e for e in sub.drain() if isinstance(e, kind)]


def test_snapshot_moves_every_storage_to_one_master_and_keeps_aliasing():
    m = Aux()
    storages = [weakref.ref(t.untyped_storage()) for t in [*m.parameters(), *m.buffers()]]
    stager = ModuleStager("aux", m, "cpu")
    gc.collect()
    assert all(ref() is None for ref in storages), "an original host storage survived the snapshot"
    assert aliasing(m) == ALIASED
    assert all(_in_arena(stager, t) for t in [*m.parameters(), *m.buffers()])
    assert torch.equal(_out(m), _expected())
    # one master per storage: base(200 f32) + enc.weight + 2 biases + steps + scale
    assert stager.staged_bytes == 200 * 4 + 32 * 32 * 4 + 2 * 32 * 4 + 5 * 8 + 32 * 2
    assert not stager.loaded


def test_load_and_offload_preserve_values_and_aliasing_and_identity():
    m = Aux()
    params = [id(p) for p in m.parameters()]
    stager = ModuleStager("aux", m, "cpu")
    stager.load()
    assert stager.loaded
    assert aliasing(m) == ALIASED
    assert not any(_in_arena(stager, t) for t in [*m.parameters(), *m.buffers()])  # device copies
    assert torch.equal(_out(m), _expected())
    stager.offload()
    assert not stager.loaded
    assert aliasing(m) == ALIASED
    assert all(_in_arena(stager, t) for t in [*m.parameters(), *m.buffers()])  # back on the masters
    assert torch.equal(_out(m), _expected())
    assert [id(p) for p in m.parameters()] == params


def test_load_and_offload_are_idempotent_and_publish_once():
    bus = EventBus()
    sub = bus.subscribe()
    cache, _ = _fake_cache(bus)
    m = Aux()
    stager = ModuleStager("aux", m, "cpu", bus=bus, cache=cache)
    stager.load()
    stager.load()
    stager.offload()
    stager.offload()
    events = sub.drain()
    staging = [e for e in events if isinstance(e, StagingEvent)]
    assert [(e.direction, e.nbytes) for e in staging] == [("h2d", stager.staged_bytes), ("d2h", 0)]
    decisions = [e for e in events if isinstance(e, CacheDecision)]
    assert len(decisions) == 1 and not decisions[0].forced and decisions[0].context == "after offloading aux"


def test_out_of_memory_releases_the_cache_and_retries_exactly_once():
    bus = EventBus()
    sub = bus.subscribe()
    cache, released = _fake_cache(bus)
    m = Aux()
    stager = ModuleStager("aux", m, "cpu", bus=bus, cache=cache)
    calls: list[int] = []

    def flaky(nbytes: int, device: torch.device) -> torch.Tensor:
        calls.append(nbytes)
        if len(calls) == 2:  # second group of the first attempt
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4 KiB")
        return default_allocate(nbytes, device)

    stager.allocate = flaky
    stager.load()
    assert stager.loaded
    groups = len(stager._groups)
    assert len(calls) == 2 + groups  # the failed attempt stopped at its second group; one full retry
    events = sub.drain()
    retries = [e for e in events if isinstance(e, OomRetry)]
    assert len(retries) == 1 and retries[0].attempt == 1 and retries[0].nbytes == stager.staged_bytes
    assert "out of memory" in retries[0].message
    forced = [e for e in events if isinstance(e, CacheDecision) and e.forced]
    assert len(forced) == 1 and forced[0].action == "release" and released == [1]
    assert torch.equal(_out(m), _expected())
    assert aliasing(m) == ALIASED


def test_second_out_of_memory_restores_masters_and_raises():
    bus = EventBus()
    sub = bus.subscribe()
    cache, released = _fake_cache(bus)
    m = Aux()
    stager = ModuleStager("aux", m, "cpu", bus=bus, cache=cache)
    calls: list[int] = []

    def always_oom(nbytes: int, device: torch.device) -> torch.Tensor:
        calls.append(nbytes)
        raise torch.OutOfMemoryError("no memory")

    stager.allocate = always_oom
    with pytest.raises(torch.OutOfMemoryError):
        stager.load()
    assert len(calls) == 2  # first attempt and exactly one retry
    assert not stager.loaded
    assert len(_events(sub, OomRetry)) == 1
    assert released == [1, 1]  # forced release after each failure
    assert all(_in_arena(stager, t) for t in [*m.parameters(), *m.buffers()])
    assert aliasing(m) == ALIASED
    assert torch.equal(_out(m), _expected())
    stager.allocate = default_allocate  # memory came back: loading works again
    stager.load()
    assert torch.equal(_out(m), _expected())


def test_second_out_of_memory_publishes_one_retry_event():
    bus = EventBus()
    sub = bus.subscribe()
    stager = ModuleStager("aux", Aux(), "cpu", bus=bus)

    def always_oom(nbytes: int, device: torch.device) -> torch.Tensor:
        raise torch.OutOfMemoryError("no memory")

    stager.allocate = always_oom
    with pytest.raises(torch.OutOfMemoryError):
        stager.load()
    assert len(_events(sub, OomRetry)) == 1


def test_other_failure_restores_and_reraises_without_retry():
    bus = EventBus()
    sub = bus.subscribe()
    cache, released = _fake_cache(bus)
    m = Aux()
    stager = ModuleStager("aux", m, "cpu", bus=bus, cache=cache)
    calls: list[int] = []

    def broken(nbytes: int, device: torch.device) -> torch.Tensor:
        calls.append(nbytes)
        if len(calls) == 3:
            raise RuntimeError("driver said no")
        return default_allocate(nbytes, device)

    stager.allocate = broken
    with pytest.raises(RuntimeError, match="driver said no"):
        stager.load()
    assert len(calls) == 3 and not stager.loaded
    events = sub.drain()
    assert not [e for e in events if isinstance(e, OomRetry)]
    forced = [e for e in events if isinstance(e, CacheDecision) and e.forced]
    assert len(forced) == 1 and released == [1]
    assert torch.equal(_out(m), _expected())


def test_partial_rebind_with_corrupted_device_copy_is_reverted_to_masters():
    m = Aux()
    stager = ModuleStager("aux", m, "cpu")
    original = stager._point_to
    seen: list[int] = []

    def corrupt_then_fail(group, storage):
        original(group, storage)
        if storage.data_ptr() != group.master.data_ptr():  # a device copy, not the master
            storage.fill_(0)  # garbage in the device copy the module now points at
            seen.append(1)
            if len(seen) == 2:
                raise RuntimeError("rebind failed halfway")

    stager._point_to = corrupt_then_fail
    with pytest.raises(RuntimeError, match="halfway"):
        stager.load()
    stager._point_to = original
    assert not stager.loaded
    assert torch.equal(_out(m), _expected())
    assert aliasing(m) == ALIASED


def test_stage_around_loads_once_for_nested_calls_and_offloads_after():
    bus = EventBus()
    sub = bus.subscribe()
    m = Aux()
    stager = ModuleStager("aux", m, "cpu", bus=bus)
    loaded_inside: list[bool] = []
    decode = m.decode

    def spy_decode(h):
        loaded_inside.append(stager.loaded)
        return decode(h)

    m.decode = spy_decode  # an instance attribute that stage_around must wrap and later restore
    undo = stage_around(stager, m, ("forward", "decode"))
    out = _out(m)  # forward -> decode (nested)
    assert torch.equal(out, _expected())
    assert loaded_inside == [True] and not stager.loaded
    staging = _events(sub, StagingEvent)
    assert [e.direction for e in staging] == ["h2d", "d2h"]
    with torch.no_grad():
        m.decode(torch.zeros(1, 32))  # an outer call to the inner method stages on its own
    assert [e.direction for e in _events(sub, StagingEvent)] == ["h2d", "d2h"]
    undo()
    assert m.decode is spy_decode and "forward" not in vars(m)
    _out(m)
    assert not _events(sub, StagingEvent)  # unwrapped: no staging any more


def test_stage_around_offloads_when_the_call_raises():
    bus = EventBus()
    sub = bus.subscribe()
    m = Aux()
    stager = ModuleStager("aux", m, "cpu", bus=bus)
    loaded_inside: list[bool] = []

    def boom(h):
        loaded_inside.append(stager.loaded)
        raise ValueError("bad latent")

    m.decode = boom
    undo = stage_around(stager, m, ("forward", "decode"))
    for _ in range(2):  # the depth counter recovers: the second call stages again
        with pytest.raises(ValueError, match="bad latent"):
            _out(m)
        assert not stager.loaded
    assert loaded_inside == [True, True]
    assert [e.direction for e in _events(sub, StagingEvent)] == ["h2d", "d2h", "h2d", "d2h"]
    undo()


def test_stage_around_keeps_the_original_error_when_offload_also_fails():
    m = Aux()
    stager = ModuleStager("aux", m, "cpu")

    def bad_forward(x):
        raise KeyError("first")

    m.forward = bad_forward
    stage_around(stager, m, ("forward",))

    def broken_offload():
        raise RuntimeError("second")

    stager.offload = broken_offload
    with pytest.raises(KeyError) as info:
        m.forward(_x())
    assert any("second" in note for note in getattr(info.value, "__notes__", []))


def test_inference_mode_load_keeps_parameters_normal():
    m = Aux()
    stager = ModuleStager("aux", m, "cpu")
    with torch.inference_mode():
        stager.load()
        out = m(_x())
        stager.offload()
    assert torch.equal(out, _expected())
    assert not any(p.is_inference() for p in m.parameters())


def test_close_drops_masters():
    m = Aux()
    stager = ModuleStager("aux", m, "cpu")
    stager.load()
    stager.close()
    stager.close()
    assert stager.closed and not stager.loaded
    with pytest.raises(RuntimeError, match="closed"):
        stager.load()


def test_meta_tensors_are_rejected():
    with torch.device("meta"):
        m = nn.Linear(4, 4)
    with pytest.raises(ValueError, match="weight was never loaded"):
        ModuleStager("aux", m, "cpu")


def _misaligned_copy(module: nn.Module, phase: int) -> None:
    """Re-home every storage of `module` at `phase` modulo a page, as a file mapping may place it."""
    from omni_console.offload.devices import storage_bytes, storage_key

    homes: dict = {}
    for t in [*module.parameters(), *module.buffers()]:
        key = storage_key(t)
        if key not in homes:
            raw = torch.empty(t.untyped_storage().nbytes() + 8192, dtype=torch.uint8)
            start = (phase - raw.data_ptr()) % 4096
            homes[key] = raw[start : start + t.untyped_storage().nbytes()]
            homes[key].copy_(storage_bytes(t))
        home = homes[key]
        view = torch.empty(0, dtype=t.dtype).set_(home.untyped_storage(), home.storage_offset() // t.element_size()
                                                  + t.storage_offset(), t.shape, t.stride())
        t.data = view


@pytest.mark.parametrize("phase", [8, 40, 1656, 4088])
def test_cpu_copies_keep_the_sources_address_phase(phase: int):
    """CPU kernels may choose their path by operand alignment, so a staged copy must sit where the
    plain module's tensor sits modulo a page: then the staged module runs the very same kernels."""
    m = Aux()
    _misaligned_copy(m, phase)
    before = {n: t.data_ptr() % 4096 for n, t in [*m.named_parameters(), *m.named_buffers()]}
    assert set(before.values()) != {0}  # really not page- or cache-line-aligned
    expected = m(_x())
    stager = ModuleStager("aux", m, "cpu", pin=False)
    stager.load()
    during = {n: t.data_ptr() % 4096 for n, t in [*m.named_parameters(), *m.named_buffers()]}
    assert during == before
    assert aliasing(m) == ALIASED
    assert torch.equal(m(_x()), expected)
    stager.offload()
    stager.close()


def test_a_direct_submodule_call_loads_the_component_until_the_next_stage_boundary():
    """SD 1.x's `clip_skip` runs `text_model.final_layer_norm` after the forward returned: with `lazy`, that
    call finds its weights loaded, and they stay loaded until another stage begins or `close`."""
    from omni_console.offload.staged_calls import LazyStages

    bus = EventBus()
    sub = bus.subscribe()
    m, other = Aux(), Aux(seed=1)
    stager, other_stager = ModuleStager("aux", m, "cpu", bus=bus), ModuleStager("other", other, "cpu", bus=bus)
    lazy = LazyStages()
    undo = [stage_around(stager, m, ("forward", "decode"), lazy), stage_around(other_stager, other, ("forward",), lazy)]
    seen: list[bool] = []
    m.enc.register_forward_pre_hook(lambda *_: seen.append(stager.loaded))
    _out(m)  # the wrapped forward: loads, runs, offloads
    assert seen == [True] and not stager.loaded and lazy.open == []
    with torch.no_grad():
        m.enc(_x())  # straight into a submodule
    assert seen == [True, True] and stager.loaded and lazy.open == [stager]
    with torch.no_grad():
        m.enc(_x())  # already loaded: no second load
    assert [e.direction for e in _events(sub, StagingEvent)] == ["h2d", "d2h", "h2d"]
    _out(other)  # another component's stage offloads the lazily loaded one first
    assert not stager.loaded and lazy.open == []
    assert [(e.target, e.direction) for e in _events(sub, StagingEvent)] == [
        ("aux", "d2h"), ("other", "h2d"), ("other", "d2h")]
    with torch.no_grad():
        m.dec(_x())
    lazy.close()
    assert not stager.loaded and lazy.open == []
    _out(m)  # its own stage after a lazy one: loaded once, offloaded once
    assert not stager.loaded
    for remove in undo:
        remove()
    with torch.no_grad():
        m.enc(_x())
    assert not stager.loaded  # unhooked


def test_a_view_buffer_waiting_for_its_file_keeps_its_source_when_unviewed(tmp_path):
    """A block's persistent buffer read later from its file (SANA-WM's `recall_gate`) is a view until the
    streamer un-views it; the new tensor must still be the one that gets the file's bytes."""
    import os

    from omni_console.offload.deferred_weights import DeferredWeights, Source
    from omni_console.offload.devices import unview_buffers

    (tmp_path / "w.bin").write_bytes(torch.tensor([0.25, 4.0]).numpy().tobytes())
    fd = os.open(tmp_path / "w.bin", os.O_RDONLY)
    block = nn.Module()
    block.register_buffer("gate", torch.empty(8)[2:4])  # a view of a larger host allocation
    weights = DeferredWeights()
    weights.own_fd(fd)
    try:
        weights.add(block.gate, Source(fd, 0, 8, torch.float32, (2,)))
        assert unview_buffers(block, weights.replace) == 1
        assert not block.gate._is_view() and weights.knows(block.gate) and weights.pending == 1
        weights.materialize_module(block)
        assert weights.pending == 0 and torch.equal(block.gate, torch.tensor([0.25, 4.0]))
    finally:
        weights.close()
