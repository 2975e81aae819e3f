"""Each pipeline's output is read by its declared output class; a pipeline that returns no picture is
refused before load; a call input the CLI cannot give is refused before load, named."""

from __future__ import annotations

import numpy as np
import pytest

from omni_console.engine.errors import ConfigError
from omni_console.engine.running.call_inputs import check_required_inputs
from omni_console.engine.running.call_options import OPTION_LABELS, call_signature
from omni_console.engine.running.pipeline_output import check_output_kind, first_item_frames

LABELS = {**OPTION_LABELS, "image": "--image", "param": "--param"}


@pytest.mark.slow  # the first diffusers import of the module
def test_stable_cascade_prior_is_refused_saying_it_returns_image_embeddings():
    from diffusers import StableCascadePriorPipeline

    with pytest.raises(ConfigError) as refused:
        check_output_kind(StableCascadePriorPipeline)
    line = str(refused.value)
    assert line.startswith("StableCascadePriorPipeline returns image_embeddings")
    assert "not an image or a video" in line and "\n" not in line


@pytest.mark.parametrize("name", ["Kandinsky5T2IPipeline", "FluxPipeline", "WanPipeline",
                                  "StableCascadeDecoderPipeline"])
def test_pipelines_returning_pictures_pass(name):
    import diffusers

    check_output_kind(getattr(diffusers, name))


def test_kandinsky5_t2i_output_is_read_from_its_image_field():
    from diffusers.pipelines.kandinsky5.pipeline_output import KandinskyImagePipelineOutput

    picture = np.full((16, 16, 3), 0.5, np.float32)
    frames, is_video = first_item_frames(KandinskyImagePipelineOutput(image=np.stack([picture])))
    assert not is_video and len(frames) == 1 and np.array_equal(frames[0], picture)


def test_wan_animate_is_refused_naming_the_videos_it_needs():
    with pytest.raises(ConfigError) as refused:
        check_required_inputs("WanAnimatePipeline", call_signature("WanAnimatePipeline"), {"image"}, LABELS)
    line = str(refused.value)
    assert "pose_video (cannot be given here)" in line and "face_video (cannot be given here)" in line
    assert line.endswith("not supported here") and "image" not in line.split("needs")[1].split(":")[0]


def test_an_image_to_video_pipeline_without_its_image_is_told_to_pass_one():
    with pytest.raises(ConfigError, match=r"WanImageToVideoPipeline needs image \(pass --image FILE\)"):
        check_required_inputs("WanImageToVideoPipeline", call_signature("WanImageToVideoPipeline"), set(), LABELS)
    check_required_inputs("WanImageToVideoPipeline", call_signature("WanImageToVideoPipeline"), {"image"}, LABELS)


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("kind", ["np", "pil"])
def test_a_video_is_read_batched_or_as_one_unbatched_video(batched, kind):
    """A video field is [batch][frame]; SANA-WM's holds one video's frames, unbatched (a 4-d array, or a list
    of PIL images): every frame either way, never the rows of the first frame."""
    from types import SimpleNamespace

    from PIL import Image

    video = np.random.default_rng(0).random((9, 4, 6, 3)).astype(np.float32)
    frames = [Image.fromarray((f * 255).astype(np.uint8)) for f in video] if kind == "pil" else video
    field = ([frames] if kind == "pil" else frames[None]) if batched else frames
    got, is_video = first_item_frames(SimpleNamespace(frames=field))
    assert is_video and len(got) == 9
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(got, frames, strict=True))
