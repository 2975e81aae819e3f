"""`--compile regional` through the engine on CPU (backend "eager": the graphs run the same kernels as eager, so the
output must equal the uncompiled engine's bit for bit): Dynamo compiles in the first request only, and nothing
recompiles across requests, a live re-plan, a LoRA switch, fp8 kept-upcast blocks or an expert switch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from lora_writers import write_peft_lora
from tiny_families_experts import BOUNDARY_RATIO, EXPERTS_GENERATION, build_tiny_wan22_a14b

from omni_console.engine.engine import Engine
from omni_console.engine.events import CompilePhase, LogEvent
from omni_console.engine.options import EngineOptions
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.policy import build_policy

REQUEST = GenerateRequest(prompt="a red fox in snow", steps=3, height=64, width=64, seed=3, guidance=3.0,
                          output_type="np")
COMPILED = EngineOptions(live_replan=True, compile="regional", compile_backend="eager")


def _image(engine: Engine, request: GenerateRequest = REQUEST) -> tuple[np.ndarray, object]:
    result = engine.generate(request)
    return np.asarray(result.image), result.compile


@pytest.fixture(scope="module")
def eager_image(demo_model_dir: Path) -> np.ndarray:
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(live_replan=True))
    try:
        engine.load(build_policy({}, 0, prefetch_slots=2))
        return _image(engine)[0]
    finally:
        engine.close()


def test_compiled_streaming_compiles_once_across_requests_replans_and_lora_switches(demo_model_dir: Path,
                                                                                    eager_image, tmp_path: Path,
                                                                                    monkeypatch):
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    lora = write_peft_lora(tmp_path / "a.safetensors", demo_model_dir / "transformer", "transformer",
                           pattern=r"attn\.(to_|add_)|ff", seed=1)
    engine = Engine(demo_model_dir, device="cpu", options=COMPILED)
    sub = engine.bus.subscribe()
    try:
        engine.load(build_policy({}, 0, prefetch_slots=2))  # every block streamed through 2 slots
        image, first = _image(engine)
        assert first.on and first.compiles > 0 and first.graph_breaks == 0
        assert np.array_equal(image, eager_image)
        image, second = _image(engine)
        assert (second.compiles, second.recompiles, second.expect) == (0, 0, "in memory")
        assert np.array_equal(image, eager_image)
        engine.replan(build_policy({"default": False}, 3, "dlo", "spread", 3))  # other slots, other resident blocks
        image, replanned = _image(engine)
        assert (replanned.compiles, replanned.recompiles) == (0, 0)
        assert np.array_equal(image, eager_image)
        # the first LoRA puts PEFT's layers into the blocks (other module types: Dynamo's type guards fail, one
        # compile per block class and shape); re-scaling or switching it later changes no module: no compile
        engine.set_loras(((str(lora), 0.7),), "merge")
        _, added = _image(engine)
        assert 0 < added.recompiles <= first.compiles
        engine.set_loras(((str(lora), 0.3),), "merge")
        _, switched = _image(engine)
        assert (switched.compiles, switched.recompiles) == (0, 0)
    finally:
        engine.close()
    # the measured compile phase is kept for the next forecast; compiled step times are not saved as the profile
    assert list((tmp_path / "cache" / "compile").glob("*.json"))
    assert not list((tmp_path / "cache").glob("profiles/*.json"))
    events = sub.drain()
    phases = [e for e in events if isinstance(e, CompilePhase)]
    assert [p.compiles > 0 for p in phases] == [True, False, False, True, False]
    assert any(isinstance(e, LogEvent) and "compile regional: regional, cold start" in e.message for e in events)
    assert any(isinstance(e, LogEvent) and "not bit-identical to eager" in e.message for e in events)


def test_sidecar_layers_on_the_fast_forward_compile_once(demo_model_dir: Path, tmp_path: Path):
    """The sidecar switches PEFT's layers to lora_arith's forward (another class) before they first run: the first
    request compiles, the next compiles nothing, and both equal the uncompiled engine's output."""
    lora = write_peft_lora(tmp_path / "s.safetensors", demo_model_dir / "transformer", "transformer",
                           pattern=r"attn\.(to_|add_)|ff", seed=2)
    options = EngineOptions(compile="regional", compile_backend="eager", loras=((str(lora), 1.0),),
                            lora_mode="sidecar")
    plain = Engine(demo_model_dir, device="cpu", options=EngineOptions(loras=((str(lora), 1.0),), lora_mode="sidecar"))
    compiled = Engine(demo_model_dir, device="cpu", options=options)
    policy = build_policy({}, 0, prefetch_slots=2)
    try:
        plain.load(policy)
        compiled.load(policy)
        layers = [type(m).__name__ for m in compiled.pipe.transformer.modules() if hasattr(m, "lora_A")]
        assert layers and set(layers) == {"FastLoraLinear"}
        expected = _image(plain)[0]
        image, first = _image(compiled)
        assert first.compiles > 0 and np.array_equal(image, expected)
        image, again = _image(compiled)
        assert (again.compiles, again.recompiles) == (0, 0) and np.array_equal(image, expected)
    finally:
        plain.close()
        compiled.close()


def test_fp8_kept_upcast_blocks_run_compiled_without_recompiles(demo_model_dir: Path):
    options = EngineOptions(compile="regional", compile_backend="eager")
    plain = Engine(demo_model_dir, device="cpu")
    compiled = Engine(demo_model_dir, device="cpu", options=options)
    policy = build_policy({}, 2, stream_dtype="float8_e4m3fn", upcast_resident=1)  # upcast kept, fp8, streamed
    try:
        plain.load(policy)
        compiled.load(policy)
        assert compiled.plan.residency.num_upcast == 1
        expected = _image(plain)[0]
        image, first = _image(compiled)
        _, second = _image(compiled)
    finally:
        plain.close()
        compiled.close()
    assert np.array_equal(image, expected)
    assert first.on and (second.compiles, second.recompiles) == (0, 0)


@pytest.mark.slow
def test_two_experts_share_one_graph_per_block_class(tmp_path_factory, wan_loadable):
    path = build_tiny_wan22_a14b(tmp_path_factory.mktemp("models") / "wan22", seed=0)
    gen = EXPERTS_GENERATION
    request = GenerateRequest(prompt="a fox", steps=gen["num_inference_steps"], height=gen["height"],
                              width=gen["width"], seed=3, guidance=3.0, frames=gen["num_frames"],
                              max_sequence_length=gen["max_sequence_length"], output_type="np")
    images = []
    outcomes = []
    for options in (EngineOptions(), EngineOptions(compile="regional", compile_backend="eager")):
        engine = Engine(path, device="cpu", options=options)
        try:
            engine.load(build_policy({}, 1, prefetch_slots=2))
            if engine.pipe.config.get("boundary_ratio") is None:
                engine.pipe.register_to_config(boundary_ratio=BOUNDARY_RATIO)
            images.append(np.stack(engine.generate(request).frames))
            outcomes.append(engine.generate(request).compile)
        finally:
            engine.close()
    assert np.array_equal(images[0], images[1])
    assert (outcomes[1].compiles, outcomes[1].recompiles) == (0, 0)  # the second request: both experts, no compile


def test_a_measured_compile_workspace_is_reported_recorded_and_held_back_by_the_next_budget(
        demo_model_dir: Path, tmp_path: Path, monkeypatch):
    """The allocator's step peaks exist only on CUDA (tests/engine/test_compile_workspace_cuda.py measures them); here
    the workspace they would give is set, and what the operator sees of it is checked: the request's report and event,
    the record, and the next `run --vram-budget`, which holds the measured figure back instead of the estimate."""
    from omni_console.engine.api import open_engine, service
    from omni_console.engine.running import request_compile

    measured = 7 << 20
    seen: list[tuple[object, object]] = []

    def workspace(first: int | None, later: int | None) -> int:
        seen.append((first, later))
        return measured

    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(request_compile, "compile_workspace", workspace)
    torch._dynamo.reset()  # the blocks' graphs of earlier tests in this process would make it compile nothing
    options = EngineOptions(compile="regional", compile_backend="eager")
    engine = Engine(demo_model_dir, device="cpu", options=options)
    sub = engine.bus.subscribe()
    try:
        engine.load(build_policy({}, 0, prefetch_slots=2))
        _, first = _image(engine)
        _, again = _image(engine)
    finally:
        engine.close()
    assert seen[0] == (None, None)  # no allocator peaks on a CPU
    assert first.compiles > 0 and first.workspace_bytes == measured and first.as_dict()["workspace_bytes"] == measured
    assert again.compiles == 0 and again.workspace_bytes is None  # nothing compiled: nothing measured
    phases = [e for e in sub.drain() if isinstance(e, CompilePhase)]
    assert [p.workspace_bytes for p in phases] == [measured, None]
    from omni_console.console.compile_flags import describe_compile_phase

    assert describe_compile_phase(phases[0]).endswith("graph breaks; workspace 7 MiB")

    later = open_engine(demo_model_dir, device="cpu", options=options)
    try:
        plan = later.make_plan(build_policy({}, 0, prefetch_slots=2))
        planned = service.plan_run(later, plan, later.model.nbytes * 2 + (16 << 20), None, REQUEST)
        other_size = service.plan_run(later, plan, later.model.nbytes * 2 + (16 << 20), None,
                                      GenerateRequest(prompt="a", steps=3, height=96, width=96))
    finally:
        later.close()
    assert planned.reasons[-1] == ("compile workspace 7 MiB held back from the budget (measured by an earlier run "
                                   "at this size)")
    assert "(estimated" in other_size.reasons[-1]  # no run at 96x96 yet


class _SlowStartUp:
    """A compile start-up still running when the first request comes (a load too short to hide it)."""

    def __init__(self, *_: object) -> None:
        self.seconds: float | None = None
        self.error = None
        self.joined = 0

    def wait(self) -> float:
        import time

        time.sleep(0.3)
        self.seconds, self.joined = 1.25, self.joined + 1
        return 0.3


def test_the_compile_start_up_runs_beside_the_load_and_a_request_waits_for_it_in_its_phase(
        demo_model_dir: Path, monkeypatch):
    import threading

    from omni_console.engine import engine as engine_module

    started: list[_SlowStartUp] = []

    def slow(asked: str, backend: str, device: torch.device) -> _SlowStartUp:
        started.append(_SlowStartUp())
        return started[-1]

    monkeypatch.setattr(engine_module, "start_warmup", slow)
    engine = Engine(demo_model_dir, device="cpu", options=COMPILED)
    sub = engine.bus.subscribe()
    try:
        engine.load(build_policy({}, 0, prefetch_slots=2))
        assert len(started) == 1 and started[0].joined == 0  # the load never waits for it
        _, first = _image(engine)
        _, second = _image(engine)
    finally:
        engine.close()
    assert started[0].joined == 1  # the first request joined it; nobody after
    assert first.seconds >= 0.3 and second.seconds < 0.3
    lines = [e.message for e in sub.drain() if isinstance(e, LogEvent) and "compile start-up" in e.message]
    assert lines == ["request 1: compile start-up 1.2 s beside the load, 0.3 s of it waited for"]
    assert not any(t.name == "compile-warmup" and t.is_alive() for t in threading.enumerate())


def test_the_real_start_up_is_started_only_where_a_request_may_compile(demo_model_dir: Path):
    lines = {}
    for compile_ in ("off", "regional", "auto"):  # auto: off on a CPU
        engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(compile=compile_, compile_backend="eager"))
        sub = engine.bus.subscribe()
        try:
            engine.load(build_policy({}, 0, prefetch_slots=2))
            engine.generate(GenerateRequest(prompt="a", steps=1, height=64, width=64, output_type="np"))
        finally:
            engine.close()
        lines[compile_] = [e.message for e in sub.drain() if isinstance(e, LogEvent) and "start-up" in e.message]
    assert lines["off"] == [] and lines["auto"] == []
    assert len(lines["regional"]) == 1 and "beside the load" in lines["regional"][0]
    assert "failed" not in lines["regional"][0]
