"""Two experts (Wan 2.2 A14B) with their blocks in the page cache or on disk (issue 35 item 5).

The tiers are set by hand, as the tier planner would (tests/engine/test_tier_reads.py's way): every block of
both experts, resident ones too, is read from its file when its expert runs, none is pinned, and every frame
is bit-identical to plain diffusers under every policy two experts support. Before each switch the running
expert's last forward reads the next expert's first blocks ahead (`ExpertPrefetch`), which the event order
shows: it comes before the step that ends the running expert's part, and the switch finds those reads made.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_families_experts import BOUNDARY_RATIO, EXPERTS_GENERATION, build_tiny_wan22_a14b

from omni_console.engine import engine as engine_module
from omni_console.engine.engine import Engine
from omni_console.engine.events import ExpertPrefetch, ExpertSwitched, StepTiming
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.events import StagingEvent
from omni_console.offload.policy import build_policy
from omni_console.offload.tiers import BOUNCE_SLOTS, HostTiers, Tier

PROMPT = "a red fox running in the snow"
POLICIES = [  # (components, resident layers per expert, placement, slots): as tests/engine/test_experts.py
    pytest.param({}, 0, "leading", 2, id="all-streamed"),
    pytest.param({"default": False}, 1, "leading", 2, id="one-resident"),
    pytest.param({"vae": False}, 2, "spread", 2, id="spread"),
    pytest.param({}, 3, "leading", 2, id="expert-resident"),  # no ring: every block read at its switch
]


@pytest.fixture(scope="module")
def wan22_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_wan22_a14b(tmp_path_factory.mktemp("models") / "wan22-a14b", seed=0)


def request(guidance: float = 3.0) -> GenerateRequest:
    gen = EXPERTS_GENERATION
    return GenerateRequest(prompt=PROMPT, steps=gen["num_inference_steps"], height=gen["height"], width=gen["width"],
                           seed=3, guidance=guidance, frames=gen["num_frames"],
                           max_sequence_length=gen["max_sequence_length"], output_type="np")


def force_tiers(monkeypatch: pytest.MonkeyPatch, tier_of: Callable[[int], Tier]) -> None:
    make = engine_module.make_plan

    def with_tiers(model, policy, *args, **kwargs):
        plan = make(model, policy, *args, **kwargs)
        return dataclasses.replace(plan, tiers=HostTiers(blocks=tuple(tier_of(i) for i in range(len(plan.blocks)))))

    monkeypatch.setattr(engine_module, "make_plan", with_tiers)


def loaded(path: Path, policy) -> Engine:
    engine = Engine(path, device="cpu")
    engine.load(policy)
    if engine.pipe.config.get("boundary_ratio") is None:  # as tests/engine/test_experts.py's `_loaded`
        engine.pipe.register_to_config(boundary_ratio=BOUNDARY_RATIO)
    return engine


def plain_frames(path: Path, guidance: float) -> np.ndarray:
    import importlib.util

    from diffusers import WanPipeline, WanTransformer3DModel

    req = request(guidance)
    with pytest.MonkeyPatch.context() as patch:  # as the `wan_loadable` fixture
        if importlib.util.find_spec("accelerate") is None:
            patch.setattr(WanTransformer3DModel, "_keep_in_fp32_modules", None)
        plain = WanPipeline.from_pretrained(path, local_files_only=True)
    plain.set_progress_bar_config(disable=True)
    frames = plain(prompt=PROMPT, num_inference_steps=req.steps, height=req.height, width=req.width,
                   guidance_scale=req.guidance, num_frames=req.frames, max_sequence_length=req.max_sequence_length,
                   output_type="np", generator=torch.Generator("cpu").manual_seed(req.seed)).frames[0]
    assert float(frames.std()) > 0
    return frames


@pytest.fixture(scope="module")
def expected(wan22_dir: Path) -> np.ndarray:
    return plain_frames(wan22_dir, 3.0)


@pytest.mark.slow
@pytest.mark.parametrize("tier", ["page_cache", "disk"])
@pytest.mark.parametrize(("components", "layers", "placement", "slots"), POLICIES)
def test_both_experts_from_file_tiers_are_bit_identical_to_plain_diffusers(
        wan22_dir: Path, wan_loadable, expected, monkeypatch, tier, components, layers, placement, slots):
    force_tiers(monkeypatch, lambda _i: tier)
    engine = loaded(wan22_dir, build_policy(components, layers, "dlo", placement, slots))
    sub = engine.bus.subscribe()
    try:
        s = engine.placement.streamer
        arena = s.filler.arena
        assert (arena.nbytes if arena is not None else 0) == 0 and s.bounce_bytes > 0  # no block pinned
        assert s.tier_bytes() == {"pinned": 0, "page_cache": 0, "disk": 0,
                                  tier: sum(b.nbytes for b in engine.plan.blocks)}  # both experts, in files
        first = engine.generate(request())
        second = engine.generate(request())  # starts again with the first expert placed
    finally:
        engine.close()
    events = sub.drain()
    assert [e.reason for e in events if isinstance(e, ExpertSwitched)] == ["boundary", "request end"] * 2
    staged = {e.tier for e in events if isinstance(e, StagingEvent) and e.target.startswith("transformer")}
    assert staged == {tier}
    assert np.array_equal(np.stack(first.frames), expected)
    assert np.array_equal(np.stack(second.frames), expected)


@pytest.mark.slow
@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_the_next_experts_first_blocks_are_read_before_the_boundary_step(wan22_dir: Path, wan_loadable,
                                                                         monkeypatch, guidance):
    """The read ahead begins in the running expert's last forward: after its part's last step but one, before
    the step that ends it, and the switch finds those blocks read (`prefetched_bytes`)."""
    force_tiers(monkeypatch, lambda i: "disk" if i % 2 else "page_cache")
    # two slots for three streamed blocks: the ring reads every forward (slots holding all would read none)
    engine = loaded(wan22_dir, build_policy({}, 0, "dlo", "leading", 2))
    sub = engine.bus.subscribe()
    try:
        result = engine.generate(request(guidance))
        per_expert = engine.plan.experts[0].count
    finally:
        engine.close()
    if guidance == 1.0:
        assert np.array_equal(np.stack(result.frames), plain_frames(wan22_dir, 1.0))
    events = [e for e in sub.drain() if isinstance(e, ExpertPrefetch | ExpertSwitched | StepTiming)]
    order = [(type(e).__name__, getattr(e, "step", getattr(e, "to_expert", None))) for e in events]
    high = next(k for k, e in enumerate(events) if isinstance(e, ExpertSwitched))  # the boundary switch
    high_steps = sum(1 for e in events[:high] if isinstance(e, StepTiming))
    assert 0 < high_steps < len([e for e in events if isinstance(e, StepTiming)])
    # read ahead for transformer_2 during the last high-noise step (after step high_steps - 1 ended, before
    # step high_steps ended), and for transformer during the request's last step (before it is put back)
    prefetches = [(k, e) for k, e in enumerate(events) if isinstance(e, ExpertPrefetch)]
    assert [e.to_expert for _, e in prefetches] == ["transformer_2", "transformer"], order
    (at_boundary, to_low), (at_end, to_high) = prefetches
    ended = [k for k, e in enumerate(events) if isinstance(e, StepTiming)]
    assert ended[high_steps - 2] < at_boundary < ended[high_steps - 1] if high_steps > 1 else at_boundary < ended[0]
    assert ended[-2] < at_end < ended[-1]
    # the next expert's first blocks: as many as the bounce ring holds
    assert to_low.blocks == min(BOUNCE_SLOTS, per_expert) and to_low.nbytes > 0
    switches = [e for e in events if isinstance(e, ExpertSwitched)]
    assert [e.prefetched_bytes for e in switches] == [to_low.nbytes, to_high.nbytes]


def test_the_last_forward_before_a_switch_is_read_from_the_pipelines_schedule():
    from types import SimpleNamespace

    from omni_console.engine.loading.expert_switch import next_expert

    def pipe(cfg: bool) -> SimpleNamespace:
        scheduler = SimpleNamespace(timesteps=torch.tensor([999.0, 937.5, 833.3, 500.0]),
                                    config=SimpleNamespace(num_train_timesteps=1000))
        return SimpleNamespace(scheduler=scheduler, config={"boundary_ratio": 0.875}, do_classifier_free_guidance=cfg)

    assert next_expert(pipe(False), 999.0, 1) == 0  # the next step is still the high-noise expert's
    assert next_expert(pipe(False), 937.5, 1) == 1  # the last above the boundary
    assert next_expert(pipe(True), 937.5, 1) is None  # guidance: the step's second forward is its last
    assert next_expert(pipe(True), 937.5, 2) == 1
    assert next_expert(pipe(False), 833.3, 1) == 1
    assert next_expert(pipe(False), 500.0, 1) == 0  # the request's last: the first expert comes back
    assert next_expert(pipe(False), 123.0, 1) is None  # not in the schedule
    assert next_expert(SimpleNamespace(), 999.0, 1) is None  # no schedule: no read ahead


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_experts_from_disk_keep_frames_identical_and_the_switch_finds_its_blocks_read(
        wan22_dir: Path, wan_loadable, monkeypatch):
    """The bounce ring's copies run on the copy stream there (a slot is read into again only after its copy's
    event): float32 weights copied exactly, tolerance 0 as in tests/engine/test_experts.py."""
    import importlib.util

    from diffusers import WanPipeline, WanTransformer3DModel

    req = request(3.0)
    if importlib.util.find_spec("accelerate") is None:
        monkeypatch.setattr(WanTransformer3DModel, "_keep_in_fp32_modules", None)
    plain = WanPipeline.from_pretrained(wan22_dir, local_files_only=True).to("cuda")
    plain.set_progress_bar_config(disable=True)
    expected = plain(prompt=PROMPT, num_inference_steps=req.steps, height=req.height, width=req.width,
                     guidance_scale=req.guidance, num_frames=req.frames, max_sequence_length=req.max_sequence_length,
                     output_type="np", generator=torch.Generator("cpu").manual_seed(req.seed)).frames[0]
    del plain
    force_tiers(monkeypatch, lambda i: "disk" if i % 2 else "page_cache")
    engine = Engine(wan22_dir, device="cuda")
    engine.load(build_policy({}, 1, "dlo", "leading", 2))
    sub = engine.bus.subscribe()
    try:
        results = [engine.generate(req) for _ in range(2)]
    finally:
        engine.close()
    switches = [e for e in sub.drain() if isinstance(e, ExpertSwitched)]
    assert [e.reason for e in switches] == ["boundary", "request end"] * 2
    assert all(e.prefetched_bytes > 0 for e in switches)
    for result in results:
        assert np.array_equal(np.stack(result.frames), expected)


@pytest.mark.slow
@pytest.mark.parametrize("layers", [1, 3], ids=["one-resident", "expert-resident"])
def test_fp8_experts_from_disk_are_the_pinned_fp8_runs_bits(wan22_dir: Path, wan_loadable, monkeypatch, layers):
    """fp8 storage of both experts (as the community's A14B checkpoints are): blocks read from disk and converted
    on the host, resident ones read at the switch and upcast as pinned ones are; every frame the pinned run's."""
    frames = {}
    for tier in ("pinned", "disk"):
        force_tiers(monkeypatch, lambda _i, tier=tier: tier)
        engine = loaded(wan22_dir, build_policy({}, layers, "dlo", "leading", 2, stream_dtype="float8_e4m3fn"))
        try:
            frames[tier] = np.stack(engine.generate(request()).frames)
        finally:
            engine.close()
    assert np.array_equal(frames["pinned"], frames["disk"])


@pytest.mark.slow
def test_a_request_cancelled_while_reading_ahead_leaves_the_next_request_reading_its_own_blocks(
        wan22_dir: Path, wan_loadable, monkeypatch):
    """Cancelled in the forward that reads the next expert ahead (no switch comes): the next request's ring
    reads only the first expert's blocks until its own read ahead begins, and it draws what a request does."""
    import threading

    from omni_console.engine.loading.expert_switch import ExpertSwitch
    from omni_console.offload.tier_filler import TieredFiller

    force_tiers(monkeypatch, lambda _i: "disk")
    cancel, log = threading.Event(), []
    read_ahead, submit = ExpertSwitch._read_ahead, TieredFiller._submit

    def logged_submit(self, name):
        log.append(name)
        return submit(self, name)

    def marked_read_ahead(self, timestep):
        armed = self._armed
        read_ahead(self, timestep)
        if self._armed is not None and self._armed[1] and armed is None:
            log.append("read ahead")
            if self.active == 0 and self.request_id == 1:
                cancel.set()  # the first request stops at its next block, before the switch

    monkeypatch.setattr(TieredFiller, "_submit", logged_submit)
    monkeypatch.setattr(ExpertSwitch, "_read_ahead", marked_read_ahead)
    engine = loaded(wan22_dir, build_policy({}, 0, "dlo", "leading", 2))
    try:
        with pytest.raises(Exception, match="cancel"):
            engine.generate(request(1.0), cancel)
        assert "read ahead" in log
        log.clear()
        after = np.stack(engine.generate(request(1.0)).frames)
        again = np.stack(engine.generate(request(1.0)).frames)
    finally:
        engine.close()
    before_own = log[: log.index("read ahead")]
    assert before_own and all(name.startswith("transformer.blocks.") for name in before_own)
    assert np.array_equal(after, again)
