"""Live re-plan: a loaded model takes another policy between requests, from its pinned masters, and
every output after any sequence of re-plans is bit-identical to plain diffusers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tiny_families import FAMILY_GENERATION

from omni_console.engine.engine import Engine, EngineStateError
from omni_console.engine.events import Replanned
from omni_console.engine.options import EngineOptions
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.errors import PolicyError
from omni_console.offload.events import EventBus
from omni_console.offload.policy import build_policy


def _request() -> GenerateRequest:
    gen = dict(FAMILY_GENERATION["flux"])
    steps, height, width = gen.pop("num_inference_steps"), gen.pop("height"), gen.pop("width")
    return GenerateRequest(prompt="a red fox in snow", steps=steps, height=height, width=width, seed=5, extra=gen)


@pytest.fixture(scope="module")
def plain_output(demo_model_dir: Path) -> np.ndarray:
    import diffusers

    pipe = diffusers.FluxPipeline.from_pretrained(demo_model_dir, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return np.asarray(pipe(**_request().call_kwargs(pipe)).images[0])


SEQUENCE = [
    build_policy({}, 0),
    build_policy({"text_encoder": False}, 3, "dlo", "spread", 3),
    build_policy({"default": False}, 6),
    build_policy({"vae": False, "default": True}, 2, "dlo", "leading", 4),
    build_policy({}, 0),
]


@pytest.mark.slow
def test_any_sequence_of_replans_stays_bit_identical_and_moves_only_what_changes(demo_model_dir, plain_output):
    bus = EventBus()
    sub = bus.subscribe()
    engine = Engine(demo_model_dir, device="cpu", bus=bus, options=EngineOptions(live_replan=True))
    try:
        engine.load(SEQUENCE[0])
        assert np.array_equal(np.asarray(engine.generate(_request()).image), plain_output)
        pinned_all = engine.placement.streamer.host_bytes
        for policy in SEQUENCE[1:]:
            event = engine.replan(policy)
            assert engine.plan.policy == policy
            streamer = engine.placement.streamer
            assert streamer.residency == engine.plan.residency
            assert streamer.host_bytes == pinned_all  # no repacking, nothing read from disk
            for c in engine.plan.components:
                stager = engine.placement.stagers.get(c.info.name)
                if stager is not None:
                    assert stager.held == (c.residency == "resident")
            assert isinstance(event, Replanned) and event.seconds >= 0
            assert np.array_equal(np.asarray(engine.generate(_request()).image), plain_output)
        events = [e for e in sub.drain() if isinstance(e, Replanned)]
        assert len(events) == len(SEQUENCE) - 1
        # 6 resident → 2 resident: nothing is copied for the DiT, four blocks are freed
        assert events[2].freed_bytes > 0
        assert "re-plan:" in events[0].summary and "spread" in events[0].summary
    finally:
        engine.close()


@pytest.mark.slow
def test_replan_needs_a_live_load_the_same_mode_and_a_ready_engine(demo_model_dir):
    engine = Engine(demo_model_dir, device="cpu")
    try:
        with pytest.raises(EngineStateError, match="load first"):
            engine.replan(build_policy({}, 1))
        engine.load(build_policy({}, 0))
        with pytest.raises(EngineStateError, match="without live re-plan"):
            engine.replan(build_policy({}, 1))
    finally:
        engine.close()
    live = Engine(demo_model_dir, device="cpu", options=EngineOptions(live_replan=True))
    try:
        live.load(build_policy({}, 0))
        with pytest.raises(PolicyError, match="new load"):
            live.replan(build_policy(None, 0, "resident"))
        with pytest.raises(PolicyError, match="between 0 and 6"):
            live.replan(build_policy({}, 9))
        assert live.plan.policy == build_policy({}, 0)  # a refused re-plan changes nothing
    finally:
        live.close()


@pytest.mark.slow
def test_a_live_load_keeps_what_the_forecast_says_whatever_the_policy(demo_model_dir):
    for policy in (build_policy({}, 0), build_policy({"default": False}, 6)):
        engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(live_replan=True))
        try:
            engine.load(policy)
            placement = engine.placement
            held = placement.streamer.host_bytes + sum(s.staged_bytes for s in placement.stagers.values())
            forecast = engine.plan.forecast.pinned_host_bytes_live
            # the forecast packs at 256 bytes; on a CPU each weight read from its file also keeps the file's
            # page phase (offload/address_phase.py): up to one page more per tensor and per block region
            pages = 4096 * (sum(1 for _ in engine.pipe.transformer.parameters()) + len(engine.plan.blocks))
            assert forecast * 0.99 <= held <= forecast + pages
            assert forecast > engine.plan.forecast.pinned_host_bytes or policy.resident_layers == 0
        finally:
            engine.close()
