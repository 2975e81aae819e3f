"""Image-to-image pipelines: what a request must carry, the strengths diffusers refuses or that run no step, and
progress counted to the steps the pipeline runs (a strength runs only its share of the asked steps).

The model directories are the demo Flux and the tiny SDXL with `model_index.json` naming their img2img
pipelines (the same components, as the hub's repos serve both).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from omni_console.engine.engine import Engine
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.policy import build_policy

PROMPT = "a red fox in the snow"


def _as(source: Path, target: Path, pipeline: str) -> Path:
    if not target.exists():
        shutil.copytree(source, target)
        index = json.loads((target / "model_index.json").read_text())
        index["_class_name"] = pipeline
        (target / "model_index.json").write_text(json.dumps(index, indent=2))
    return target


@pytest.fixture(scope="module")
def flux_img2img(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _as(demo_model_dir, tmp_path_factory.mktemp("img2img") / "flux", "FluxImg2ImgPipeline")


@pytest.fixture(scope="module")
def sdxl_img2img(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_families_unet import build_tiny_sdxl

    root = tmp_path_factory.mktemp("img2img")
    return _as(build_tiny_sdxl(root / "sdxl-built"), root / "sdxl", "StableDiffusionXLImg2ImgPipeline")


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ramp = np.linspace(0, 255, 64, dtype=np.uint8)
    pixels = np.stack([np.tile(ramp, (64, 1)), np.tile(ramp[:, None], (1, 64)), np.full((64, 64), 90, np.uint8)], -1)
    path = tmp_path_factory.mktemp("inputs") / "start.png"
    Image.fromarray(pixels, "RGB").save(path)
    return path


def _run(monkeypatch, capsys, *args: str) -> tuple[int, list[str], list[str]]:
    from omni_console.console.cli import main

    loads: list[str] = []
    monkeypatch.setattr(Engine, "load", lambda self, *a, **k: loads.append("load"))
    capsys.readouterr()
    code = main(["run", "--prompt", PROMPT, *args])
    return code, loads, capsys.readouterr().err.strip().splitlines()


def test_an_img2img_request_without_an_image_is_refused_before_load(flux_img2img, tmp_path, monkeypatch, capsys):
    """FluxImg2ImgPipeline's `image` defaults to None, and it fails on None after loading."""
    out = tmp_path / "o.png"
    code, loads, err = _run(monkeypatch, capsys, "--model", str(flux_img2img), "--steps", "2", "--output", str(out))
    assert code == 2 and loads == [] and len(err) == 1 and not out.exists()
    assert err[0].endswith("FluxImg2ImgPipeline needs image (pass --image FILE): it cannot run without it")


@pytest.mark.parametrize(("pipeline", "needed"), [
    ("FluxImg2ImgPipeline", {"image"}), ("StableDiffusionXLInpaintPipeline", {"image", "mask_image"}),
    ("LTX2ImageToVideoPipeline", {"image"}), ("FluxPipeline", set()),
    ("Kandinsky6TI2VAPipeline", set()),  # text or image to video: the image is optional
    ("StableDiffusionInstructPix2PixPipeline", {"image"}), ("StableDiffusionUpscalePipeline", {"image"}),
    ("QwenImageEditPlusPipeline", {"image"}), ("FluxFillPipeline", {"image", "mask_image"}),
    ("FluxKontextPipeline", set()),  # Kontext edits an image or makes one from text
    ("LTX2LatentUpsamplePipeline", {"video"}), ("LTX2DFRTemporalRefinePipeline", {"latents", "keyframes_latents"}),
])
def test_which_pipelines_need_an_image_they_default_to_none(pipeline, needed):
    import diffusers

    from omni_console.engine.running.call_inputs import _needed
    from omni_console.engine.running.call_options import call_signature

    assert hasattr(diffusers, pipeline)
    assert _needed(pipeline, call_signature(pipeline)) == needed


@pytest.mark.parametrize(("value", "line"), [
    ("1.5", "--param strength=1.5: must be between 0 and 1 (the share of the schedule that runs from the image)"),
    ("-0.1", "--param strength=-0.1: must be between 0 and 1 (the share of the schedule that runs from the image)"),
    ("0", "--param strength=0: FluxImg2ImgPipeline would run no denoising step (strength is the share of the "
          "steps that run)"),
])
def test_a_strength_diffusers_refuses_is_refused_before_load(value, line, flux_img2img, image, tmp_path, monkeypatch,
                                                             capsys):
    code, loads, err = _run(monkeypatch, capsys, "--model", str(flux_img2img), "--image", str(image), "--steps", "2",
                            "--param", f"strength={value}", "--output", str(tmp_path / "o.png"))
    assert code == 2 and loads == [] and len(err) == 1 and err[0].endswith(line), err


def test_sdxl_img2img_steps_its_default_strength_leaves_none_of_are_refused(sdxl_img2img, image, tmp_path,
                                                                             monkeypatch, capsys):
    """SDXL img2img keeps int(steps x 0.3) steps: 2 steps run none, and diffusers fails after loading."""
    code, loads, err = _run(monkeypatch, capsys, "--model", str(sdxl_img2img), "--image", str(image), "--steps", "2",
                            "--output", str(tmp_path / "o.png"))
    assert code == 2 and loads == [], err
    assert err[0].endswith("--steps 2 at strength 0.3: StableDiffusionXLImg2ImgPipeline would run no denoising step "
                           "(it runs int(steps × strength)); ask for at least 4 steps or a higher strength"), err


@settings(max_examples=200, deadline=None)
@given(steps=st.integers(1, 60), strength=st.floats(0, 1))
def test_steps_run_is_the_count_diffusers_own_get_timesteps_keeps(steps, strength):
    """Both roundings against the real `get_timesteps` of a pipeline that uses each, over a real scheduler."""
    from diffusers import (
        EulerDiscreteScheduler,
        FlowMatchEulerDiscreteScheduler,
        FluxImg2ImgPipeline,
        StableDiffusionXLImg2ImgPipeline,
    )

    from omni_console.engine.running.strength_steps import _rounding, steps_run

    for pipeline, scheduler in ((FluxImg2ImgPipeline, FlowMatchEulerDiscreteScheduler()),
                                (StableDiffusionXLImg2ImgPipeline, EulerDiscreteScheduler())):
        scheduler.set_timesteps(steps)
        owner = SimpleNamespace(scheduler=scheduler)
        timesteps, count = pipeline.get_timesteps(owner, steps, strength, "cpu")
        assert steps_run(_rounding(pipeline), steps, strength) == count == len(timesteps)


def test_the_roundings_are_read_from_each_pipelines_source():
    from diffusers import FluxImg2ImgPipeline, FluxPipeline, StableDiffusionImg2ImgPipeline

    from omni_console.engine.running.strength_steps import _rounding

    assert _rounding(FluxImg2ImgPipeline) == "up"
    assert _rounding(StableDiffusionImg2ImgPipeline) == "down"
    assert _rounding(FluxPipeline) is None


@pytest.mark.slow  # two loads and requests, and a plain pipeline call
def test_progress_counts_the_steps_a_strength_runs_and_the_output_is_plain_diffusers(flux_img2img, image):
    """4 steps at strength 0.6 run 3 (Flux rounds up): every step event says 3 in all, as the summary does."""
    from diffusers import DiffusionPipeline

    from omni_console.engine.events import StepTiming

    request = GenerateRequest(prompt=PROMPT, steps=4, height=64, width=64, seed=3, image=image,
                              params={"strength": 0.6}, output_type="np")
    pipe = DiffusionPipeline.from_pretrained(flux_img2img, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    expected = np.asarray(pipe(**request.call_kwargs(pipe)).images)
    engine = Engine(flux_img2img, device="cpu")
    try:
        for policy in (build_policy({}, 0), build_policy({}, 0, mode="resident")):
            sub = engine.bus.subscribe()
            engine.load(policy)
            result = engine.generate(request)
            engine.unload()
            steps = [e for e in sub.drain() if isinstance(e, StepTiming)]
            assert [(s.step, s.total_steps) for s in steps] == [(1, 3), (2, 3), (3, 3)]
            assert len(result.steps) == 3
            assert np.array_equal(np.asarray(result.image)[None], expected)
    finally:
        engine.close()


@pytest.mark.slow  # a load and a request
def test_progress_counts_the_steps_a_scheduler_adds(loading_family_dir):
    """SD 1.x's PNDM without PRK steps runs one more timestep than asked (2 asked: 3 run): progress says 3."""
    from omni_console.engine.events import StepTiming

    engine = Engine(loading_family_dir("sd15_no_checker"), device="cpu")
    try:
        sub = engine.bus.subscribe()
        engine.load(build_policy({}, 0))
        result = engine.generate(GenerateRequest(prompt=PROMPT, steps=2, height=32, width=32, output_type="np"))
        steps = [e for e in sub.drain() if isinstance(e, StepTiming)]
    finally:
        engine.close()
    assert len(result.steps) == 3 and [(s.step, s.total_steps) for s in steps] == [(1, 3), (2, 3), (3, 3)]


def test_a_fill_request_is_refused_before_load_naming_the_mask_no_flag_gives(demo_model_dir, tmp_path, monkeypatch,
                                                                               capsys):
    fill = _as(demo_model_dir, tmp_path / "fill", "FluxFillPipeline")
    code, loads, err = _run(monkeypatch, capsys, "--model", str(fill), "--steps", "2", "--output",
                            str(tmp_path / "o.png"))
    assert code == 2 and loads == [] and len(err) == 1
    assert err[0].endswith("FluxFillPipeline needs image (pass --image FILE), mask_image (cannot be given here): it "
                           "cannot run without them; not supported here"), err


def test_steps_are_timed_and_counted_without_a_hooked_denoiser(flux_img2img, image):
    """A denoiser DLO does not stream (Kandinsky 3's UNet, UniDiffuser's) gets no forward hook: each step is
    timed from the previous step's end, and the total is still the scheduled count (strength 0.6 of 4: 3)."""
    import threading

    import torch
    from diffusers import DiffusionPipeline

    from omni_console.engine.events import StepTiming
    from omni_console.engine.running.runner import run_pipeline
    from omni_console.offload.events import EventBus

    pipe = DiffusionPipeline.from_pretrained(flux_img2img, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    bus = EventBus()
    sub = bus.subscribe()
    request = GenerateRequest(prompt=PROMPT, steps=4, height=64, width=64, seed=3, image=image,
                              params={"strength": 0.6}, output_type="np")
    run_pipeline(pipe, request, bus=bus, request_id=1, device=torch.device("cpu"), dits=[], streamer=None,
                 cancel=threading.Event())
    steps = [e for e in sub.drain() if isinstance(e, StepTiming)]
    assert [(s.step, s.total_steps) for s in steps] == [(1, 3), (2, 3), (3, 3)]
    assert all(s.wall_s > 0 for s in steps[1:]), [s.wall_s for s in steps]
