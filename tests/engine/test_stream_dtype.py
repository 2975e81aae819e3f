"""fp8 storage (`--stream-dtype`): bit-identical to diffusers' layerwise casting, resident, for every
policy; the arena and the plan hold the fp8 bytes."""

from __future__ import annotations

from pathlib import Path

import diffusers
import numpy as np
import pytest
import torch
from test_engine import pipeline_image, request_for

from omni_console.engine.engine import Engine
from omni_console.engine.loading.stream_dtype import apply_storage_hooks, storage_leaves
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.options import EngineOptions
from omni_console.engine.planning.plan import make_plan
from omni_console.offload.address_phase import PAGE
from omni_console.offload.errors import PolicyError
from omni_console.offload.policy import build_policy
from omni_console.offload.streamer import LayerwiseStreamer

FP8 = torch.float8_e4m3fn


def reference_image(path: Path, request, *, modulation: bool = False, storage: torch.dtype = FP8) -> np.ndarray:
    """Plain diffusers, resident, with layerwise casting on the transformer (diffusers' own call; the
    opt-in: diffusers' hooks on the same selection plus the modulation linears)."""
    pipe = diffusers.FluxPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    if modulation:
        apply_storage_hooks(pipe.transformer, storage, torch.float32, modulation=True)
    else:
        pipe.transformer.enable_layerwise_casting(storage_dtype=storage, compute_dtype=torch.float32)
    return np.asarray(pipe(**request.call_kwargs(pipe)).images[0])


def plain_image(path: Path, request) -> np.ndarray:
    pipe = diffusers.FluxPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return np.asarray(pipe(**request.call_kwargs(pipe)).images[0])


@pytest.mark.slow
def test_every_policy_matches_diffusers_layerwise_casting(demo_model_dir: Path):
    req = request_for("flux")
    expected = reference_image(demo_model_dir, req)
    assert not np.array_equal(expected, plain_image(demo_model_dir, req))  # fp8 storage does change the image
    n = discover_model(demo_model_dir).num_dit_blocks
    for live in (False, True):
        engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(live_replan=live))
        for comps, layers, placement in (({}, 0, "leading"), ({"default": False}, 1, "leading"),
                                         ({}, 2, "spread"), ({}, n, "leading")):
            engine.load(build_policy(comps, layers, "dlo", placement, stream_dtype="float8_e4m3fn"))
            got = np.asarray(engine.generate(req).image)
            assert np.array_equal(got, expected), (live, comps, layers, placement)
            engine.unload()
        engine.load(build_policy(None, 0, "resident", stream_dtype="float8_e4m3fn"))
        assert np.array_equal(np.asarray(engine.generate(req).image), expected)
        engine.close()


@pytest.mark.slow
def test_live_replan_keeps_fp8_and_refuses_a_dtype_change(demo_model_dir: Path):
    req = request_for("flux")
    expected = reference_image(demo_model_dir, req)
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(live_replan=True))
    policy = build_policy({}, 0, stream_dtype="float8_e4m3fn")
    engine.load(policy)
    engine.replan(policy.with_resident_layers(3))
    assert np.array_equal(np.asarray(engine.generate(req).image), expected)
    engine.replan(policy.with_resident_layers(0))
    assert np.array_equal(np.asarray(engine.generate(req).image), expected)
    with pytest.raises(PolicyError, match="stream dtype"):
        engine.replan(build_policy({}, 0))
    engine.close()


@pytest.mark.slow
def test_modulation_opt_in_matches_a_resident_model_cast_the_same_way(demo_model_dir: Path):
    req = request_for("flux")
    expected = reference_image(demo_model_dir, req, modulation=True)
    assert not np.array_equal(expected, reference_image(demo_model_dir, req))  # the opt-in stores more in fp8
    engine = Engine(demo_model_dir, device="cpu")
    for layers in (0, 2):
        engine.load(build_policy({}, layers, stream_dtype="float8_e4m3fn", fp8_modulation=True))
        assert np.array_equal(np.asarray(engine.generate(req).image), expected), layers
        engine.unload()
    engine.close()


@pytest.mark.slow
def test_e5m2_matches_too(demo_model_dir: Path):
    req = request_for("flux")
    expected = reference_image(demo_model_dir, req, storage=torch.float8_e5m2)
    engine = Engine(demo_model_dir, device="cpu")
    engine.load(build_policy({}, 0, stream_dtype="float8_e5m2"))
    assert np.array_equal(np.asarray(engine.generate(req).image), expected)
    engine.close()


def test_the_selection_is_diffusers_own(demo_model_dir: Path):
    """Exactly the layers `enable_layerwise_casting` hooks; the opt-in adds the AdaLN linears only."""
    pipe = diffusers.FluxPipeline.from_pretrained(demo_model_dir, local_files_only=True)
    model = pipe.transformer
    ours = {name for name, _ in storage_leaves(model)}
    model.enable_layerwise_casting(storage_dtype=FP8, compute_dtype=torch.float32)
    hooked = {name for name, m in model.named_modules()
              if getattr(m, "_diffusers_hook", None) is not None and m._diffusers_hook.get_hook("layerwise_casting")}
    assert ours == hooked and ours
    extra = {name for name, _ in storage_leaves(model, modulation=True)} - ours
    assert extra and all(name.endswith(".linear") and "norm" in name for name in extra)
    assert not any("norm_q" in name or "norm_k" in name for name in extra)


@pytest.mark.slow
def test_arena_and_plan_hold_fp8_bytes(demo_model_dir: Path):
    model = discover_model(demo_model_dir)
    plain = make_plan(model, build_policy({}, 0))
    fp8 = make_plan(model, build_policy({}, 0, stream_dtype="float8_e4m3fn"))
    mod = make_plan(model, build_policy({}, 0, stream_dtype="float8_e4m3fn", fp8_modulation=True))
    assert fp8.stream_dtype == "float8_e4m3fn" and plain.stream_dtype is None
    streamed = [f.forecast.streamed_bytes_per_forward for f in (plain, fp8, mod)]
    assert streamed[0] > streamed[1] > streamed[2]
    assert fp8.forecast.upcast_scratch_bytes > 0 == plain.forecast.upcast_scratch_bytes
    engine = Engine(demo_model_dir, device="cpu")
    for plan in (plain, fp8, mod):
        report = engine.load(plan.policy)
        streamer = engine.placement.streamer
        assert isinstance(streamer, LayerwiseStreamer)
        # the arena holds each block as planned (regions aligned; on a CPU each tensor keeps its file's
        # address phase, offload/address_phase.py: within a page a tensor and a page a block)
        tensors = sum(1 for b in streamer._blocks for _ in b.bindings)
        slack = PAGE * (tensors + len(streamer._blocks))
        assert 0 <= report.block_host_bytes - plan.forecast.pinned_host_bytes + _staged(plan) <= slack
        assert report.streamed_bytes == pytest.approx(plan.forecast.streamed_bytes_per_forward, rel=0.02)
        engine.unload()
    engine.close()


def _staged(plan) -> int:
    return sum(c.host_bytes for c in plan.components if c.residency == "staged")


def fp8_checkpoint(demo: Path, out: Path) -> Path:
    """The demo model with its transformer's storage layers saved as F8_E4M3 (as fp8 checkpoints are)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(demo, out)
    model = diffusers.FluxTransformer2DModel.from_pretrained(demo / "transformer", local_files_only=True)
    chosen = {f"{name}.{p}" for name, leaf in storage_leaves(model) for p, _ in leaf.named_parameters()}
    for f in (out / "transformer").glob("*.safetensors"):
        tensors = load_file(f)
        save_file({k: v.to(FP8) if k in chosen else v for k, v in tensors.items()}, f, metadata={"format": "pt"})
    return out


@pytest.mark.slow
def test_an_fp8_checkpoint_streams_as_stored(demo_model_dir: Path, tmp_path: Path):
    path = fp8_checkpoint(demo_model_dir, tmp_path / "fp8")
    model = discover_model(path)
    assert "float8_e4m3fn" in model.dits[0].dtypes
    plan = make_plan(model, build_policy({}, 0))  # no flag: the checkpoint's fp8 is kept
    cast = make_plan(discover_model(demo_model_dir), build_policy({}, 0, stream_dtype="float8_e4m3fn"))
    assert plan.stream_dtype == "float8_e4m3fn"
    assert plan.forecast.streamed_bytes_per_forward == cast.forecast.streamed_bytes_per_forward
    req = request_for("flux")
    engine = Engine(path, device="cpu")
    report = engine.load(plan.policy)
    streamer = engine.placement.streamer
    assert {x.dtype for b in streamer._blocks for x in b.bindings} >= {FP8}  # 8-bit in the arena
    assert report.streamed_bytes == pytest.approx(plan.forecast.streamed_bytes_per_forward, rel=0.02)
    got = np.asarray(engine.generate(req).image)
    engine.close()
    # the same values as the full-precision checkpoint cast at load, and as diffusers' layerwise casting
    assert np.array_equal(got, reference_image(demo_model_dir, req))
    pipe = diffusers.FluxPipeline.from_pretrained(path, local_files_only=True, torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    pipe.transformer.enable_layerwise_casting(storage_dtype=FP8, compute_dtype=torch.float32)
    assert np.array_equal(got, np.asarray(pipe(**req.call_kwargs(pipe)).images[0]))


@pytest.mark.slow
@pytest.mark.parametrize("family,fixture,pipeline_name", [
    ("sd3", "sd3_model_dir", "StableDiffusion3Pipeline"),
    ("pixart_sigma", "pixart_model_dir", "PixArtSigmaPipeline"),
    ("wan", "wan_model_dir", "WanPipeline"),
])
def test_tiny_families_match_diffusers_layerwise_casting(request, family, fixture, pipeline_name, wan_loadable):
    """Each family's own skip patterns and float32 modules (Wan's) are diffusers' to decide."""
    path: Path = request.getfixturevalue(fixture)
    req = request_for(family)

    pipe = getattr(diffusers, pipeline_name).from_pretrained(path, local_files_only=True)
    plain = pipeline_image(pipe, req)
    pipe.transformer.enable_layerwise_casting(storage_dtype=FP8, compute_dtype=pipe.transformer.dtype)
    expected = pipeline_image(pipe, req)
    assert not np.array_equal(plain, expected)
    engine = Engine(path, device="cpu")
    for comps, layers in (({}, 0), ({"default": False}, 1)):
        engine.load(build_policy(comps, layers, stream_dtype="float8_e4m3fn"))
        assert np.array_equal(np.asarray(engine.generate(req).image), expected), (comps, layers)
        engine.unload()
    engine.close()


@pytest.mark.slow
def test_the_plan_says_how_much_the_demo_changes(demo_model_dir: Path):
    """The figures `storage_note` quotes are what the demo model gives (re-measured here)."""
    from omni_console.engine.demo.demo_model import DEMO_GENERATION
    from omni_console.engine.loading.stream_dtype import DEMO_DIFFERENCE, DEMO_PROMPT, storage_note

    def image(storage: torch.dtype | None) -> np.ndarray:
        pipe = diffusers.FluxPipeline.from_pretrained(demo_model_dir, local_files_only=True)
        pipe.set_progress_bar_config(disable=True)
        if storage is not None:
            pipe.transformer.enable_layerwise_casting(storage_dtype=storage, compute_dtype=torch.float32)
        out = pipe(prompt=DEMO_PROMPT, generator=torch.Generator().manual_seed(0), **DEMO_GENERATION)
        return np.asarray(out.images[0]).astype(int)

    plain = image(None)
    for name, (mean, top) in DEMO_DIFFERENCE.items():
        diff = np.abs(image(getattr(torch, name)) - plain)
        assert (round(float(diff.mean()), 2), int(diff.max())) == (mean, top), name
    note = storage_note("float8_e4m3fn", False)
    assert note is not None and "differ" in note and f"{DEMO_DIFFERENCE['float8_e4m3fn'][0]:.2f}" in note
