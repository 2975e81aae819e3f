"""`EngineOptions` is a frozen value, and each of its switches reaches the place that uses it: the
engine's readers, the loader, placement, the arena fill, the host arenas and an AllGather streamer.
A load with a switch off behaves as the load did with the old module global flipped."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from omni_console.engine import engine as engine_module
from omni_console.engine.engine import Engine
from omni_console.engine.loading import loader
from omni_console.engine.options import EngineOptions
from omni_console.offload import arena_fill, pinned
from omni_console.offload.deferred_weights import DeferredWeights
from omni_console.offload.options import LoadOptions, StreamOptions
from omni_console.offload.policy import build_policy
from omni_console.offload.streamer import LayerwiseStreamer

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "offload"))


# ------------------------------------------------------------------ the value itself
@pytest.mark.parametrize("options", [EngineOptions(), LoadOptions(), StreamOptions()])
def test_options_are_frozen(options: Any) -> None:
    field = dataclasses.fields(options)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(options, field, getattr(options, field))


def test_defaults_are_todays_switches() -> None:
    o = EngineOptions()
    assert (o.pin, o.live_replan, o.direct_read, o.read_threads, o.aux_in_place) == (True, False, True, None, None)
    assert (o.share_readers, o.dit_in_arena) == (True, True)
    assert o.load_options == LoadOptions(batch_bytes=2 << 30, read_ahead_batches=1, register_threads=4,
                                         use_huge_pages=True)
    assert o.stream_options == StreamOptions(shard_buffers=2, gather_in_place=False, comm_priority=0)


def test_the_offload_parts_carry_the_engine_values() -> None:
    o = EngineOptions(batch_bytes=7, read_ahead_batches=None, register_threads=2, use_huge_pages=False,
                      shard_buffers=3, gather_in_place=True, comm_priority=-1)
    assert o.load_options == LoadOptions(7, None, 2, False)
    assert o.stream_options == StreamOptions(3, True, -1)


@pytest.mark.parametrize("bad", [{"batch_bytes": 0}, {"read_ahead_batches": -1}, {"register_threads": 0},
                                 {"shard_buffers": 0}, {"read_threads": 0}])
def test_impossible_values_are_refused_when_built(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        EngineOptions(**bad)


def test_the_module_globals_are_gone() -> None:
    """Nothing is left to patch: a switch lives only in the options."""
    from omni_console.offload import sharding

    for module, names in ((loader, ("SHARE_READERS", "DIT_IN_ARENA")),
                          (arena_fill, ("BATCH_BYTES", "READ_AHEAD_BATCHES", "REGISTER_THREADS")),
                          (pinned, ("USE_HUGE_PAGES",)),
                          (sharding, ("SHARD_BUFFERS", "GATHER_IN_PLACE", "COMM_PRIORITY"))):
        assert not [n for n in names if hasattr(module, n)], module.__name__


# ------------------------------------------------------------------ where each switch lands
def _spy_readers(monkeypatch: pytest.MonkeyPatch) -> list[DeferredWeights]:
    made: list[DeferredWeights] = []

    class Recorded(DeferredWeights):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.one_pool = self._shared is not None  # (closed with the load's end)
            made.append(self)

    monkeypatch.setattr(engine_module, "DeferredWeights", Recorded)
    return made


@pytest.mark.slow
def test_readers_and_placement_follow_the_options(demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _spy_readers(monkeypatch)
    fills: list[LoadOptions] = []
    fill = arena_fill.fill

    def noted_fill(*args: Any, options: LoadOptions = arena_fill.DEFAULT_LOAD, **kwargs: Any) -> None:
        fills.append(options)
        fill(*args, options=options, **kwargs)

    monkeypatch.setattr(arena_fill, "fill", noted_fill)
    options = EngineOptions(read_threads=3, share_readers=False, live_replan=True, batch_bytes=1,
                            read_ahead_batches=None, register_threads=2)
    engine = Engine(demo_model_dir, device="cpu", options=options)
    try:
        engine.load(build_policy({}, 0))
        assert len(made) == 1 and made[0].threads == 3 and not made[0].one_pool  # readers of its own each
        assert engine.placement is not None and engine.placement.live and engine.live_replan
        assert fills == [LoadOptions(batch_bytes=1, read_ahead_batches=None, register_threads=2)]
    finally:
        engine.close()
    shared = Engine(demo_model_dir, device="cpu")
    try:
        shared.load(build_policy({}, 0))
        assert made[-1].one_pool  # the default: one pool for every component
        assert shared.placement is not None and not shared.placement.live
    finally:
        shared.close()


def test_no_direct_read_makes_no_reader(demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _spy_readers(monkeypatch)
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(direct_read=False, aux_in_place=True))
    try:
        assert engine.options.aux_in_place is False  # needs direct reads
        engine.load(build_policy({}, 0))
        assert made == []
    finally:
        engine.close()


def test_aux_in_place_is_resolved_for_the_device(demo_model_dir: Path) -> None:
    assert Engine(demo_model_dir, device="cpu").options.aux_in_place is False  # CPU: the library's own order
    assert Engine(demo_model_dir, device="cpu", options=EngineOptions(aux_in_place=True)).options.aux_in_place


@pytest.mark.slow
@pytest.mark.parametrize("dit_in_arena", [True, False])
def test_dit_in_arena_decides_how_the_dit_is_built(demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                   dit_in_arena: bool) -> None:
    import diffusers
    from test_engine import oracle_image, request_for

    in_arena: list[str] = []
    build = loader.build_deferred_in_arena

    def noted(info: Any, *args: Any) -> Any:
        in_arena.append(info.role)
        return build(info, *args)

    monkeypatch.setattr(loader, "build_deferred_in_arena", noted)
    req = request_for("flux")
    expected = oracle_image(demo_model_dir, diffusers.FluxPipeline, req)
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(aux_in_place=True, dit_in_arena=dit_in_arena))
    try:
        engine.load(build_policy({"text_encoder": False}, 1))
        assert ("dit" in in_arena) is dit_in_arena
        assert np.array_equal(np.asarray(engine.generate(req).image), expected)
    finally:
        engine.close()


@pytest.mark.slow
@pytest.mark.parametrize("aux", [True, False])
@pytest.mark.parametrize("huge", [True, False])
def test_use_huge_pages_reaches_every_arena_of_a_load(demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                     huge: bool, aux: bool) -> None:
    """The streamer's block arena and the components read into arenas (`aux`), or the stagers' masters."""
    asked: list[tuple[int, bool]] = []
    buffer = pinned._page_aligned_buffer

    def noted(nbytes: int, huge_pages: bool = True) -> Any:
        asked.append((nbytes, huge_pages))
        return buffer(nbytes, huge_pages)

    monkeypatch.setattr(pinned, "_page_aligned_buffer", noted)
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(aux_in_place=aux, use_huge_pages=huge))
    try:
        engine.load(build_policy({}, 0))
        assert len(asked) >= 3  # the block arena, the encoders' and the VAE's (read into arenas or staged)
        assert all(h is huge for _, h in asked)
    finally:
        engine.close()


def test_stream_options_reach_an_allgather_streamer(demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An AllGather rank's engine hands its gathers' options to the streamer (a one-process stand-in here)."""
    from omni_console.offload import allgather_streamer

    got: list[tuple[Any, StreamOptions]] = []

    class StandIn(LayerwiseStreamer):
        def __init__(self, *args: Any, group: Any, stream_options: StreamOptions, **kwargs: Any) -> None:
            got.append((group, stream_options))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(allgather_streamer, "AllGatherStreamer", StandIn)
    group = object()
    options = EngineOptions(shard_buffers=3, gather_in_place=True, comm_priority=-1)
    engine = Engine(demo_model_dir, device="cpu", options=options, group=group)
    try:
        engine.load(build_policy({}, 0))
        assert got == [(group, StreamOptions(shard_buffers=3, gather_in_place=True, comm_priority=-1))]
    finally:
        engine.close()


def test_an_allgather_streamer_keeps_its_stream_options(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist
    from offload_toy_models import ToyModel  # tests/offload

    from omni_console.offload.allgather_streamer import AllGatherStreamer

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 1)  # no process group to read the knobs back
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    s = AllGatherStreamer(ToyModel(2, 8).block_lists(), "cpu", resident_layers=0, group=None,
                          stream_options=StreamOptions(shard_buffers=3, gather_in_place=True, comm_priority=-1))
    assert (s.filler._buffers, s.filler._in_place, s.filler._comm_priority) == (3, True, -1)


def test_batch_bytes_sets_the_batches() -> None:
    class B:
        def __init__(self, n: int) -> None:
            self.region_nbytes = n

    blocks: list[Any] = [B(3) for _ in range(4)]
    assert [len(b) for b in arena_fill.batches(blocks, 1)] == [1, 1, 1, 1]
    assert [len(b) for b in arena_fill.batches(blocks, 6)] == [2, 2]
    assert [len(b) for b in arena_fill.batches(blocks, LoadOptions().batch_bytes)] == [4]


def test_a_group_engine_hands_its_options_to_every_rank(demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from omni_console.engine.errors import ConfigError
    from omni_console.engine.ranks import group_engine
    from omni_console.engine.ranks.rank_layout import RankLayout
    from omni_console.engine.ranks.rank_process import RankSpec

    started: list[EngineOptions | None] = []

    class NoRanks:  # the group's start, without processes
        def __init__(self, *args: Any, options: EngineOptions | None = None, **kwargs: Any) -> None:
            started.append(options)

    monkeypatch.setattr(group_engine, "RankGroup", NoRanks)
    options = EngineOptions(use_huge_pages=False, shard_buffers=3)
    engine = group_engine.GroupEngine(demo_model_dir, RankLayout(2, True), device_kind="cpu", telemetry_hz=None,
                                      options=options)
    engine._start_group(None)
    assert started == [options]
    assert RankSpec(demo_model_dir, "cpu", True, options=options).options is options  # what crosses the spawn
    with pytest.raises(ConfigError, match="one GPU"):
        group_engine.GroupEngine(demo_model_dir, RankLayout(2, True), device_kind="cpu",
                                 options=EngineOptions(live_replan=True))
