"""Staged encoders and VAEs (whole, or streamed layer by layer) read from the page cache and disk at each stage.

The plan's component tiers are set by hand (`dataclasses.replace`), as the tier planner would set them; the output
must be bit-identical to `DiffusionPipeline.from_pretrained` under every policy, while the process holds no host
master of those components (their stagers hold nothing pinned, nothing but the few bytes no file holds as loaded).
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from tiny_families import write_wide_wan

from omni_console.console.cli import main
from omni_console.engine import engine as engine_module
from omni_console.engine.engine import Engine
from omni_console.engine.options import EngineOptions
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.errors import PolicyError
from omni_console.offload.events import StagingEvent
from omni_console.offload.file_stager import FileStager
from omni_console.offload.layer_stage import LayerStage
from omni_console.offload.pinned import arena_bytes_held
from omni_console.offload.policy import build_policy
from omni_console.offload.tier_filler import TieredFiller
from omni_console.offload.tiers import HostTiers, Tier

REQUEST = GenerateRequest(prompt="a red fox in the snow", steps=2, height=64, width=64, seed=7, guidance=3.0,
                          output_type="np")
POLICIES = (lambda: build_policy({}, 0), lambda: build_policy({"default": False}, 1),
            lambda: build_policy({"vae": False}, 2, prefetch_slots=3), lambda: build_policy({}, 1, placement="spread"))
STREAMED_ENCODER = (lambda: build_policy({}, 0, stream_encoders="on"),)


@pytest.fixture(scope="module")
def wide_wan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Wan pipeline with a 6-layer UMT5 (more layers than the 2 slots: it streams layer by layer)."""
    return write_wide_wan(tmp_path_factory.mktemp("staged_files") / "wan")


def force_component_tiers(monkeypatch: pytest.MonkeyPatch, tier: Tier) -> None:
    """Every plan the engine makes keeps its staged encoders and VAEs in `tier` (by hand, as a planner would)."""
    make = engine_module.make_plan

    def with_tiers(model, policy, *args, **kwargs):
        plan = make(model, policy, *args, **kwargs)
        staged = tuple((c.info.name, tier) for c in plan.components if c.residency == "staged")
        return dataclasses.replace(plan, tiers=HostTiers(components=staged))

    monkeypatch.setattr(engine_module, "make_plan", with_tiers)


def plain_output(path: Path, request: GenerateRequest) -> np.ndarray:
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(**request.call_kwargs(pipe))
    return np.asarray(out.frames[0][0] if hasattr(out, "frames") else out.images)


def assert_bit_identical(path: Path, request: GenerateRequest, monkeypatch: pytest.MonkeyPatch, tier: Tier,
                         policies=POLICIES, options: EngineOptions | None = None) -> tuple[list, set[str]]:
    """Every policy's output equals plain diffusers'; returns the events and the components read from files."""
    expected = plain_output(path, request)
    assert float(expected.std()) > 0
    force_component_tiers(monkeypatch, tier)
    engine = Engine(path, device="cpu", options=options or EngineOptions())
    base = arena_bytes_held()
    events = engine.bus.subscribe()
    from_files: set[str] = set()
    layered = False
    try:
        for policy in policies:
            engine.load(policy())
            for name, stager in engine.placement.stagers.items():
                inner = stager.stager if isinstance(stager, LayerStage) else stager
                assert isinstance(inner, FileStager) and inner.tier == tier, name
                assert stager.pinned_bytes == 0 and not stager.host_storages(), name
                assert inner.held_host_bytes < 4096, name  # no master: only buffers built at construction
                if isinstance(stager, LayerStage):
                    assert isinstance(stager.ring.filler, TieredFiller), name
                    assert stager.ring.filler.file_blocks and stager.ring.host_bytes == stager.ring.bounce_bytes, name
                    layered = True
                from_files.add(name)
            result = engine.generate(request, threading.Event())
            held = arena_bytes_held() - base  # the streamed DiT's arena and bounce rings: no encoder/VAE master
            streamer = engine.placement.streamer
            rings = sum(s.ring.host_bytes for s in engine.placement.stagers.values() if isinstance(s, LayerStage))
            assert held <= (streamer.host_bytes if streamer else 0) + rings
            engine.unload()
            got = np.asarray(result.image)[None]
            assert np.array_equal(got.reshape(expected.shape), expected), policy
    finally:
        engine.close()
    assert layered == any(p().lean_on("stream_encoders") for p in policies)
    return events.drain(), from_files


@pytest.mark.slow
@pytest.mark.parametrize("tier", ["page_cache", "disk"])
def test_demo_flux_encoders_and_vae_from_file_tiers_are_bit_identical(demo_model_dir: Path, monkeypatch, tier):
    seen, from_files = assert_bit_identical(demo_model_dir, REQUEST, monkeypatch, tier)
    assert {"text_encoder", "text_encoder_2", "vae"} <= from_files
    staged = {e.target for e in seen if isinstance(e, StagingEvent) and e.tier == tier}
    assert {"text_encoder", "text_encoder_2", "vae"} <= staged


@pytest.mark.slow
@pytest.mark.parametrize("tier", ["page_cache", "disk"])
@pytest.mark.parametrize("in_arena", [False, True], ids=["from_pretrained", "arena"])
def test_a_layer_streamed_encoder_from_file_tiers_is_bit_identical(wide_wan: Path, wan_loadable, monkeypatch, tier,
                                                                   in_arena):
    request = GenerateRequest(prompt="a red fox in snow", steps=2, height=32, width=32, seed=7, output_type="np",
                              extra={"num_frames": 5, "max_sequence_length": 32})
    _, from_files = assert_bit_identical(wide_wan, request, monkeypatch, tier, STREAMED_ENCODER + POLICIES[:1],
                                         EngineOptions(aux_in_place=in_arena))
    assert "text_encoder" in from_files


@pytest.mark.slow
def test_sd15_like_text_encoder_and_vae_from_disk_are_bit_identical(loading_family_dir, monkeypatch):
    from tiny_families_loading import LOADING_GENERATION

    gen = dict(LOADING_GENERATION["sd15"])
    request = GenerateRequest(prompt="a red fox", steps=gen.pop("num_inference_steps"), height=gen.pop("height"),
                              width=gen.pop("width"), seed=7, guidance=3.0, negative_prompt="blurry",
                              output_type="np", extra=gen)
    _, from_files = assert_bit_identical(loading_family_dir("sd15"), request, monkeypatch, "disk", POLICIES[:2])
    assert {"text_encoder", "vae"} <= from_files


@pytest.mark.slow
def test_an_encoder_file_changed_after_the_load_fails_the_run_in_one_line(demo_model_dir: Path, tmp_path: Path,
                                                                           monkeypatch, capsys):
    model = Path(shutil.copytree(demo_model_dir, tmp_path / "model"))
    weights = sorted((model / "text_encoder").glob("*.safetensors"))
    assert weights
    force_component_tiers(monkeypatch, "page_cache")
    load = Engine.load

    def load_then_change(self, *args, **kwargs):
        report = load(self, *args, **kwargs)
        for f in weights:
            with f.open("r+b") as handle:
                handle.truncate(f.stat().st_size // 2)
        return report

    monkeypatch.setattr(Engine, "load", load_then_change)
    out = tmp_path / "out.png"
    code = main(["run", "--headless", "--model", str(model), "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err and not out.exists()
    failed = [line for line in err.splitlines() if "changed on disk after the load" in line or "ended" in line]
    assert len(failed) == 1 and weights[0].name in failed[0], err


def test_component_tiers_a_load_cannot_carry_out_are_refused_when_planned(demo_model_dir: Path, monkeypatch):
    force_component_tiers(monkeypatch, "disk")
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(live_replan=True))
    try:
        with pytest.raises(PolicyError, match="live re-plan keeps a host master of every encoder/VAE"):
            engine.make_plan(build_policy({}, 0))
    finally:
        engine.close()
    engine = Engine(demo_model_dir, device="cpu")
    try:
        plan = engine.make_plan(build_policy({}, 0))
        assert dict(plan.tiers.components)["text_encoder"] == "disk"
        resident = dataclasses.replace(plan, tiers=HostTiers(components=(("transformer", "disk"),)))
        from omni_console.engine.planning.tier_support import unsupported_tiers

        assert "only a staged component" in (unsupported_tiers(resident, live=False, ranks=False) or "")
    finally:
        engine.close()


@pytest.mark.slow
def test_a_file_tier_component_is_built_over_its_files_and_never_read_at_load(demo_model_dir: Path, monkeypatch):
    """issue 35 flux16: nothing of a page-cache/disk-tier encoder or VAE is read at load (its library never builds
    it from a read of its files, no byte of it is compared), yet every weight has its file range."""
    from omni_console.engine.loading import file_sources, loader

    built_by_library: list[str] = []
    compared: list[int] = []
    load_component, same_bytes = loader.load_component, file_sources.same_bytes

    def counted_load(info):
        built_by_library.append(info.name)
        return load_component(info)

    def counted_compare(fd, stored, t):
        compared.append(stored.nbytes)
        return same_bytes(fd, stored, t)

    monkeypatch.setattr(loader, "load_component", counted_load)
    monkeypatch.setattr(file_sources, "same_bytes", counted_compare)
    force_component_tiers(monkeypatch, "disk")
    engine = Engine(demo_model_dir, device="cpu")
    try:
        engine.load(build_policy({}, 0))
        staged = [c.info for c in engine.plan.components if c.residency == "staged"]
        assert len(staged) >= 3
        assert not {info.name for info in staged} & set(built_by_library)
        assert sum(compared) == 0
        for info in staged:
            stager = engine.placement.stagers[info.name]
            assert stager.file_bytes == info.nbytes, info.name  # every weight read from its files at each stage
    finally:
        engine.close()


@pytest.mark.slow
def test_two_experts_with_their_encoder_and_vae_on_disk_draw_what_the_pinned_load_draws(tmp_path: Path, monkeypatch,
                                                                                          wan_loadable):
    from tiny_families_experts import BOUNDARY_RATIO, EXPERTS_GENERATION, build_tiny_wan22_a14b

    path = build_tiny_wan22_a14b(tmp_path / "wan22", seed=0)
    gen = EXPERTS_GENERATION
    request = GenerateRequest(prompt="a red fox running in the snow", steps=gen["num_inference_steps"],
                              height=gen["height"], width=gen["width"], seed=3, guidance=1.0, frames=gen["num_frames"],
                              max_sequence_length=gen["max_sequence_length"], output_type="np")

    def frames() -> tuple[np.ndarray, int]:
        engine = Engine(path, device="cpu")
        try:
            engine.load(build_policy({}, 1))
            if engine.pipe.config.get("boundary_ratio") is None:  # as tests/engine/test_experts.py loads it
                engine.pipe.register_to_config(boundary_ratio=BOUNDARY_RATIO)
            tiers = dict(engine.plan.tiers.components)
            for name, stager in engine.placement.stagers.items():
                assert isinstance(stager, FileStager) == (tiers.get(name, "pinned") == "disk"), name
            image = np.asarray(engine.generate(request, threading.Event()).image)
            return image, sum(isinstance(s, FileStager) for s in engine.placement.stagers.values())
        finally:
            engine.close()

    pinned, none = frames()
    force_component_tiers(monkeypatch, "disk")
    tiered, read = frames()
    assert none == 0 and read >= 2  # the UMT5 encoder and the VAE
    assert np.array_equal(tiered, pinned) and float(pinned.std()) > 0
