"""Pipeline options checked against the pipeline's own call signature before load: one line per refusal,
"did you mean" for a misspelt parameter, frame counts each video family renders exactly, conditioning images,
and nothing sent that the operator did not set."""

from __future__ import annotations

import json
import math
import string
from pathlib import Path
from typing import Any, Optional, Union

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from omni_console.engine.errors import ConfigError
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.running.call_options import (
    accepted_options,
    check_call,
    default_fps,
    value_fits,
)
from omni_console.engine.running.frame_counts import frames_rule
from omni_console.engine.running.param_syntax import parse_param
from omni_console.engine.running.runner import GenerateRequest

FLAGS = {"frames": "--frames", "negative_prompt": "--negative-prompt", "max_sequence_length": "--max-sequence-length",
         "image": "--image", "param": "--param", "steps": "--steps", "guidance": "--guidance"}


@pytest.fixture(scope="module")
def png(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("inputs") / "frame.png"
    Image.new("RGBA", (40, 24), (10, 200, 30, 128)).save(path)
    return path


def refusal(model_dir: Path, labels: dict[str, str] | None = FLAGS, **fields: Any) -> str:
    with pytest.raises(ConfigError) as refused:
        check_call(discover_model(model_dir), GenerateRequest(prompt="a fox", **fields), labels)
    line = str(refused.value)
    assert "\n" not in line and "Traceback" not in line
    return line


def test_accepted_options_follow_each_pipelines_signature():
    common = {"steps", "height", "width", "guidance", "negative_prompt", "max_sequence_length"}
    assert accepted_options("FluxPipeline") == common
    assert accepted_options("WanPipeline") == common | {"frames"}
    assert accepted_options("CogVideoXPipeline") == common | {"frames"}
    assert accepted_options("LTXImageToVideoPipeline") == common | {"frames", "image"}


def test_options_the_pipeline_does_not_take_are_refused(demo_model_dir: Path, wan_model_dir: Path, png: Path):
    assert refusal(demo_model_dir, frames=9) == "--frames: FluxPipeline takes no number of frames"
    assert refusal(wan_model_dir, image=png) == "--image: WanPipeline takes no conditioning image"
    assert refusal(demo_model_dir, labels=None, frames=9) == "frames: FluxPipeline takes no number of frames"


@pytest.mark.parametrize("fixture,frames,expected", [
    ("wan_model_dir", 0, "--frames 0: must be at least 1"),
    ("wan_model_dir", -4, "--frames -4: must be at least 1"),
    ("wan_model_dir", 10, "--frames 10: WanPipeline renders 4k+1 frames (its VAE's temporal factor is 4); "
                          "e.g. 9 or 13"),
    ("ltx_model_dir", 5, "--frames 5: LTXPipeline renders 8k+1 frames (its VAE's temporal compression is 8); "
                         "e.g. 1 or 9"),
    ("cogvideox_model_dir", 13, "--frames 13: CogVideoXPipeline renders 8k or 8k+1 frames (its VAE's temporal "
                                "compression is 4, decoded in pairs); e.g. 9 or 16"),
])
def test_frame_counts_the_pipeline_would_change_are_refused(request, fixture, frames, expected):
    path = request.getfixturevalue(fixture)
    fields = {"max_sequence_length": 16} if fixture == "cogvideox_model_dir" else {}
    assert refusal(path, frames=frames, **fields) == expected


def test_frame_rules_per_family(wan_model_dir, ltx_model_dir, ltx_i2v_model_dir, cogvideox_model_dir, demo_model_dir):
    steps = {path.name: (rule.step if (rule := frames_rule(discover_model(path))) else None)
             for path in (wan_model_dir, ltx_model_dir, ltx_i2v_model_dir, cogvideox_model_dir, demo_model_dir)}
    assert steps == {"wan": 4, "ltx": 8, "ltx-i2v": 8, "cogvideox": 8, "demo-flux": None}
    for path, frames in ((wan_model_dir, 1), (wan_model_dir, 81), (ltx_model_dir, 161), (ltx_model_dir, 9)):
        check_call(discover_model(path), GenerateRequest(prompt="a fox", frames=frames))


def test_frame_rates(wan_model_dir, ltx_model_dir, ltx_i2v_model_dir, cogvideox_model_dir, demo_model_dir):
    rates = {path.name: default_fps(discover_model(path))
             for path in (wan_model_dir, ltx_model_dir, ltx_i2v_model_dir, cogvideox_model_dir, demo_model_dir)}
    # LTX: the call's frame_rate default; Wan and CogVideoX: the rate their documented examples export at
    assert rates == {"wan": 16.0, "ltx": 25.0, "ltx-i2v": 25.0, "cogvideox": 8.0, "demo-flux": None}


def test_conditioning_image_must_be_a_readable_image(ltx_i2v_model_dir: Path, tmp_path: Path, png: Path):
    check_call(discover_model(ltx_i2v_model_dir), GenerateRequest(prompt="a fox", image=png))
    missing = tmp_path / "missing.png"
    assert refusal(ltx_i2v_model_dir, image=missing) == f"--image {missing}: no such file"
    assert refusal(ltx_i2v_model_dir, image=tmp_path) == f"--image {tmp_path}: not a file"
    text = tmp_path / "notes.png"
    text.write_text("not a picture")
    assert refusal(ltx_i2v_model_dir, image=text).startswith(f"--image {text}: not an image PIL can read")
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(png.read_bytes()[:60])
    assert refusal(ltx_i2v_model_dir, image=truncated).startswith(f"--image {truncated}: cannot be read as an image")


@pytest.mark.parametrize("params,expected", [
    ({"num_inference_step": 3}, "--param num_inference_step: WanPipeline has no parameter num_inference_step "
                                "(did you mean num_inference_steps?)"),
    ({"guidence_scale": 3}, "(did you mean guidance_scale?)"),
    ({"zzz": 1}, "--param zzz: WanPipeline has no parameter zzz"),
    ({"guidance_scale_2": "high"}, '--param guidance_scale_2="high": WanPipeline takes float | None for '
                                   'guidance_scale_2'),
    ({"guidance_scale_2": True}, "takes float | None for guidance_scale_2"),
    ({"guidance_scale": 2.0}, "--param guidance_scale: use --guidance for guidance scale"),
    ({"num_videos_per_prompt": 1.5}, "--param num_videos_per_prompt=1.5: WanPipeline takes int | None"),
    ({"attention_kwargs": [1]}, "takes dict[str, Any] | None for attention_kwargs"),
    ({"num_frames": 9}, "--param num_frames: use --frames for number of frames"),
    ({"negative_prompt": "x"}, "--param negative_prompt: use --negative-prompt"),
    ({"prompt": "x"}, "--param prompt: set by the engine itself"),
    ({"output_type": "latent"}, "--param output_type: set by the engine itself"),
])
def test_params_are_checked_against_the_signature(wan_model_dir: Path, params, expected):
    line = refusal(wan_model_dir, params=params)
    assert line.startswith("--param ") and expected in line


def test_params_that_fit_pass_and_the_dialog_names_them_its_own_way(wan_model_dir: Path):
    model = discover_model(wan_model_dir)
    fine = {"guidance_scale_2": 2, "num_videos_per_prompt": None, "attention_kwargs": {"scale": 1.0},
            "latents": "unchecked: a tensor parameter cannot be checked simply"}
    check_call(model, GenerateRequest(prompt="a fox", params=fine))
    line = refusal(wan_model_dir, labels={"params": "option"}, params={"num_inference_step": 3})
    assert line.startswith("option num_inference_step: WanPipeline has no parameter")


def test_max_sequence_length_must_be_positive(wan_model_dir: Path):
    assert refusal(wan_model_dir, max_sequence_length=0) == "--max-sequence-length 0: must be at least 1"


def test_cogvideox_text_length_given_wrong(cogvideox_model_dir: Path):
    line = refusal(cogvideox_model_dir, max_sequence_length=32)
    assert line == ("--max-sequence-length 32 does not fit: CogVideoXPipeline's transformer takes text of exactly "
                    "16 tokens (max_text_seq_length); pass --max-sequence-length 16")


# ----------------------------------------------------------------------------------------- call kwargs
def bare(pipeline_name: str) -> Any:
    """An instance of the pipeline class with no components: enough for its call signature."""
    import diffusers

    cls = getattr(diffusers, pipeline_name)
    return cls.__new__(cls)


def test_nothing_is_sent_that_the_request_does_not_set():
    kwargs = GenerateRequest(prompt="a fox").call_kwargs(bare("WanPipeline"))
    assert set(kwargs) == {"prompt", "output_type", "generator"}  # every other parameter keeps its default
    assert kwargs["output_type"] == "pil"
    full = GenerateRequest(prompt="a fox", steps=3, frames=9, negative_prompt="blur", max_sequence_length=64,
                           guidance=4.0, params={"guidance_scale_2": 2.0}, output_type="np",
                           extra={"num_frames": 5, "strength": 0.5}).call_kwargs(bare("WanPipeline"))
    assert {k: v for k, v in full.items() if k != "generator"} == {
        "prompt": "a fox", "output_type": "np", "num_inference_steps": 3, "num_frames": 9,
        "negative_prompt": "blur", "max_sequence_length": 64, "guidance_scale": 4.0, "guidance_scale_2": 2.0}


def test_params_are_merged_last():
    kwargs = GenerateRequest(prompt="a fox", extra={"guidance_scale": 1.0, "num_frames": 5},
                             params={"num_frames": 13}).call_kwargs(bare("WanPipeline"))
    assert kwargs["num_frames"] == 13 and kwargs["guidance_scale"] == 1.0


def test_the_conditioning_image_is_sent_as_rgb(png: Path):
    kwargs = GenerateRequest(prompt="a fox", image=png).call_kwargs(bare("LTXImageToVideoPipeline"))
    assert kwargs["image"].mode == "RGB" and kwargs["image"].size == (40, 24)


@pytest.mark.parametrize("fields,missing", [
    ({"frames": 9}, "num_frames"),
    ({"image": Path("x.png")}, "image"),
    ({"params": {"strength": 0.5}}, "strength"),
])
def test_a_field_the_pipeline_does_not_take_is_never_dropped(fields, missing):
    with pytest.raises(ConfigError, match=f"FluxPipeline takes no {missing}"):
        GenerateRequest(prompt="a fox", **fields).call_kwargs(bare("FluxPipeline"))


# ----------------------------------------------------------------------------------------- parsing and types
@pytest.mark.parametrize("value,annotation,fits", [
    (3, int, True), (3, float, True), (3.5, int, False), (True, int, False), (True, bool, True), (1, bool, False),
    ("a", str, True), (3, str, False), (None, int, False), (2, int | None, True),
    (None, Optional[int], True),  # noqa: UP045 - the spelling some pipelines' annotations use
    ([1, 2], list[int], True), ([1, "a"], list[int], False), ("a", str | list[str], True),
    (["a", "b"], str | list[str], True), ([1], str | list[str], False), (3, Union[int, str], True),  # noqa: UP007
    ({"a": 1}, dict[str, Any], True), ([1], dict, False), (3, Any, None), (3, Path, None), (3, Path | None, None),
    ({"frames": 1}, Path, False), ([1], Path | None, False),  # a JSON object or array is no other class
])
def test_value_fits(value, annotation, fits):
    assert value_fits(value, annotation) is fits


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=10,
)
keys = st.from_regex(r"[a-z_][a-z0-9_]{0,20}", fullmatch=True)


@settings(max_examples=150, deadline=None)
@given(key=keys, value=json_values)
def test_parse_param_reads_json_values(key, value):
    assert parse_param(f"{key}={json.dumps(value)}") == (key, value)


@settings(max_examples=150, deadline=None)
@given(key=keys, text=st.text(alphabet=string.ascii_letters + " ,./-", min_size=1))
def test_parse_param_keeps_other_text_as_a_string(key, text):
    try:
        expected = json.loads(text)
    except ValueError:
        expected = text
    if isinstance(expected, float) and not math.isfinite(expected):  # NaN, Infinity: kept as written
        expected = text
    assert parse_param(f"{key}={text}") == (key, expected)


@pytest.mark.parametrize("text,words", [
    ("num_frames", "expected KEY=VALUE"), ("=3", "expected KEY=VALUE"), ("1abc=3", "a parameter name is"),
    ("a-b=3", "a parameter name is"),
])
def test_parse_param_refuses_what_is_not_key_value(text, words):
    with pytest.raises(ConfigError, match=words):
        parse_param(text)


def test_parse_param_values():
    assert parse_param("strength=0.5") == ("strength", 0.5)
    assert parse_param("use_resolution_binning=false") == ("use_resolution_binning", False)
    assert parse_param("negative=a blurry photo") == ("negative", "a blurry photo")
    assert parse_param("x=") == ("x", "")
    assert parse_param("x=NaN") == ("x", "NaN")  # not a finite number: kept as text (then checked as a type)
    assert parse_param("x=Infinity") == ("x", "Infinity")
