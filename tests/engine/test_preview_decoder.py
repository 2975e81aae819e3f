"""`--preview-decoder PATH`: a TAESD-style decoder (diffusers' AutoencoderTiny safetensors) decodes each
step's latent into the picture the console shows; a bad file is one line and exit 2 before anything loads."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from tiny_families import FAMILY_GENERATION

from omni_console.engine.engine import Engine
from omni_console.engine.events import StepPreview
from omni_console.engine.options import EngineOptions
from omni_console.engine.running.preview_decoder import PreviewDecoderError, read_preview_decoder
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.policy import build_policy


def tiny_decoder_file(folder: Path, channels: int = 16) -> Path:
    """A random-weight AutoencoderTiny in diffusers' layout (the madebyollin/taesd* file layout)."""
    from diffusers import AutoencoderTiny

    torch.manual_seed(0)
    model = AutoencoderTiny(latent_channels=channels)
    path = folder / f"taesd-{channels}.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def test_the_decoder_decodes_like_diffusers_autoencoder_tiny(tmp_path):
    from diffusers import AutoencoderTiny

    path = tiny_decoder_file(tmp_path)
    decoder = read_preview_decoder(path)
    assert decoder.channels == 16
    torch.manual_seed(0)
    reference = AutoencoderTiny(latent_channels=16).eval()
    latent = torch.randn(16, 4, 6)
    with torch.no_grad():
        expected = reference.decode(latent[None]).sample[0]
    expected = ((expected.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 0)
    got = decoder.decode(latent)
    assert got.shape == (32, 48, 3) and torch.equal(got, expected)


def test_demo_model_previews_are_the_decoders_pictures(demo_model_dir, tmp_path):
    path = tiny_decoder_file(tmp_path)
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(step_previews=True, preview_decoder=str(path)))
    subscription = engine.bus.subscribe()
    gen = dict(FAMILY_GENERATION["flux"])
    request = GenerateRequest(prompt="a red fox", steps=gen.pop("num_inference_steps"), height=gen.pop("height"),
                              width=gen.pop("width"), seed=7, extra=gen)
    try:
        engine.load(build_policy({}, 0))
        engine.generate(request, threading.Event())
    finally:
        engine.close()
    seen = [e for e in subscription.drain() if isinstance(e, StepPreview)]
    assert [e.step for e in seen] == [1, 2]
    assert all(e.latent is None and e.rgb.shape == (64, 64, 3) and e.rgb.dtype == np.uint8 for e in seen)
    assert seen[0].latent_format == path.name


def test_a_decoder_for_other_latents_says_no_preview(demo_model_dir, tmp_path):
    path = tiny_decoder_file(tmp_path, channels=4)  # TAESD for SD 1.x; the demo is Flux (16 channels)
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(step_previews=True, preview_decoder=str(path)))
    subscription = engine.bus.subscribe()
    try:
        engine.load(build_policy({}, 0))
        engine.generate(GenerateRequest(prompt="x", steps=2, height=64, width=64, extra={"max_sequence_length": 32}),
                        threading.Event())
    finally:
        engine.close()
    [only] = [e for e in subscription.drain() if isinstance(e, StepPreview)]
    assert only.rgb is None and only.note == (f"no preview: {path.name} decodes 4 latent channels, this model's VAE "
                                              "has 16")


def bad_files(folder: Path) -> dict[str, tuple[Path, str]]:
    pickle = folder / "taesd.ckpt"
    pickle.write_bytes(b"\x80\x04 not loaded")
    short = folder / "short.safetensors"
    short.write_bytes(b"\x01\x02")
    huge = folder / "huge.safetensors"
    huge.write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    garbage = folder / "garbage.safetensors"
    garbage.write_bytes((20).to_bytes(8, "little") + b"not json at all!!!!!")
    other = folder / "other.safetensors"
    save_file({"weight": torch.zeros(2, 2)}, str(other))
    wrong = folder / "wrong.safetensors"
    save_file({"decoder.layers.0.weight": torch.zeros(64, 16, 3, 3)}, str(wrong))
    return {"pickle": (pickle, "not a .safetensors file"), "short": (short, "shorter than its header length"),
            "huge": (huge, "header claims"), "garbage": (garbage, ""), "other": (other, "no decoder.layers.0.weight"),
            "wrong": (wrong, "do not fit AutoencoderTiny's decoder"), "missing": (folder / "nope.safetensors", ""),
            "folder": (folder, "not a .safetensors file")}


@pytest.mark.parametrize("case", ["pickle", "short", "huge", "garbage", "other", "wrong", "missing", "folder"])
def test_a_bad_file_is_one_line(tmp_path, case):
    path, words = bad_files(tmp_path)[case]
    with pytest.raises(PreviewDecoderError) as caught:
        read_preview_decoder(path)
    message = str(caught.value)
    assert message.startswith(f"--preview-decoder {path}") and "\n" not in message and words in message


def test_the_console_refuses_a_bad_decoder_with_exit_2_before_loading(demo_model_dir, tmp_path, capsys):
    from omni_console.console.cli import main

    bad = tmp_path / "taesd.ckpt"
    bad.write_bytes(b"\x80\x04")
    code = main(["console", "--model", str(demo_model_dir), "--preview-decoder", str(bad)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--preview-decoder" in err[0] and "not a .safetensors file" in err[0]
