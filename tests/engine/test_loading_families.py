"""Families whose directory says more than its components, through the engine against plain diffusers.

The oracle is `DiffusionPipeline.from_pretrained(dir)` with the same prompt, seed and size; every frame
(output_type="np") must be bit-identical under every policy. Wan 2.2 A14B must run both experts as
diffusers does (counted forwards), Wan 2.2 TI2V-5B must render image-to-video (`expand_timesteps`), and
SD1.5 must load with its hub-layout safety checker and without one (`[null, null]`).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_families_loading import LOADING_GENERATION, stand_in_for_ftfy

from omni_console.engine.engine import Engine
from omni_console.engine.planning.experts import blocks_per_forward
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.policy import build_policy

PROMPT = "a red fox running in the snow"
NEGATIVE = "blurry"
SEED = 7
IMAGE_FAMILIES = ("wan22_ti2v_i2v", "wan21_i2v")
FAST = ("wan22_a14b", "wan22_ti2v", "wan22_ti2v_i2v", "sd15", "sd15_no_checker", "mochi")
SLOW = ("wan21_i2v", "hunyuan_video", "chroma", "sana", "qwen_image")


@pytest.fixture(autouse=True)
def wan_i2v_without_ftfy(monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in_for_ftfy(monkeypatch, "diffusers.pipelines.wan.pipeline_wan_i2v")


@pytest.fixture(scope="module")
def first_frame(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ramp = np.linspace(0, 255, 32, dtype=np.uint8)
    pixels = np.stack([np.tile(ramp, (32, 1)), np.tile(ramp[:, None], (1, 32)), np.full((32, 32), 90, np.uint8)],
                      axis=-1)
    path = tmp_path_factory.mktemp("inputs") / "first-frame.png"
    Image.fromarray(pixels, "RGB").save(path)
    return path


def family_request(family: str, image: Path | None) -> GenerateRequest:
    gen = dict(LOADING_GENERATION[family])
    return GenerateRequest(prompt=PROMPT, steps=gen.pop("num_inference_steps"), height=gen.pop("height"),
                           width=gen.pop("width"), seed=SEED, guidance=3.0, frames=gen.pop("num_frames", None),
                           negative_prompt=NEGATIVE, max_sequence_length=gen.pop("max_sequence_length", None),
                           image=image if family in IMAGE_FAMILIES else None, output_type="np", extra=gen)


def count_forwards(pipe, names: tuple[str, ...]) -> tuple[dict[str, int], list]:
    counts = dict.fromkeys(names, 0)
    handles = []
    for name in names:
        module = getattr(pipe, name, None)
        if module is not None:
            def hook(_module, _args, name=name):
                counts[name] += 1
            handles.append(module.register_forward_pre_hook(hook))
    return counts, handles


def plain_output(path: Path, request: GenerateRequest, experts: tuple[str, ...] = ()) -> tuple[np.ndarray, dict]:
    """What plain `DiffusionPipeline.from_pretrained(dir)` renders, and its experts' forward counts."""
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    counts, handles = count_forwards(pipe, experts)
    out = pipe(**request.call_kwargs(pipe))
    for h in handles:
        h.remove()
    return np.asarray(out.frames[0] if hasattr(out, "frames") else out.images), counts


def engine_output(result) -> np.ndarray:
    return np.stack(result.frames) if result.is_video else np.asarray(result.image)[None]


def policies(engine: Engine) -> list:
    """Five policies: all staged and streamed; all resident with 1 layer; VAE resident with every layer;
    spread placement; diffusers-like resident mode."""
    layers = blocks_per_forward(engine.model)  # with two experts (Wan 2.2 A14B): one expert's blocks
    return [build_policy({}, 0), build_policy({"default": False}, min(1, layers)), build_policy({"vae": False}, layers),
            build_policy({}, min(1, layers), placement="spread"), build_policy({}, 0, mode="resident")]


def assert_bit_identical(path: Path, request: GenerateRequest, experts: tuple[str, ...] = ()) -> dict:
    expected, plain_counts = plain_output(path, request, experts)
    assert float(expected.std()) > 0
    engine = Engine(path, device="cpu")
    seen = []
    try:
        for policy in policies(engine):
            engine.load(policy)
            counts, handles = count_forwards(engine.pipe, experts)
            result = engine.generate(request, threading.Event())  # with the cancel hooks, as `run` has them
            for h in handles:
                h.remove()
            engine.unload()
            got = engine_output(result)
            assert got.shape[-3:] == expected.shape[-3:], policy
            assert np.array_equal(got.reshape(expected.shape), expected), policy
            seen.append(counts)
    finally:
        engine.close()
    assert all(counts == plain_counts for counts in seen), (seen, plain_counts)
    return plain_counts


@pytest.mark.slow
@pytest.mark.parametrize("family", [*FAST, *(pytest.param(f, marks=pytest.mark.slow) for f in SLOW)])
def test_family_is_bit_identical_to_from_pretrained(family: str, loading_family_dir, first_frame: Path):
    path = loading_family_dir(family)
    assert_bit_identical(path, family_request(family, first_frame))


@pytest.mark.slow
def test_wan22_a14b_runs_both_experts_as_diffusers_does(loading_family_dir):
    """boundary_ratio 0.875 over 4 steps: the high-noise expert for the first steps, the low-noise one after;
    with guidance each step calls its expert twice (conditional, unconditional)."""
    path = loading_family_dir("wan22_a14b")
    counts = assert_bit_identical(path, family_request("wan22_a14b", None), ("transformer", "transformer_2"))
    assert counts["transformer"] > 0 and counts["transformer_2"] > 0
    assert counts["transformer"] + counts["transformer_2"] == 2 * LOADING_GENERATION["wan22_a14b"][
        "num_inference_steps"]


@pytest.mark.slow
def test_pipeline_values_reach_the_pipeline(loading_family_dir):
    """Saved pipeline-level values are the built pipeline's config, as from_pretrained leaves them."""
    for family, values in (("wan22_a14b", {"boundary_ratio": 0.875, "expand_timesteps": False}),
                           ("wan22_ti2v", {"expand_timesteps": True}),
                           ("sd15_no_checker", {"requires_safety_checker": False}),
                           ("mochi", {"force_zeros_for_empty_prompt": True})):
        engine = Engine(loading_family_dir(family), device="cpu")
        engine.load(build_policy({}, 0))
        try:
            for key, value in values.items():
                assert engine.pipe.config[key] == value, (family, key)
        finally:
            engine.close()


@pytest.mark.slow
def test_null_components_are_none_and_the_hub_safety_checker_loads(loading_family_dir):
    engine = Engine(loading_family_dir("sd15_no_checker"), device="cpu")
    engine.load(build_policy({}, 0))
    assert engine.pipe.safety_checker is None and engine.pipe.feature_extractor is None
    engine.close()
    engine = Engine(loading_family_dir("sd15"), device="cpu")
    assert engine.model.component("safety_checker").library == "stable_diffusion"
    engine.load(build_policy({}, 0))
    assert type(engine.pipe.safety_checker).__name__ == "StableDiffusionSafetyChecker"
    engine.close()


@torch.no_grad()
def test_loaded_modules_are_left_as_from_pretrained_leaves_them(loading_family_dir):
    """Same training flag and requires_grad on every parameter as diffusers' own load (Mochi's VAE decoded
    3.6e-7 differently once the loader had switched requires_grad off)."""
    from diffusers import DiffusionPipeline

    path = loading_family_dir("mochi")
    plain = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    engine = Engine(path, device="cpu")
    engine.load(build_policy({}, 0))
    try:
        for name, component in plain.components.items():
            if isinstance(component, torch.nn.Module):
                ours = getattr(engine.pipe, name)
                assert ours.training == component.training, name
                assert {n: p.requires_grad for n, p in ours.named_parameters()} == \
                    {n: p.requires_grad for n, p in component.named_parameters()}, name
    finally:
        engine.close()
