"""A pipeline that splits an image into layers (Qwen-Image-Layered) returns [batch][layer]: each layer is a still
of its own, written as a numbered sequence, bit-identical to plain diffusers. Layers with alpha keep it where
the format can (PNG, WebP, TIFF), and a format that cannot says so. An RGBA VAE gets an RGBA conditioning image."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from omni_console.engine.running.output_notes import write_notes
from omni_console.engine.running.outputs import check_output, write_result
from omni_console.engine.running.pipeline_output import first_item_frames
from omni_console.engine.running.runner import GenerateRequest, condition_image_mode


def _rgba(value: int) -> Image.Image:
    pixels = np.zeros((8, 6, 4), np.uint8)
    pixels[..., 0], pixels[..., 3] = value, np.arange(6, dtype=np.uint8)[None, :] * 40
    return Image.fromarray(pixels, "RGBA")


def test_layers_of_the_first_item_are_its_frames_and_plain_images_stay_one():
    layers = [_rgba(10), _rgba(20), _rgba(30)]
    frames, video = first_item_frames(SimpleNamespace(images=[layers, [_rgba(99)]]))
    assert frames == layers and not video
    arrays = np.zeros((2, 4, 4, 3), np.float32)  # output_type="np": the item's layers as one NHWC array
    frames, _ = first_item_frames(SimpleNamespace(images=[arrays]))
    assert len(frames) == 2 and frames[0].shape == (4, 4, 3)
    batch = np.zeros((3, 4, 4, 3), np.float32)  # an ordinary image pipeline's batch: its first image only
    frames, _ = first_item_frames(SimpleNamespace(images=batch))
    assert len(frames) == 1 and frames[0].shape == (4, 4, 3)
    one = Image.new("RGB", (4, 4))
    assert first_item_frames(SimpleNamespace(images=[one, one]))[0] == [one]


def test_rgba_layers_keep_their_alpha_in_png_and_a_jpeg_says_it_drops_it(tmp_path):
    layers = [_rgba(10), _rgba(200)]
    target = check_output(tmp_path / "layers.png")
    written = write_result(layers, target, fps=None)
    assert [p.name for p in written] == ["layers-0001.png", "layers-0002.png"]
    for path, layer in zip(written, layers, strict=True):
        with Image.open(path) as back:
            assert back.mode == "RGBA" and np.array_equal(np.asarray(back), np.asarray(layer))
    assert write_notes(layers, target, fps=None) == []
    jpeg = check_output(tmp_path / "flat.jpg")
    notes = write_notes(layers, jpeg, fps=None)
    assert notes == ["flat.jpg: the output has an alpha channel, which this format does not keep (use .png, .webp "
                     "or .tiff)"]
    with Image.open(write_result(layers, jpeg, fps=None)[0]) as back:
        assert back.mode == "RGB"
    floats = [np.asarray(layer, np.float32) / 255 for layer in layers]  # output_type="np" RGBA
    with Image.open(write_result(floats, check_output(tmp_path / "f.png"), fps=None)[1]) as back:
        assert back.mode == "RGBA" and np.array_equal(np.asarray(back), np.asarray(layers[1]))


def test_an_rgba_vae_gets_an_rgba_conditioning_image(tmp_path):
    path = tmp_path / "in.png"
    _rgba(50).save(path)

    class Pipe:
        def __init__(self, **config):
            self.vae = SimpleNamespace(config=SimpleNamespace(**config))

        def __call__(self, prompt=None, image=None, output_type="pil", generator=None):
            pass

    request = GenerateRequest(prompt="p", image=path)
    assert condition_image_mode(Pipe(input_channels=4)) == "RGBA"
    assert request.call_kwargs(Pipe(input_channels=4))["image"].mode == "RGBA"
    assert request.call_kwargs(Pipe(input_channels=3))["image"].mode == "RGB"
    assert request.call_kwargs(Pipe(in_channels=3))["image"].mode == "RGB"


@pytest.fixture(scope="module")
def layered_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_families_layered import make_qwen_image_layered_pipeline

    from omni_console.engine.demo.demo_model import save_pipeline

    path = tmp_path_factory.mktemp("layered") / "qwen-image-layered"
    save_pipeline(make_qwen_image_layered_pipeline(0, channels=3), path)
    return path


@pytest.mark.slow  # 640² (the pipeline's smallest bucket): about 40 s a request on a 2-core CPU
def test_each_layer_is_a_frame_bit_identical_to_plain_diffusers(layered_dir, tmp_path):
    from diffusers import DiffusionPipeline
    from tiny_families_layered import LAYERED_GENERATION

    from omni_console.engine.engine import Engine
    from omni_console.offload.policy import build_policy

    image = tmp_path / "in.png"
    Image.new("RGB", (32, 32), (120, 40, 200)).save(image)
    gen = dict(LAYERED_GENERATION)
    request = GenerateRequest(prompt="dance monkey", steps=gen.pop("num_inference_steps"), seed=7, image=image,
                              max_sequence_length=gen.pop("max_sequence_length"), params=gen, output_type="np")
    pipe = DiffusionPipeline.from_pretrained(layered_dir, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    expected = np.asarray(pipe(**request.call_kwargs(pipe)).images[0])
    assert expected.shape[0] == LAYERED_GENERATION["layers"]
    engine = Engine(layered_dir, device="cpu")
    try:
        engine.load(build_policy({}, 0))
        result = engine.generate(request)
    finally:
        engine.close()
    assert not result.is_video and np.array_equal(np.stack(result.frames), expected)
