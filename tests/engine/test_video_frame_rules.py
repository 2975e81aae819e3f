"""Frame and size rules of the video families, against what plain diffusers renders.

For each family the pre-load checks (`check_request`, `check_call`) must accept exactly the frame counts and
sizes that `DiffusionPipeline.from_pretrained(dir)` renders as asked, and refuse the others: those diffusers
fails on after the load, and those it renders at another count or size (Mochi's and HunyuanVideo's counts,
Wan 2.2 TI2V's sizes) without a word. The oracle is the shape of the plain pipeline's output; nothing here
is read from the engine's own rules.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_families_loading import LOADING_GENERATION, stand_in_for_ftfy

from omni_console.engine.errors import ConfigError
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.running.call_options import check_call
from omni_console.engine.running.frame_counts import frames_rule
from omni_console.engine.running.request_checks import check_request
from omni_console.engine.running.runner import GenerateRequest

# family: (frame counts, (height, width) sizes) rendered with plain diffusers
CASES: dict[str, tuple[tuple[int, ...], tuple[tuple[int, int], ...]]] = {
    "mochi": ((1, 2, 6, 7, 8, 12, 13), ((16, 16), (24, 24), (16, 24), (32, 48), (8, 8), (20, 20))),
    "hunyuan_video": ((1, 3, 4, 5, 6, 8, 9), ((16, 16), (16, 32), (48, 16), (24, 24), (8, 8))),
    "wan22_ti2v": ((1, 2, 5, 6, 9), ((32, 32), (64, 32), (48, 48), (16, 16))),
    "wan22_ti2v_i2v": ((1, 5, 6), ((32, 32), (48, 48))),
    "wan21_i2v": ((1, 5, 6, 8), ((32, 32), (48, 48), (16, 16), (24, 24))),
}
IMAGE_FAMILIES = ("wan22_ti2v_i2v", "wan21_i2v")


@pytest.fixture(autouse=True)
def wan_i2v_without_ftfy(monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in_for_ftfy(monkeypatch, "diffusers.pipelines.wan.pipeline_wan_i2v")


def verdict(model, family: str, **fields) -> str | None:
    """None when the pre-load checks accept the request, else their one line."""
    gen = LOADING_GENERATION[family]
    request = GenerateRequest(prompt="a fox", max_sequence_length=gen.get("max_sequence_length"), **fields)
    try:
        check_request(model, request)
        check_call(model, request)
    except ConfigError as refused:
        line = str(refused)
        assert "\n" not in line
        return line
    return None


def rendered(pipe, family: str, **overrides) -> tuple[int, ...] | None:
    """(frames, height, width) plain diffusers renders; None when it fails."""
    gen = {**LOADING_GENERATION[family], "num_inference_steps": 2, **overrides}
    if family in IMAGE_FAMILIES:
        ramp = np.linspace(0, 255, 32, dtype=np.uint8)
        gen["image"] = Image.fromarray(np.stack([np.tile(ramp, (32, 1))] * 3, axis=-1), "RGB")
    try:
        out = pipe(prompt="a fox", output_type="np", generator=torch.Generator().manual_seed(0), **gen)
    except (RuntimeError, ValueError, ZeroDivisionError):
        return None
    return tuple(np.asarray(out.frames[0]).shape[:3])


def test_mochi_and_hunyuan_video_frame_rules_are_stated(loading_family_dir):
    mochi, hunyuan = discover_model(loading_family_dir("mochi")), discover_model(loading_family_dir("hunyuan_video"))
    assert frames_rule(mochi).step == 6 and frames_rule(hunyuan).step == 4
    assert verdict(mochi, "mochi", frames=8) == ("frames 8: MochiPipeline renders 6k+1 frames (its temporal factor "
                                                 "is 6); e.g. 7 or 13")
    assert verdict(hunyuan, "hunyuan_video", frames=6) == ("frames 6: HunyuanVideoPipeline renders 4k+1 frames "
                                                           "(its VAE's temporal compression is 4); e.g. 5 or 9")
    assert verdict(mochi, "mochi", frames=19) is None and verdict(hunyuan, "hunyuan_video", frames=129) is None


@pytest.mark.slow  # one plain pipeline call per frame count and size
@pytest.mark.parametrize("family", list(CASES))
def test_accepted_exactly_where_diffusers_renders_as_asked(family, loading_family_dir, wan_loadable, tmp_path):
    from diffusers import DiffusionPipeline

    image = None  # an image-to-video request names its image, as `run --image` does
    if family in IMAGE_FAMILIES:
        image = tmp_path / "first.png"
        Image.new("RGB", (32, 32), (90, 120, 200)).save(image)

    path = loading_family_dir(family)
    model = discover_model(path)
    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    gen = LOADING_GENERATION[family]
    frame_counts, sizes = CASES[family]
    seen = []
    for frames in frame_counts:
        shape = rendered(pipe, family, num_frames=frames)
        assert shape is not None, (family, frames)  # any count renders: the question is how many frames
        accepted = verdict(model, family, frames=frames, image=image) is None
        assert accepted == (shape[0] == frames), (family, frames, shape)
        seen.append(accepted)
    for height, width in sizes:
        shape = rendered(pipe, family, height=height, width=width)
        accepted = verdict(model, family, height=height, width=width, image=image) is None
        assert accepted == (shape == (gen["num_frames"], height, width)), (family, height, width, shape)
        seen.append(accepted)
    assert True in seen and False in seen  # each family's cases cover both sides of its rule
