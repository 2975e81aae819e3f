"""Marigold depth, normals and intrinsics: a prediction map, written as diffusers' exporters make it (depth 16-bit
grayscale, normals coloured, intrinsics one image per target, named in a note), from output bit-identical to plain
diffusers; every denoise step is counted once (Marigold nests its steps inside a loop over batches, both on
progress bars)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from omni_console.engine.errors import ConfigError
from omni_console.engine.running.output_notes import write_notes
from omni_console.engine.running.outputs import check_output, write_result
from omni_console.engine.running.pipeline_output import check_output_kind
from omni_console.engine.running.prediction_maps import MAP_NAME, depth_images


def test_map_pipelines_pass_the_output_check_and_embeddings_are_still_refused():
    from diffusers import (
        MarigoldDepthPipeline,
        MarigoldIntrinsicsPipeline,
        MarigoldNormalsPipeline,
        StableCascadePriorPipeline,
    )

    for pipeline in (MarigoldDepthPipeline, MarigoldNormalsPipeline, MarigoldIntrinsicsPipeline):
        check_output_kind(pipeline)
    with pytest.raises(ConfigError, match="StableCascadePriorPipeline returns image_embeddings"):
        check_output_kind(StableCascadePriorPipeline)


def test_a_note_names_the_map_each_numbered_file_holds(tmp_path):
    maps = []
    for name in ("albedo", "roughness"):
        image = Image.new("RGB", (4, 4))
        image.info[MAP_NAME] = name
        maps.append(image)
    assert write_notes(maps, check_output(tmp_path / "iid.png"), fps=None) == [
        "maps: iid-0001.png albedo, iid-0002.png roughness"]
    assert write_notes([Image.new("RGB", (4, 4))] * 2, check_output(tmp_path / "x.png"), fps=None) == []


def test_depth_is_written_in_16_bits_where_the_format_keeps_them(tmp_path):
    depth = np.linspace(0, 1, 6 * 5, dtype=np.float32).reshape(1, 6, 5, 1)
    (image,) = depth_images(depth)
    expected = (depth[0, ..., 0] * 65535).astype(np.uint16)  # export_depth_to_16bit_png's arithmetic
    assert image.mode == "I;16" and np.array_equal(np.asarray(image), expected)
    target = check_output(tmp_path / "depth.png")
    (written,) = write_result([image], target, fps=None)
    with Image.open(written) as back:
        assert back.mode == "I;16" and np.array_equal(np.asarray(back), expected)
    assert write_notes([image], target, fps=None) == []
    jpeg = check_output(tmp_path / "depth.jpg")
    assert write_notes([image], jpeg, fps=None) == [
        "depth.jpg: the output is 16-bit (a depth map), stored here in 8 bits (use .png or .tiff for all 16)"]
    with Image.open(write_result([image], jpeg, fps=None)[0]) as back:  # the high byte, not clipped to white
        pixels = np.asarray(back)[..., 0].astype(int)  # JPEG: within its rounding of the gradient
        assert back.mode == "RGB" and pixels[0, 0] <= 8 and pixels[-1, -1] >= 240 and 100 <= pixels[3, 0] <= 160


@pytest.fixture(scope="module")
def marigold_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tiny_families_marigold import make_marigold_pipeline

    from omni_console.engine.demo.demo_model import save_pipeline

    root = tmp_path_factory.mktemp("marigold")
    paths = {}
    for kind in ("depth", "normals", "intrinsics"):
        paths[kind] = root / kind
        save_pipeline(make_marigold_pipeline(0, kind), paths[kind])
    return paths


@pytest.mark.slow  # two loads and requests per kind, and a plain pipeline call
@pytest.mark.parametrize("kind", ["depth", "normals", "intrinsics"])
def test_the_map_is_plain_diffusers_prediction_exported(kind, marigold_dirs, tmp_path):
    from diffusers import DiffusionPipeline
    from diffusers.pipelines.marigold.marigold_image_processing import MarigoldImageProcessor

    from omni_console.engine.engine import Engine
    from omni_console.engine.events import StepTiming
    from omni_console.engine.running.runner import GenerateRequest
    from omni_console.offload.policy import build_policy

    image = tmp_path / "in.png"
    ramp = np.linspace(0, 255, 32, dtype=np.uint8)
    Image.fromarray(np.stack([np.tile(ramp, (24, 1))] * 3, -1), "RGB").save(image)
    request = GenerateRequest(prompt="", steps=2, seed=5, image=image)
    pipe = DiffusionPipeline.from_pretrained(marigold_dirs[kind], local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    prediction = pipe(**{**request.call_kwargs(pipe), "output_type": "np"}).prediction
    if kind == "intrinsics":
        expected = list(MarigoldImageProcessor.visualize_intrinsics(prediction, pipe.target_properties)[0].values())
        assert len(expected) == 4  # albedo, roughness, metallicity and the stacked material
    else:
        expected = depth_images(prediction) if kind == "depth" else MarigoldImageProcessor.visualize_normals(prediction)
    engine = Engine(marigold_dirs[kind], device="cpu")
    try:
        for policy in (build_policy({}, 0), build_policy({}, 0, mode="resident")):
            sub = engine.bus.subscribe()
            engine.load(policy)
            result = engine.generate(request)
            engine.unload()
            steps = [e for e in sub.drain() if isinstance(e, StepTiming)]
            assert [(s.step, s.total_steps) for s in steps] == [(1, 2), (2, 2)], policy
            assert [f.mode for f in result.frames] == [e.mode for e in expected]
            assert all(np.array_equal(np.asarray(f), np.asarray(e)) for f, e in zip(result.frames, expected,
                                                                                  strict=True)), policy
    finally:
        engine.close()
