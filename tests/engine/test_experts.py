"""Two experts share one budget (Wan 2.2 A14B, issue 22 item 9), on the tiny two-expert Wan 2.2.

- The forecast counts the running expert: the device holds one expert's resident blocks and ring, the
  pinned host both experts whole; the VRAM-budget planner therefore fits per-expert residencies that the
  sum would not.
- The engine switches once per request, at diffusers' boundary step (the first timestep below
  `boundary_ratio` * 1000), with an `ExpertSwitched` event giving bytes and seconds, and puts the first
  expert back when the request ends; the ring never misses a block after the first step.
- Every frame is bit-identical to the plain diffusers pipeline (both experts resident) under every policy.

Until the loader passes `boundary_ratio` from model_index.json to the pipeline (another item of issue 22),
`_loaded` sets it on the loaded pipeline as diffusers' `from_pretrained` does; once it does, that line does
nothing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_families_experts import BOUNDARY_RATIO, EXPERTS_GENERATION, build_tiny_wan22_a14b

from omni_console.engine.engine import Engine
from omni_console.engine.events import ExpertSwitched, StepTiming
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.auto_plan import auto_plan
from omni_console.engine.planning.export import plan_to_dict
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.planning.request_profile import RequestSize
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.errors import PolicyError
from omni_console.offload.policy import build_policy

PROMPT = "a red fox running in the snow"


@pytest.fixture(scope="module")
def wan22_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_wan22_a14b(tmp_path_factory.mktemp("models") / "wan22-a14b", seed=0)


def request(guidance: float = 1.0) -> GenerateRequest:
    gen = EXPERTS_GENERATION
    return GenerateRequest(prompt=PROMPT, steps=gen["num_inference_steps"], height=gen["height"], width=gen["width"],
                           seed=3, guidance=guidance, frames=gen["num_frames"],
                           max_sequence_length=gen["max_sequence_length"], output_type="np")


def _loaded(path: Path, policy, device: str = "cpu") -> Engine:
    engine = Engine(path, device=device)
    engine.load(policy)
    if engine.pipe.config.get("boundary_ratio") is None:  # dropped by today's loader (issue 22 item 1)
        engine.pipe.register_to_config(boundary_ratio=BOUNDARY_RATIO)
    return engine


def _boundary_steps(path: Path, steps: int) -> tuple[list[float], int]:
    """The scheduler's timesteps and how many run on the high-noise expert (t >= boundary), as diffusers decides."""
    from diffusers import UniPCMultistepScheduler

    scheduler = UniPCMultistepScheduler.from_pretrained(path / "scheduler")
    scheduler.set_timesteps(steps)
    ts = [float(t) for t in scheduler.timesteps]
    return ts, sum(t >= BOUNDARY_RATIO * scheduler.config.num_train_timesteps for t in ts)


def test_the_forecast_counts_the_running_expert_not_both(wan22_dir: Path):
    model = discover_model(wan22_dir)
    high, low = model.component("transformer"), model.component("transformer_2")
    blocks = [b for dit in (high, low) for bl in dit.block_lists for b in bl.block_bytes]
    per_expert = high.num_blocks
    staged = sum(c.nbytes for c in model.components if c.role in ("encoder", "vae"))
    for resident in (0, 1, per_expert):
        plan = make_plan(model, build_policy({}, resident, "dlo", "leading", 2))
        f = plan.forecast
        own = list(high.block_lists[0].block_bytes)
        streamed = own[resident:]
        assert f.device_resident_bytes == high.non_block_bytes + low.non_block_bytes + sum(own[:resident])
        assert f.streamed_bytes_per_forward == sum(streamed)
        assert f.num_resident_blocks == resident and f.num_streamed_blocks == per_expert - resident
        assert f.peak_device_weight_bytes == (f.device_resident_bytes + min(2, len(streamed)) * max(streamed, default=0)
                                              + max(c.nbytes for c in model.components if c.role in ("encoder", "vae")))
        assert f.pinned_host_bytes == sum(blocks) + staged  # both experts whole: resident blocks move at a switch
        # each expert's blocks show its own residency (resident while it runs)
        shown = [(b.dit, b.streamed) for b in plan.blocks]
        assert shown == [(d, i >= resident) for d in ("transformer", "transformer_2") for i in range(per_expert)]
        doc = plan_to_dict(plan)
        assert doc["forecast"]["device_resident_bytes"] == f.device_resident_bytes
    with pytest.raises(PolicyError, match=f"between 0 and {per_expert}"):
        make_plan(model, build_policy({}, per_expert + 1, "dlo", "leading", 2))
    resident_mode = make_plan(model, build_policy({}, 0, "resident"))
    assert resident_mode.forecast.device_resident_bytes == model.nbytes  # plain diffusers: everything on the device


def test_the_vram_budget_planner_fits_one_expert_resident_where_both_would_not(wan22_dir: Path):
    model = discover_model(wan22_dir)
    per_expert = model.component("transformer").num_blocks
    whole = make_plan(model, build_policy({}, per_expert, "dlo", "leading", 2))
    both = whole.forecast.peak_device_weight_bytes + sum(model.component("transformer").block_lists[0].block_bytes)
    budget = whole.forecast.peak_device_weight_bytes  # one expert's blocks resident fit; both would be `both`
    assert budget < both
    size = RequestSize(height=32, width=32, frames=5)
    base = make_plan(model, build_policy({}, 0))
    for room, whole_expert in ((budget, True), (budget - 1, False)):
        chosen = auto_plan(base, room, size, None, "unknown", None, "unknown")
        own = chosen.plan.experts[0].residency  # a whole expert on the device: resident or in a ring that never evicts
        assert (own.num_resident + own.slots == per_expert) == whole_expert and chosen.forecast.peak_bytes <= room


@pytest.mark.slow
@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_the_experts_change_hands_once_per_request_at_the_boundary_step(wan22_dir: Path, wan_loadable, guidance):
    engine = _loaded(wan22_dir, build_policy({}, 1, "dlo", "leading", 2))
    calls = {"transformer": 0, "transformer_2": 0}
    for name in calls:
        getattr(engine.pipe, name).register_forward_pre_hook(lambda *_, n=name: calls.__setitem__(n, calls[n] + 1))
    timesteps, high_steps = _boundary_steps(wan22_dir, EXPERTS_GENERATION["num_inference_steps"])
    assert 0 < high_steps < len(timesteps)  # the fixture really runs both experts
    region = sum(engine.model.component("transformer").block_lists[0].block_bytes[:1])
    sub = engine.bus.subscribe()
    for _ in range(2):
        engine.generate(request(guidance))
    events = [e for e in sub.drain() if isinstance(e, ExpertSwitched | StepTiming)]
    engine.close()
    forwards = 2 if guidance > 1 else 1
    steps = len(timesteps)
    assert calls == {"transformer": 2 * high_steps * forwards, "transformer_2": 2 * (steps - high_steps) * forwards}
    for rid in (1, 2):
        mine = [e for e in events if (e.request_id == rid)]
        order = [("switch", e.reason) if isinstance(e, ExpertSwitched) else ("step", e.step) for e in mine]
        assert order == ([("step", s) for s in range(1, high_steps + 1)] + [("switch", "boundary")]
                         + [("step", s) for s in range(high_steps + 1, steps + 1)] + [("switch", "request end")])
        boundary, back = [e for e in mine if isinstance(e, ExpertSwitched)]
        assert (boundary.from_expert, boundary.to_expert) == ("transformer", "transformer_2")
        assert (back.from_expert, back.to_expert) == ("transformer_2", "transformer")
        assert boundary.timestep == timesteps[high_steps]  # the first timestep below the boundary
        for e in (boundary, back):  # one resident block leaves, the other expert's one arrives
            assert e.copied_bytes >= region and e.freed_bytes >= region and e.seconds > 0
        # the ring cycles through the running expert's 2 streamed blocks alone, and holds both in its 2 slots:
        # only the boundary step (the switch fills the new expert's ring) copies anything
        copied = [e.step for e in mine if isinstance(e, StepTiming) and e.h2d_bytes]
        assert copied == [high_steps + 1]


POLICIES = [
    pytest.param({}, 0, "leading", 2, id="all-streamed"),
    pytest.param({"default": False}, 1, "leading", 2, id="one-resident", marks=pytest.mark.slow),
    pytest.param({"vae": False}, 2, "spread", 2, id="spread", marks=pytest.mark.slow),
    # one expert entirely resident at a time, nothing streamed
    pytest.param({}, 3, "leading", 2, id="expert-resident", marks=pytest.mark.slow),
]


def _plain(wan22_dir: Path, device: str) -> np.ndarray:
    """The plain diffusers pipeline on `device` (both experts resident, `boundary_ratio` from model_index.json)."""
    import importlib.util

    from diffusers import WanPipeline, WanTransformer3DModel

    req = request(3.0)
    with pytest.MonkeyPatch.context() as patch:  # as the `wan_loadable` fixture, for a module-scoped one
        if importlib.util.find_spec("accelerate") is None:
            patch.setattr(WanTransformer3DModel, "_keep_in_fp32_modules", None)
        plain = WanPipeline.from_pretrained(wan22_dir, local_files_only=True).to(device)
    assert plain.config.boundary_ratio == BOUNDARY_RATIO
    plain.set_progress_bar_config(disable=True)
    frames = plain(prompt=PROMPT, num_inference_steps=req.steps, height=req.height, width=req.width,
                   guidance_scale=req.guidance, num_frames=req.frames, max_sequence_length=req.max_sequence_length,
                   output_type="np", generator=torch.Generator("cpu").manual_seed(req.seed)).frames[0]
    assert float(frames.std()) > 0
    return frames


@pytest.fixture(scope="module")
def plain_frames(wan22_dir: Path) -> np.ndarray:
    return _plain(wan22_dir, "cpu")


@pytest.mark.slow
@pytest.mark.parametrize(("components", "layers", "placement", "slots"), POLICIES)
def test_every_frame_is_bit_identical_to_plain_diffusers(wan22_dir: Path, wan_loadable, plain_frames,
                                                         components, layers, placement, slots):
    req = request(3.0)
    engine = _loaded(wan22_dir, build_policy(components, layers, "dlo", placement, slots))
    sub = engine.bus.subscribe()
    first = engine.generate(req)
    second = engine.generate(req)  # starts again with the first expert placed
    switches = [e for e in sub.drain() if isinstance(e, ExpertSwitched)]
    engine.close()
    assert [e.reason for e in switches] == ["boundary", "request end"] * 2
    assert np.array_equal(np.stack(first.frames), plain_frames)
    assert np.array_equal(np.stack(second.frames), plain_frames)


@pytest.mark.slow
def test_resident_mode_keeps_both_experts_and_matches_plain_diffusers(wan22_dir: Path, wan_loadable, plain_frames):
    engine = _loaded(wan22_dir, build_policy({}, 0, "resident"))
    result = engine.generate(request(3.0))
    assert engine.placement.experts is None  # both experts on the device, nothing changes hands
    engine.close()
    assert np.array_equal(np.stack(result.frames), plain_frames)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_switch_keeps_frames_identical_to_plain_diffusers(wan22_dir: Path, wan_loadable):
    """float32 weights copied exactly: the tolerance is 0, as in test_engine_cuda."""
    expected = _plain(wan22_dir, "cuda")
    engine = _loaded(wan22_dir, build_policy({}, 1, "dlo", "leading", 2), device="cuda")
    sub = engine.bus.subscribe()
    results = [engine.generate(request(3.0)) for _ in range(2)]
    switches = [e for e in sub.drain() if isinstance(e, ExpertSwitched)]
    engine.close()
    assert [e.reason for e in switches] == ["boundary", "request end"] * 2
    assert all(e.copied_bytes > 0 and e.seconds > 0 for e in switches)
    for result in results:
        assert np.array_equal(np.stack(result.frames), expected)


def test_sharding_two_experts_across_gpus_is_refused_before_load(wan22_dir: Path):
    from omni_console.engine.errors import ConfigError
    from omni_console.engine.ranks.rank_checks import check_experts
    from omni_console.engine.ranks.rank_layout import RankLayout

    model = discover_model(wan22_dir)
    with pytest.raises(ConfigError, match="--dlo-no-use-allgather"):
        check_experts(RankLayout(gpus=2), model)
    check_experts(RankLayout(gpus=2, allgather=False), model)  # every rank streams whole blocks: its own switch
    check_experts(RankLayout(gpus=1), model)
