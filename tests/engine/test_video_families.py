"""Video families through the engine against plain diffusers: Wan, LTX-Video, CogVideoX and LTX image-to-video.

For each, every frame the engine returns (output_type="np") is bit-identical to the plain pipeline's with the
same arguments, for three policies (everything staged with 0 resident layers; everything resident with 1
resident layer; the VAE resident with every layer resident), and there are as many frames as were asked for.
The oracle's call is written out by hand, so the request's mapping (frames -> num_frames, the image file ->
a PIL image, ...) is checked too.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_families import FAMILY_GENERATION

from omni_console.engine.engine import Engine
from omni_console.engine.errors import ConfigError
from omni_console.engine.events import RequestPhases
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.running.call_options import check_call
from omni_console.engine.running.request_checks import check_request
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.policy import build_policy

pytestmark = pytest.mark.slow  # end to end (runs every tiny video pipeline): .ci/run runs it, `pytest -q` skips it

PROMPT = "a red fox running in the snow"
NEGATIVE = "blurry"
SEED = 7

# family: (fixture, pipeline class, frames asked for, negative prompt sent)
FAMILIES = {
    "wan": ("wan_model_dir", "WanPipeline", 5, True),
    "ltx": ("ltx_model_dir", "LTXPipeline", 9, True),
    "cogvideox": ("cogvideox_model_dir", "CogVideoXPipeline", 9, False),
    "ltx_i2v": ("ltx_i2v_model_dir", "LTXImageToVideoPipeline", 9, False),
}


@pytest.fixture(scope="module")
def condition_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small, non-uniform RGBA PNG (the request must hand the pipeline RGB)."""
    ramp = np.linspace(0, 255, 32, dtype=np.uint8)
    pixels = np.stack([np.tile(ramp, (32, 1)), np.tile(ramp[:, None], (1, 32)), np.full((32, 32), 90, np.uint8),
                       np.full((32, 32), 255, np.uint8)], axis=-1)
    path = tmp_path_factory.mktemp("inputs") / "first-frame.png"
    Image.fromarray(pixels, "RGBA").save(path)
    return path


def video_request(family: str, image: Path | None) -> GenerateRequest:
    gen = FAMILY_GENERATION[family]
    _, _, frames, negative = FAMILIES[family]
    return GenerateRequest(prompt=PROMPT, steps=gen["num_inference_steps"], height=gen["height"], width=gen["width"],
                           seed=SEED, guidance=3.0, frames=frames, negative_prompt=NEGATIVE if negative else None,
                           max_sequence_length=gen["max_sequence_length"], image=image, output_type="np")


def plain_frames(path: Path, pipeline_name: str, request: GenerateRequest) -> np.ndarray:
    """The plain diffusers pipeline, no offload, called with the arguments written out."""
    import diffusers

    pipe = getattr(diffusers, pipeline_name).from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"prompt": request.prompt, "num_inference_steps": request.steps, "height": request.height,
              "width": request.width, "guidance_scale": request.guidance, "num_frames": request.frames,
              "max_sequence_length": request.max_sequence_length, "output_type": "np",
              "generator": torch.Generator("cpu").manual_seed(request.seed)}
    if request.negative_prompt is not None:
        kwargs["negative_prompt"] = request.negative_prompt
    if request.image is not None:
        kwargs["image"] = Image.open(request.image).convert("RGB")
    return pipe(**kwargs).frames[0]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_frame_is_bit_identical_to_plain_diffusers(request, family, condition_image, wan_loadable):
    fixture, pipeline_name, frames, _ = FAMILIES[family]
    path: Path = request.getfixturevalue(fixture)
    req = video_request(family, condition_image if family == "ltx_i2v" else None)
    engine = Engine(path, device="cpu")
    check_request(engine.model, req)
    check_call(engine.model, req)  # the request is one the pipeline takes as it is
    expected = plain_frames(path, pipeline_name, req)
    assert expected.shape == (frames, req.height, req.width, 3) and float(expected.std()) > 0
    sub = engine.bus.subscribe()
    policies = (({}, 0), ({"default": False}, 1), ({"vae": False}, engine.model.num_dit_blocks))
    for components, layers in policies:
        engine.load(build_policy(components, layers))
        result = engine.generate(req)
        engine.unload()
        assert result.is_video and len(result.frames) == frames, (components, layers)
        assert np.array_equal(np.stack(result.frames), expected), (components, layers)
        assert np.array_equal(result.image, expected[0])
    engine.close()
    phases = [e for e in sub.drain() if isinstance(e, RequestPhases)]
    assert [e.frames for e in phases] == [frames] * len(policies)
    assert phases[-1].latent_shape == result.latent_shape and phases[-1].phases == result.phases


def test_where_a_video_request_spent_its_time(ltx_model_dir: Path):
    engine = Engine(ltx_model_dir, device="cpu")
    engine.load(build_policy({}, 0))
    req = video_request("ltx", None)
    result = engine.generate(req)
    engine.close()
    assert set(result.phases) == {"text_encoding", "denoise", "vae_decode"}
    assert all(seconds > 0 for seconds in result.phases.values())
    steps_wall = sum(s.wall_s for s in result.steps)
    assert result.phases["denoise"] >= steps_wall * 0.99  # the steps are inside the denoise phase
    assert sum(result.phases.values()) <= result.seconds
    # the LTX VAE decodes (channels, latent frames, h, w): 9 frames at 8x temporal -> 2, 32 px at 8x -> 4
    vae = json.loads((ltx_model_dir / "vae" / "config.json").read_text())
    assert result.latent_shape == (1, vae["latent_channels"], 2, 4, 4)
    assert result.fps == 25.0  # LTXPipeline's frame_rate default
    assert result.vae_decode_peak_bytes is None  # measured on CUDA only


def test_an_image_pipeline_returns_one_frame_and_no_video(demo_model_dir: Path):
    engine = Engine(demo_model_dir, device="cpu")
    engine.load(build_policy({}, 0))
    gen = dict(FAMILY_GENERATION["flux"])
    req = GenerateRequest(prompt=PROMPT, steps=gen.pop("num_inference_steps"), height=64, width=64, extra=gen)
    result = engine.generate(req)
    engine.close()
    assert not result.is_video and result.frames == [result.image] and result.image.size == (64, 64)
    assert result.fps is None and len(result.latent_shape) == 4  # the AutoencoderKL's (1, C, h, w)
    assert {"text_encoding", "denoise", "vae_decode"} <= set(result.phases)


def test_cogvideox_text_length_is_refused_before_load_and_works_when_set(cogvideox_model_dir: Path):
    """The issue's tiny CogVideoX failed with "size of tensor a (274) must match"; now the default text length is
    refused before load, and the length the transformer takes runs."""
    model = discover_model(cogvideox_model_dir)
    with pytest.raises(ConfigError) as refused:
        check_call(model, GenerateRequest(prompt=PROMPT), {"max_sequence_length": "--max-sequence-length"})
    line = str(refused.value)
    assert "\n" not in line and "--max-sequence-length" in line and "226" in line and "16" in line
    check_call(model, GenerateRequest(prompt=PROMPT, max_sequence_length=16))
    engine = Engine(cogvideox_model_dir, device="cpu")
    engine.load(build_policy({}, 1))
    result = engine.generate(GenerateRequest(prompt=PROMPT, steps=1, height=32, width=32, frames=9,
                                             max_sequence_length=16))
    engine.close()
    assert len(result.frames) == 9 and result.frames[0].size == (32, 32)  # PIL frames by default
    assert result.fps == 8.0


def test_ltx_is_shortened_and_a_count_it_would_change_is_refused(ltx_model_dir: Path):
    model = discover_model(ltx_model_dir)
    with pytest.raises(ConfigError, match=r"--frames 5: LTXPipeline renders 8k\+1 frames .*e\.g\. 1 or 9"):
        check_call(model, GenerateRequest(prompt=PROMPT, frames=5), {"frames": "--frames"})
    import diffusers

    pipe = diffusers.LTXPipeline.from_pretrained(ltx_model_dir, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt=PROMPT, num_frames=5, num_inference_steps=1, height=32, width=32, max_sequence_length=16,
               output_type="np")
    assert out.frames.shape[1] == 1  # what plain diffusers does with 5 frames: one frame, without a word
    check_call(model, GenerateRequest(prompt=PROMPT, frames=17))


@pytest.mark.parametrize("builder,pipeline_name", [
    ("build_tiny_ltx", "LTXPipeline"),
    ("build_tiny_ltx_i2v", "LTXImageToVideoPipeline"),
    ("build_tiny_cogvideox", "CogVideoXPipeline"),
])
def test_new_tiny_families_are_deterministic_safetensors_dirs(tmp_path: Path, builder: str, pipeline_name: str):
    import tiny_families

    build = getattr(tiny_families, builder)
    root = build(tmp_path / "a", seed=0)
    index = json.loads((root / "model_index.json").read_text())
    assert index["_class_name"] == pipeline_name
    weights = sorted(root.rglob("*.safetensors"))
    assert weights and not [f for f in root.rglob("*") if f.suffix in (".bin", ".pt", ".pth", ".ckpt")]
    same, other = build(tmp_path / "b", seed=0), build(tmp_path / "c", seed=1)
    for f in weights:
        relative = f.relative_to(root)
        assert (same / relative).read_bytes() == f.read_bytes()
        assert (other / relative).read_bytes() != f.read_bytes()
    model = discover_model(root)
    assert {c.name: c.role for c in model.components if c.has_weights} == {
        "text_encoder": "encoder", "transformer": "dit", "vae": "vae"}
    assert model.num_dit_blocks == 3


# ----------------------------------------------------------------------------------------- the decode meter
class FakeAllocator:
    """torch.cuda's peak counter, driven by hand: `allocate` raises the peak since the last reset."""

    def __init__(self) -> None:
        self.now = self.peak = 0
        self.syncs = 0

    def allocate(self, nbytes: int) -> None:
        self.now += nbytes
        self.peak = max(self.peak, self.now)

    def free(self, nbytes: int) -> None:
        self.now -= nbytes

    def reset(self, _device=None) -> None:
        self.peak = self.now

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda _device=None: self.peak)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda _device=None: setattr(self, "syncs", self.syncs + 1))


@pytest.mark.parametrize("decode_bytes,request_peak", [(20, 100), (300, 640)])
def test_decode_peak_is_its_own_and_the_request_peak_is_kept(monkeypatch, decode_bytes, request_peak):
    """On CUDA the meter resets the peak counter for decode; the request's peak before it must survive."""
    from omni_console.engine.results import run_peak
    from omni_console.engine.running.request_phases import DecodeMeter
    from omni_console.engine.running.runner import RunOutput

    allocator = FakeAllocator()
    allocator.install(monkeypatch)
    meter = DecodeMeter(torch.device("cuda"))

    class Vae:
        def decode(self, latents, return_dict=False):
            allocator.allocate(decode_bytes)
            if latents.shape[2] > 1:
                self.decode(latents[:, :, :1])  # a nested call (tiling, framewise decoding) is part of this one
            allocator.free(decode_bytes)
            return latents

    vae = Vae()
    undo = meter.install(vae)
    allocator.allocate(100)  # denoise: the request's peak so far
    allocator.free(60)
    vae.decode(torch.zeros(1, 4, 3, 2, 2))
    undo()
    assert "decode" not in vars(vae)  # the wrapper is gone after the request
    assert meter.calls == 1 and meter.latent_shape == (1, 4, 3, 2, 2) and meter.seconds > 0
    assert meter.peak_before_decode == 100
    assert meter.peak_bytes == 40 + 2 * decode_bytes  # the nested call's bytes on top of the outer one's
    assert allocator.syncs == 2  # before and after the outermost call: device time, not enqueue time
    run = RunOutput(frames=[], is_video=True, steps=[], latent_shape=None, phases={}, vae_decode_peak_bytes=None,
                    peak_before_decode=meter.peak_before_decode)
    assert run_peak(run, allocator.peak) == request_peak


def test_the_meter_sits_outside_a_staged_vae_and_is_removed_after_a_failure():
    from omni_console.engine.running.request_phases import DecodeMeter

    calls: list[str] = []

    class Vae:
        def decode(self, latents):
            raise RuntimeError("decode failed")

    vae = Vae()
    staged = vae.decode

    def stager_wrapper(latents):  # what stage_around installs: an instance attribute
        calls.append("stage")
        return staged(latents)

    vae.decode = stager_wrapper
    meter = DecodeMeter(torch.device("cpu"))
    undo = meter.install(vae)
    with pytest.raises(RuntimeError, match="decode failed"):
        vae.decode(torch.zeros(1, 4, 2, 2))
    undo()
    assert vae.decode is stager_wrapper and calls == ["stage"] and meter.calls == 1
