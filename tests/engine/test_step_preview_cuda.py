"""Step previews on CUDA: the side stream's copy publishes every step's latent (the same values the CPU
path gives for the same latent), and the output stays bit-identical with previews on and off."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from tiny_families import FAMILY_GENERATION

from omni_console.engine.engine import Engine
from omni_console.engine.events import StepPreview
from omni_console.engine.options import EngineOptions
from omni_console.engine.running.latent_format import LatentFormat
from omni_console.engine.running.latent_rgb_table import LATENT_RGB
from omni_console.engine.running.runner import GenerateRequest
from omni_console.engine.running.step_preview import StepPreviewer
from omni_console.offload.events import EventBus
from omni_console.offload.policy import build_policy

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


def test_side_stream_copy_matches_the_cpu_path():
    bus = EventBus()
    subscription = bus.subscribe()
    factors, bias = LATENT_RGB["sd3"]
    fmt = LatentFormat("sd3", factors, bias)
    latents = torch.randn(1, 16, 128, 96, generator=torch.Generator().manual_seed(0))
    cuda = StepPreviewer(bus, 1, 2, torch.device("cuda"), fmt)
    cuda.capture(1, latents.cuda())
    cuda.close()
    cpu = StepPreviewer(bus, 2, 2, torch.device("cpu"), fmt)
    cpu.capture(1, latents)
    on_gpu, on_cpu = [e for e in subscription.drain() if isinstance(e, StepPreview)]
    assert on_gpu.latent.shape == on_cpu.latent.shape == (16, 64, 48)
    np.testing.assert_allclose(on_gpu.latent, on_cpu.latent, rtol=1e-5, atol=1e-5)


def run(path, previews: bool):
    engine = Engine(path, device="cuda", options=EngineOptions(step_previews=previews))
    subscription = engine.bus.subscribe()
    gen = dict(FAMILY_GENERATION["flux"])
    request = GenerateRequest(prompt="a red fox", steps=4, height=gen.pop("height"), width=gen.pop("width"), seed=3,
                              output_type="np", extra={k: v for k, v in gen.items() if k != "num_inference_steps"})
    try:
        engine.load(build_policy({}, 0))
        result = engine.generate(request, threading.Event())
    finally:
        engine.close()
    return np.asarray(result.image), [e for e in subscription.drain() if isinstance(e, StepPreview)]


def test_streamed_flux_output_is_bit_identical_with_previews_on_cuda(demo_model_dir):
    on, seen = run(demo_model_dir, True)
    off, none = run(demo_model_dir, False)
    assert np.array_equal(on, off)
    assert not none
    assert seen and seen[-1].step == 4  # the last step is always published (close() waits for it)
    assert [e.step for e in seen] == sorted({e.step for e in seen})  # newest wins: maybe fewer, never out of order


def test_a_preview_decoder_runs_on_the_side_stream_and_matches_the_cpu(tmp_path):
    from test_preview_decoder import tiny_decoder_file

    from omni_console.engine.running.preview_decoder import read_preview_decoder

    path = tiny_decoder_file(tmp_path)
    bus = EventBus()
    subscription = bus.subscribe()
    latents = torch.randn(1, 16, 24, 24, generator=torch.Generator().manual_seed(1))
    cuda = StepPreviewer(bus, 1, 1, torch.device("cuda"), None, decoder=read_preview_decoder(path))
    cuda.capture(1, latents.cuda())
    cuda.close()
    StepPreviewer(bus, 2, 1, torch.device("cpu"), None, decoder=read_preview_decoder(path)).capture(1, latents)
    on_gpu, on_cpu = [e for e in subscription.drain() if isinstance(e, StepPreview)]
    assert on_gpu.rgb.shape == on_cpu.rgb.shape == (192, 192, 3)
    assert np.abs(on_gpu.rgb.astype(int) - on_cpu.rgb.astype(int)).max() <= 2  # TF32/cuDNN vs CPU rounding
