"""The engine against the oracle: plain diffusers without offload, same seed — bit-identical on CPU
for every auxiliary policy × resident_layers in {0, 1, all}; plus lifecycle, faults and events."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_families import FAMILY_GENERATION

from omni_console.engine.engine import Engine, EngineState, EngineStateError
from omni_console.engine.events import LoadProgress, StepTiming
from omni_console.engine.loading.loader import LoadCancelled
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.errors import PolicyError
from omni_console.offload.events import CacheDecision, StagingEvent
from omni_console.offload.pinned import pinned_bytes_held
from omni_console.offload.policy import build_policy


def request_for(family: str, seed: int = 7) -> GenerateRequest:
    gen = dict(FAMILY_GENERATION[family])
    steps = gen.pop("num_inference_steps")
    height, width = gen.pop("height"), gen.pop("width")
    return GenerateRequest(prompt="a red fox in snow", steps=steps, height=height, width=width, seed=seed, extra=gen)


def oracle_image(path: Path, pipeline_cls, request: GenerateRequest) -> np.ndarray:
    """The plain diffusers pipeline, no offload, same seed."""
    pipe = pipeline_cls.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(**request.call_kwargs(pipe))
    return np.asarray(out.images[0])


def pipeline_image(pipe, request: GenerateRequest) -> np.ndarray:
    """A diffusers pipeline's first image (or a video's first frame) for `request`."""
    pipe.set_progress_bar_config(disable=True)
    out = pipe(**request.call_kwargs(pipe))
    return np.asarray(out.images[0] if hasattr(out, "images") else out.frames[0][0])


def policies(aux: list[str], num_blocks: int):
    for flags in itertools.product([True, False], repeat=len(aux)):
        for layers in (0, 1, num_blocks):
            yield dict(zip(aux, flags, strict=True)), layers


@pytest.mark.slow
@pytest.mark.parametrize("family,fixture,pipeline_name", [
    ("flux", "demo_model_dir", "FluxPipeline"),
    ("pixart_sigma", "pixart_model_dir", "PixArtSigmaPipeline"),
])
def test_every_policy_is_bit_identical_to_plain_diffusers(request, family, fixture, pipeline_name):
    import diffusers

    path: Path = request.getfixturevalue(fixture)
    req = request_for(family)
    expected = oracle_image(path, getattr(diffusers, pipeline_name), req)
    engine = Engine(path, device="cpu")
    aux = engine.model.auxiliary_names
    combos = [*policies(aux, engine.model.num_dit_blocks)]
    assert len(combos) == 2 ** len(aux) * 3
    for comps, layers in combos:
        engine.load(build_policy(comps, layers))
        result = engine.generate(req)
        assert np.array_equal(np.asarray(result.image), expected), (comps, layers)
        engine.unload()
    engine.load(build_policy(None, 0, "resident"))  # the baseline mode through the engine too
    assert np.array_equal(np.asarray(engine.generate(req).image), expected)
    engine.close()


def test_events_steps_staging_and_cache(demo_model_dir: Path):
    engine = Engine(demo_model_dir, device="cpu")
    sub = engine.bus.subscribe()
    engine.load(build_policy({"text_encoder": False}, 1))
    assert engine.state == EngineState.READY
    result = engine.generate(request_for("flux"))
    events = sub.drain()
    kinds = Counter(type(e).__name__ for e in events)
    assert [s.step for s in result.steps] == [1, 2]
    assert [e.step for e in events if isinstance(e, StepTiming)] == [1, 2]
    staging = [e for e in events if isinstance(e, StagingEvent)]
    targets = {e.target for e in staging}
    # text_encoder is resident: never staged; the T5 encoder and the VAE are
    assert "text_encoder_2" in targets and "vae" in targets and "text_encoder" not in targets
    # block 0 is resident: never streamed; the others are, with their bytes
    assert "transformer.transformer_blocks.0" not in targets
    assert "transformer.single_transformer_blocks.3" in targets
    assert all(e.nbytes > 0 for e in staging if e.direction == "h2d")
    assert any(isinstance(e, CacheDecision) for e in events)
    progress = [e for e in events if isinstance(e, LoadProgress)]
    assert {p.component for p in progress} >= {"transformer", "vae", "text_encoder"}
    done = {p.component: p for p in progress if p.done_bytes == p.total_bytes}
    assert done["vae"].total_bytes == engine.model.component("vae").nbytes
    assert kinds["RequestStarted"] == kinds["RequestFinished"] == 1
    engine.close()


def test_invalid_policy_fails_before_anything_is_allocated(demo_model_dir: Path):
    engine = Engine(demo_model_dir, device="cpu")
    with pytest.raises(PolicyError, match="DLO always owns DiT offload"):
        engine.load(build_policy({"transformer": False}))
    assert engine.state == EngineState.DISCOVERED and engine.pipe is None
    with pytest.raises(PolicyError, match="between 0 and 6"):
        engine.load(build_policy(None, 7))


@pytest.mark.slow
def test_failure_during_load_releases_and_can_load_again(demo_model_dir: Path, monkeypatch):
    from omni_console.offload import streamer

    engine = Engine(demo_model_dir, device="cpu")
    sub = engine.bus.subscribe()
    baseline = pinned_bytes_held()

    def boom(self):
        raise RuntimeError("injected failure while packing blocks")

    monkeypatch.setattr(streamer.LayerwiseStreamer, "attach", boom)
    with pytest.raises(RuntimeError, match="injected"):
        engine.load(build_policy({}))
    assert engine.state == EngineState.FAILED
    assert "injected failure" in (engine.failure or "")
    assert engine.pipe is None and engine.placement is None
    assert pinned_bytes_held() == baseline
    assert any(getattr(e, "new", None) == "failed" for e in sub.drain())
    monkeypatch.undo()
    engine.load(build_policy({}))
    assert engine.state == EngineState.READY
    engine.close()


def test_cancelled_load_leaves_failed_with_reason(demo_model_dir: Path):
    engine = Engine(demo_model_dir, device="cpu")
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(LoadCancelled):
        engine.load(build_policy({}), cancel)
    assert engine.state == EngineState.FAILED and engine.failure == "load cancelled"


@pytest.mark.slow
def test_state_rules(demo_model_dir: Path):
    engine = Engine(demo_model_dir, device="cpu")
    with pytest.raises(EngineStateError, match="load first"):
        engine.generate(request_for("flux"))
    engine.load(build_policy({}))
    with pytest.raises(EngineStateError, match="unload first"):
        engine.load(build_policy({}))
    engine.unload()
    assert engine.state == EngineState.UNLOADED
    engine.load(build_policy({}))
    engine.close()
    assert engine.state == EngineState.UNLOADED


def test_unload_releases_streamer_and_stagers(demo_model_dir: Path):
    engine = Engine(demo_model_dir, device="cpu")
    engine.load(build_policy({}))
    streamer = engine.placement.streamer
    stagers = list(engine.placement.stagers.values())
    assert streamer.attached and stagers
    engine.unload()
    assert not streamer.attached
    assert all(s.closed for s in stagers)
    assert engine.pipe is None


def test_staged_components_report_the_execution_device():
    """diffusers sends a component's inputs to `component.device`; for a staged component that must
    be the execution device even while its weights rest on the host."""
    from diffusers.utils.torch_utils import get_module_execution_device

    from omni_console.engine.loading import placement as placement_mod

    fake = torch.device("meta")  # any device other than the weights' shows the override
    module = torch.nn.Linear(2, 2)
    undo = placement_mod.report_execution_device(module, fake)
    assert get_module_execution_device(module) == fake and module.weight.device.type == "cpu"
    assert isinstance(module, torch.nn.Linear) and type(module).__name__ == "Linear"
    undo()
    assert type(module) is torch.nn.Linear and get_module_execution_device(module).type == "cpu"


@pytest.mark.slow
@pytest.mark.parametrize("family,fixture,pipeline_name", [
    ("sd3", "sd3_model_dir", "StableDiffusion3Pipeline"),
    ("wan", "wan_model_dir", "WanPipeline"),
])
def test_more_families_match_plain_diffusers(request, family, fixture, pipeline_name, wan_loadable):
    """SD3 (three encoders, a context-only last block) and Wan (video: the first frame is compared)."""
    import diffusers

    path: Path = request.getfixturevalue(fixture)
    req = request_for(family)
    pipe = getattr(diffusers, pipeline_name).from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(**req.call_kwargs(pipe))
    expected = out.images[0] if hasattr(out, "images") else out.frames[0][0]
    engine = Engine(path, device="cpu")
    for comps, layers in (({}, 0), ({"default": False}, 1), ({"vae": False}, engine.model.num_dit_blocks)):
        engine.load(build_policy(comps, layers))
        assert np.array_equal(np.asarray(engine.generate(req).image), np.asarray(expected)), (comps, layers)
        engine.unload()
    engine.close()
