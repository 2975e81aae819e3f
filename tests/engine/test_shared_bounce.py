"""One bounce ring for the DiT's file-tier blocks and a layer-streamed encoder read from its files.

Each used to keep a ring of its own for the whole run; now the load lends one arena in turn
(offload/bounce_pool.py): the encoder takes it for the text phase, the DiT takes it back for the denoise. What
a user sees: the output is bit-identical to plain diffusers, the process holds one ring (the larger one) and
not both, and the host forecast counts one.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np
import pytest
from tiny_families import write_wide_wan

from omni_console.engine import engine as engine_module
from omni_console.engine.engine import Engine
from omni_console.engine.planning.host_forecast import host_forecast
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.bounce_pool import BouncePool
from omni_console.offload.layer_stage import LayerStage
from omni_console.offload.pinned import HostArena
from omni_console.offload.policy import build_policy
from omni_console.offload.tier_filler import TieredFiller
from omni_console.offload.tiers import HostTiers, Tier

REQUEST = GenerateRequest(prompt="a red fox in the snow", steps=2, height=64, width=64, seed=7, guidance=3.0,
                          output_type="np")


@pytest.fixture(scope="module")
def wide_wan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_wide_wan(tmp_path_factory.mktemp("shared_bounce") / "wan")


def force_tiers(monkeypatch: pytest.MonkeyPatch, block: Tier, component: Tier) -> None:
    """Every plan keeps its streamed blocks in `block` and its staged encoders/VAEs in `component`."""
    make = engine_module.make_plan

    def with_tiers(model, policy, *args, **kwargs):
        plan = make(model, policy, *args, **kwargs)
        staged = tuple((c.info.name, component) for c in plan.components if c.residency == "staged")
        return dataclasses.replace(plan, tiers=HostTiers(blocks=(block,) * len(plan.blocks), components=staged))

    monkeypatch.setattr(engine_module, "make_plan", with_tiers)


def plain_output(path: Path) -> np.ndarray:
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return np.asarray(pipe(**REQUEST.call_kwargs(pipe)).frames[0][0])


@pytest.mark.parametrize("tier", ["page_cache", "disk"])
def test_dit_and_encoder_share_one_ring_and_match_plain_diffusers(wide_wan: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  tier: Tier) -> None:
    expected = plain_output(wide_wan)
    force_tiers(monkeypatch, tier, tier)
    arenas: list[tuple[str, int, int]] = []  # (who, arena id, bytes) at each hand-over
    real_acquire = BouncePool.acquire

    def acquire(self: BouncePool, holder, nbytes: int, **kwargs) -> HostArena:
        arena = real_acquire(self, holder, nbytes, **kwargs)
        arenas.append((holder.who, id(arena), arena.nbytes))
        return arena

    monkeypatch.setattr(BouncePool, "acquire", acquire)
    real_init = TieredFiller.__init__

    def init(self: TieredFiller, *args, **kwargs) -> None:
        real_init(self, *args, **kwargs)
        self.who = "encoder" if any(".layers" in n for n in self.tiers) else "dit"

    monkeypatch.setattr(TieredFiller, "__init__", init)
    engine = Engine(wide_wan, device="cpu")
    try:
        engine.load(build_policy({}, 0, stream_encoders="on"))
        stage = engine.placement.stagers["text_encoder"]
        assert isinstance(stage, LayerStage) and isinstance(stage.ring.filler, TieredFiller)
        streamer = engine.placement.streamer
        assert streamer is not None and streamer.bounce_bytes > 0  # after the load the DiT holds the ring
        assert stage.ring.bounce_bytes == 0  # the idle encoder holds none
        first = engine.generate(REQUEST, threading.Event())
        second = engine.generate(REQUEST, threading.Event())
    finally:
        engine.close()
    for result in (first, second):
        got = np.asarray(result.image)[None]
        assert np.array_equal(got.reshape(expected.shape), expected)
    who = [w for w, _, _ in arenas]
    assert "encoder" in who and "dit" in who
    # the text phase of each request takes the ring from the DiT, and the DiT takes it back to denoise
    hand_overs = [b for a, b in zip(who, who[1:], strict=False) if a != b]
    assert hand_overs.count("dit") >= 2 and hand_overs.count("encoder") >= 2, who
    # one arena all along, as large as the larger ring: never one for each
    assert len({i for _, i, _ in arenas}) == 1, arenas
    assert len({n for _, _, n in arenas}) == 1


def test_forecast_counts_one_ring_for_both(wide_wan: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    force_tiers(monkeypatch, "disk", "disk")
    engine = Engine(wide_wan, device="cpu")
    try:
        engine.load(build_policy({}, 0, stream_encoders="on"))
        plan = engine.plan
        ring = host_forecast(plan, on_cpu=True).part("bounce ring")
        pool = engine.placement.bounce_pool
        assert pool.arena is not None
        staged_rings = sum(s.stager.ring_bytes for s in engine.placement.stagers.values() if isinstance(s, LayerStage))
        # the shared arena and the non-layer weights' own (transient) ring are all the forecast names
        assert pool.arena.nbytes + staged_rings <= ring
        stage = engine.placement.stagers["text_encoder"]
        dit_ring = engine.placement.streamer.bounce_bytes
        encoder_ring = 4 * max(fb.slot_bytes for fb in stage.ring.filler._blocks.values())
        assert ring < dit_ring + encoder_ring + staged_rings  # less than a ring each
    finally:
        engine.close()
