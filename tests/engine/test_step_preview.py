"""Step previews on the engine's side: every family with latent→RGB factors publishes one small latent per
step (tiny families, real diffusers pipelines), one without says "no preview", the latent layouts diffusers
packs come back as (C, h, w), and the output is bit-identical with previews on and off."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from tiny_families import FAMILY_GENERATION
from tiny_families_loading import LOADING_GENERATION

from omni_console.engine.engine import Engine
from omni_console.engine.events import StepPreview
from omni_console.engine.options import EngineOptions
from omni_console.engine.running.latent_rgb_table import LATENT_RGB
from omni_console.engine.running.runner import GenerateRequest
from omni_console.engine.running.step_preview import PREVIEW_SIDE, latent_image, shrink
from omni_console.offload.policy import build_policy


def request_of(generation: dict, *, output_type: str = "pil") -> GenerateRequest:
    gen = dict(generation)
    return GenerateRequest(prompt="a red fox in snow", steps=gen.pop("num_inference_steps"), height=gen.pop("height"),
                           width=gen.pop("width"), seed=7, frames=gen.pop("num_frames", None),
                           max_sequence_length=gen.pop("max_sequence_length", None), output_type=output_type,
                           extra=gen)


def run_with_previews(path, request: GenerateRequest, *, previews: bool = True):
    """One request on a loaded engine; its result and the StepPreview events it published."""
    engine = Engine(path, device="cpu", options=EngineOptions(step_previews=previews))
    seen: list[StepPreview] = []
    subscription = engine.bus.subscribe()
    try:
        engine.load(build_policy({}, 0))
        result = engine.generate(request, threading.Event())
        seen = [e for e in subscription.drain() if isinstance(e, StepPreview)]
    finally:
        engine.close()
    return result, seen


def test_table_rows_are_three_colours_per_channel():
    for name, (factors, bias) in LATENT_RGB.items():
        assert len(bias) == 3, name
        assert factors and all(len(row) == 3 for row in factors), name


def test_demo_model_publishes_one_flux_preview_per_step(demo_model_dir):
    request = request_of(FAMILY_GENERATION["flux"])
    result, seen = run_with_previews(demo_model_dir, request)
    assert [e.step for e in seen] == [1, 2]
    assert all(e.latent_format == "flux" and e.note == "" for e in seen)
    # 64 px / 8 = 8x8 latent of 16 channels, unpacked from Flux's 2x2 tokens
    assert all(e.latent.shape == (16, 8, 8) and e.latent.dtype == np.float32 for e in seen)
    assert len(seen[0].factors) == 16
    assert len(result.steps) == 2


def test_output_is_bit_identical_with_previews_on_and_off(demo_model_dir):
    request = request_of(FAMILY_GENERATION["flux"], output_type="np")
    on, seen = run_with_previews(demo_model_dir, request, previews=True)
    off, none = run_with_previews(demo_model_dir, request, previews=False)
    assert seen and not none
    assert np.array_equal(np.asarray(on.image), np.asarray(off.image))


def test_last_preview_is_the_latent_the_vae_decoded(demo_model_dir):
    """The preview reads the step's latents, not something else: the last one is the decoded latent, unpacked."""
    captured = {}
    request = request_of(FAMILY_GENERATION["flux"])
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(step_previews=True))
    subscription = engine.bus.subscribe()
    try:
        engine.load(build_policy({}, 0))
        original = engine.pipe.vae.decode
        engine.pipe.vae.decode = lambda z, *a, **k: (captured.setdefault("z", z.clone()), original(z, *a, **k))[1]
        engine.generate(request, threading.Event())
        last = [e for e in subscription.drain() if isinstance(e, StepPreview)][-1]
    finally:
        engine.close()
    scaling, shift = 0.3611, 0.1159  # the demo VAE's: the pipeline decoded z = latents / scaling + shift
    latents = (captured["z"] - shift) * scaling
    np.testing.assert_allclose(last.latent, latents[0].numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family,expected", [
    ("sd15", "sd15"),
    ("wan22_ti2v", "wan22"),
    ("mochi", "mochi"),
    pytest.param("wan22_a14b", "wan21", marks=pytest.mark.slow),
])
def test_family_with_factors_gets_previews(loading_family_dir, family, expected):
    request = request_of(LOADING_GENERATION[family])
    result, seen = run_with_previews(loading_family_dir(family), request)
    assert [e.latent_format for e in seen] == [expected] * len(result.steps)  # PNDM runs one step more
    factors, _ = LATENT_RGB[expected]
    assert all(e.latent.ndim == 3 and e.latent.shape[0] == len(factors) for e in seen)
    assert all(np.isfinite(e.latent).all() and float(np.abs(e.latent).sum()) > 0 for e in seen)


@pytest.mark.slow
@pytest.mark.parametrize("fixture,family,expected", [
    ("sd3_model_dir", "sd3", "sd3"),
    ("pixart_model_dir", "pixart_sigma", "sdxl"),  # PixArt-Sigma runs in SDXL's latent space
    ("wan_model_dir", "wan", "wan21"),
])
def test_more_families_get_previews(request, fixture, family, expected):
    result, seen = run_with_previews(request.getfixturevalue(fixture), request_of(FAMILY_GENERATION[family]))
    assert [e.latent_format for e in seen] == [expected] * len(result.steps)


def test_every_table_is_reachable_from_a_vae():
    from omni_console.engine.running.latent_format import VAE_RULES

    assert {rule[-1] for rule in VAE_RULES} == set(LATENT_RGB)
    for vae_class, channels, *_, name in VAE_RULES:
        assert len(LATENT_RGB[name][0]) == channels, (vae_class, name)


@pytest.mark.slow
def test_family_without_factors_says_no_preview(cogvideox_model_dir):
    _, seen = run_with_previews(cogvideox_model_dir, request_of(FAMILY_GENERATION["cogvideox"]))
    assert len(seen) == 1 and seen[0].latent is None
    assert seen[0].note.startswith("no preview: no latent→RGB factors for AutoencoderKLCogVideoX")


def test_flux_packing_comes_back_as_channels_rows_columns():
    from diffusers import FluxPipeline

    image = torch.randn(1, 16, 6, 10)  # a 48x80 px request: 6x10 latent, 3x5 tokens of 2x2
    packed = FluxPipeline._pack_latents(image, 1, 16, 6, 10)
    assert torch.equal(latent_image(packed, 16, height=48, width=80), image[0])


def test_ltx_packing_comes_back_as_the_middle_frame():
    from diffusers import LTXPipeline

    video = torch.randn(1, 128, 3, 4, 6)  # 3 latent frames of 4x6 (128x192 px at 32x)
    packed = LTXPipeline._pack_latents(video, 1, 1)
    assert torch.equal(latent_image(packed, 128, height=128, width=192, spatial_ratio=32), video[0, :, 1])


def test_video_layouts_give_the_middle_frame():
    video = torch.randn(1, 16, 5, 4, 4)
    assert torch.equal(latent_image(video, 16), video[0, :, 2])
    frames_first = video.permute(0, 2, 1, 3, 4)  # CogVideoX's (B, F, C, H, W)
    assert torch.equal(latent_image(frames_first, 16), video[0, :, 2])
    assert latent_image(torch.randn(1, 7, 4, 4), 16) is None


def test_shrink_bounds_the_long_side():
    small = shrink(torch.randn(16, 128, 96))
    assert small.shape == (16, PREVIEW_SIDE, 48) and small.dtype == torch.float32
    assert shrink(torch.randn(4, 8, 8)).shape == (4, 8, 8)
