"""No out-of-memory error ends a request: at each phase an injected `torch.OutOfMemoryError` is met by a
released cache, a stepped-down policy and one retry of that phase's call, with the output of an
unfaulted run at the stepped-down policy; a second one ends the request with memory released."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
import torch

from omni_console.engine.engine import Engine, EngineState
from omni_console.engine.events import OomStepDown, Replanned
from omni_console.engine.options import EngineOptions
from omni_console.engine.running.oom_guard import device_weights, lower_policy
from omni_console.engine.running.runner import GenerateRequest, cancel_points
from omni_console.offload.pinned import pinned_bytes_held
from omni_console.offload.policy import build_policy

REQUEST = GenerateRequest(prompt="a red fox", steps=2, height=64, width=64, seed=5,
                          extra={"max_sequence_length": 32})
POLICY = build_policy({"vae": False}, 4, prefetch_slots=3)  # 4 resident blocks, a 3-slot ring, the VAE resident
_CLEAN: dict[tuple[str, str], np.ndarray] = {}
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda,
                                             pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])]


def clean_image(model: Path, policy, device: str = "cpu") -> np.ndarray:
    """An unfaulted run's image at `policy` (cached per policy)."""
    key = (policy.model_dump_json(), device)
    if key not in _CLEAN:
        engine = Engine(model, device=device)
        engine.load(policy)
        _CLEAN[key] = np.asarray(engine.generate(REQUEST).image)
        engine.close()
    return _CLEAN[key]


def same_image(a: np.ndarray, b: np.ndarray, device: str) -> bool:
    """Bit-identical on a CPU; on a GPU within one 8-bit level (kernels may pick other algorithms)."""
    if device == "cpu":
        return np.array_equal(a, b)
    return int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max()) <= 1


def level(device: str = "cpu") -> tuple[int, int]:
    """(device bytes allocated, pinned host bytes) after collecting garbage."""
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated(), pinned_bytes_held()
    return 0, pinned_bytes_held()


class OomAt:
    """A forward pre-hook raising `torch.OutOfMemoryError` at its `at`-th call (and later ones while `times` lasts)."""

    def __init__(self, module: torch.nn.Module, at: int, times: int = 1) -> None:
        self.calls, self.at, self.times, self.raised = 0, at, times, 0
        self.handle = module.register_forward_pre_hook(self, prepend=True)

    def __call__(self, *_args) -> None:
        self.calls += 1
        if self.calls >= self.at and self.raised < self.times:
            self.raised += 1
            raise torch.OutOfMemoryError(f"injected: CUDA out of memory at call {self.calls}\nsecond line")


def inside(engine: Engine, phase: str) -> torch.nn.Module:
    """A module inside the phase's call: an encoder layer, a streamed DiT block mid-forward, a VAE decoder block."""
    pipe = engine.pipe
    if phase == "text_encoding":
        return cancel_points([pipe.text_encoder_2])[1]
    if phase == "denoise":
        return pipe.transformer.single_transformer_blocks[1]
    return cancel_points([pipe.vae.decoder])[0]


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("phase", "at"), [("text_encoding", 1), ("denoise", 2), ("vae_decode", 1)])
def test_an_oom_in_each_phase_steps_down_retries_once_and_matches_an_unfaulted_run(
        demo_model_dir: Path, phase: str, at: int, device: str):
    engine = Engine(demo_model_dir, device=device, options=EngineOptions(live_replan=True))
    engine.load(POLICY)
    if device == "cuda":
        engine.generate(REQUEST)  # the scheduler keeps its tensors on the device between requests
    sub = engine.bus.subscribe()
    before = level(device)
    fault = OomAt(inside(engine, phase), at)
    result = engine.generate(REQUEST)
    fault.handle.remove()
    assert fault.raised == 1 and engine.state == EngineState.READY
    events = [e for e in sub.drain() if isinstance(e, OomStepDown | Replanned)]
    assert [type(e) for e in events] == [Replanned, OomStepDown]  # moved first, then said, then retried
    assert result.oom_step_downs and result.oom_step_downs[0].phase == phase
    assert result.oom_step_downs[0].message == f"injected: CUDA out of memory at call {at}"
    stepped = engine.plan.policy
    expected = 0 if phase == "vae_decode" else 2  # the decode drops every resident block; others half
    assert engine.plan.residency.num_resident == expected
    assert f"resident blocks 4→{expected}" in result.oom_step_downs[0].action
    assert same_image(np.asarray(result.image), clean_image(demo_model_dir, stepped, device), device)
    after = level(device)
    # the failed call's memory was released; the stepped-down policy holds fewer resident blocks
    assert after[1] == before[1] and after[0] <= before[0]
    engine.close()


@pytest.mark.slow
def test_a_second_oom_in_the_phase_ends_the_request_with_one_line_and_memory_released(demo_model_dir: Path):
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(live_replan=True))
    engine.load(POLICY)
    before = level()
    fault = OomAt(engine.pipe.transformer.single_transformer_blocks[1], 1, times=2)
    with pytest.raises(torch.OutOfMemoryError) as err:
        engine.generate(REQUEST)
    fault.handle.remove()
    text = str(err.value)
    assert "\n" not in text and text.startswith("out of device memory again in denoise (transformer) after "
                                                 "stepping down (DiT resident blocks 4→2, ring 2→3 slots)")
    assert engine.state == EngineState.READY and level() == before
    assert np.array_equal(np.asarray(engine.generate(REQUEST).image), clean_image(demo_model_dir, engine.plan.policy))
    engine.close()


@pytest.mark.slow
def test_without_live_replan_the_ring_shrinks_and_the_retry_still_matches(demo_model_dir: Path):
    policy = build_policy({}, 1, prefetch_slots=3)
    engine = Engine(demo_model_dir, device="cpu")
    engine.load(policy)
    fault = OomAt(engine.pipe.transformer.single_transformer_blocks[1], 2)
    result = engine.generate(REQUEST)
    fault.handle.remove()
    assert "prefetch ring 3→2 slots (resident blocks stay" in result.oom_step_downs[0].action
    assert engine.placement.streamer.residency.slots == 2
    assert np.array_equal(np.asarray(result.image), clean_image(demo_model_dir, policy))
    engine.close()


def test_lower_policy_steps_down_blocks_then_ring_then_resident_components(demo_model_dir: Path):
    engine = Engine(demo_model_dir, device="cpu")
    plan = engine.make_plan(POLICY)
    seen = []
    while (lower := lower_policy(plan, "denoise")) is not None:
        seen.append(lower[1])
        plan = engine.make_plan(lower[0])
    # 2→1 would stream a double-stream block (twice a single one's bytes) through both slots: skipped
    assert seen == ["DiT resident blocks 4→2, ring 2→3 slots", "DiT resident blocks 2→0", "prefetch ring 3→2 slots",
                    "vae staged"]
    assert lower_policy(engine.make_plan(build_policy({}, 0, "resident")), "denoise") is None


@pytest.mark.slow
def test_a_decode_oom_also_asks_the_lean_phases_hook_for_a_leaner_decode(demo_model_dir: Path):
    asked = []

    def lean_decode(pipe) -> str:
        asked.append(pipe)
        return "VAE decode sliced (test double: nothing changed)"

    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(live_replan=True, lean_decode=lean_decode))
    engine.load(POLICY)
    fault = OomAt(inside(engine, "vae_decode"), 1)
    result = engine.generate(REQUEST)
    fault.handle.remove()
    assert asked == [engine.pipe]
    action = result.oom_step_downs[0].action
    assert action == "DiT resident blocks 4→0; VAE decode sliced (test double: nothing changed)"
    assert np.array_equal(np.asarray(result.image), clean_image(demo_model_dir, engine.plan.policy))
    engine.close()


def test_every_step_down_needs_no_more_device_memory_and_the_chain_ends(demo_model_dir: Path):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from omni_console.engine.model_dir.discovery import discover_model
    from omni_console.engine.planning.plan import make_plan

    model = discover_model(demo_model_dir)

    @settings(max_examples=40, deadline=None)
    @given(resident=st.integers(0, 6), slots=st.integers(2, 6), placement=st.sampled_from(["leading", "spread"]),
           kept=st.lists(st.sampled_from(["text_encoder", "text_encoder_2", "vae"]), unique=True),
           phase=st.sampled_from(["text_encoding", "denoise", "vae_decode"]))
    def check(resident, slots, placement, kept, phase):
        plan = make_plan(model, build_policy({k: False for k in kept}, resident, "dlo", placement, slots))
        for _ in range(20):
            lower = lower_policy(plan, phase)
            if lower is None:  # nothing left that holds fewer device bytes
                assert not any(c.residency == "resident" and c.info.role in ("encoder", "vae")
                               for c in plan.components)
                for keep in range(plan.residency.num_resident):
                    fewer = make_plan(model, plan.policy.model_copy(update=dict(resident_layers=keep,
                                                                                prefetch_slots=2)))
                    assert device_weights(fewer) >= device_weights(plan)
                return
            new = make_plan(model, lower[0])
            assert device_weights(new) < device_weights(plan) or lower[1].endswith("staged")
            assert new.policy != plan.policy
            plan = new
        raise AssertionError("the step-downs never ended")

    check()
