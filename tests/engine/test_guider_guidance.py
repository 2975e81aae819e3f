"""`--guidance` for pipelines that guide through a guider component (HunyuanVideo 1.5: no `guidance_scale`
argument). The engine does what diffusers documents, `pipe.guider = pipe.guider.new(guidance_scale=…)`, for
the request only, and the output is bit-identical to plain diffusers with the same change under every
policy; `plan` and `run --json` show the scale used. It used to be refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tiny_families_new import NEW_GENERATION, build_tiny_new_family

from omni_console.engine.engine import Engine
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.running.call_options import accepted_options, check_call
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.policy import build_policy

PROMPT = "a red fox running in the snow"
GUIDANCE = 4.0


@pytest.fixture(scope="module")
def hv15(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_new_family("hunyuan_video15", tmp_path_factory.mktemp("guider") / "hv15")


def _request(guidance: float | None) -> GenerateRequest:
    gen = dict(NEW_GENERATION["hunyuan_video15"])
    return GenerateRequest(prompt=PROMPT, steps=gen.pop("num_inference_steps"), height=gen.pop("height"),
                           width=gen.pop("width"), frames=gen.pop("num_frames"), seed=7, guidance=guidance,
                           negative_prompt="blurry", output_type="np", extra=gen)


def _plain(path: Path, request: GenerateRequest, guidance: float | None) -> np.ndarray:
    """Plain diffusers, with the guider changed as diffusers documents it (`BaseGuidance.new`)."""
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    if guidance is not None:
        pipe.guider = pipe.guider.new(guidance_scale=guidance)
    kwargs = request.call_kwargs(pipe)
    assert "guidance_scale" not in kwargs  # the call takes none: the scale is the guider's
    return np.asarray(pipe(**kwargs).frames[0])


@pytest.mark.slow  # builds the family (diffusers' imports)
def test_guidance_is_accepted_where_the_guider_takes_it(hv15):
    model = discover_model(hv15)
    check_call(model, _request(GUIDANCE), {"guidance": "--guidance"})
    assert "guidance" in accepted_options(model.pipeline_class, model)  # the console's form shows the field
    assert "guidance" not in accepted_options(model.pipeline_class)  # the call itself has no such argument


@pytest.mark.slow  # six loads and requests, and two plain pipelines
def test_guidance_through_the_guider_is_bit_identical_to_plain_diffusers(hv15):
    expected = _plain(hv15, _request(GUIDANCE), GUIDANCE)
    unguided = _plain(hv15, _request(None), None)
    assert not np.array_equal(expected, unguided)  # the scale changes the video: a dropped one would show
    engine = Engine(hv15, device="cpu")
    (denoiser,) = engine.model.denoisers
    policies = [build_policy({}, 0), build_policy({"default": False}, 1), build_policy({"vae": False}, 2),
                build_policy({}, 1, placement="spread"), build_policy({}, 0, mode="resident"),
                build_policy({}, 0, stream_encoders="on")]
    try:
        for policy in policies:
            engine.load(policy)
            result = engine.generate(_request(GUIDANCE))
            assert result.guidance == GUIDANCE
            assert np.array_equal(np.stack(result.frames).reshape(expected.shape), expected), policy
            again = engine.generate(_request(None))  # the model's own guider is back for the next request
            assert again.guidance == 1.0
            assert np.array_equal(np.stack(again.frames).reshape(unguided.shape), unguided), policy
            engine.unload()
    finally:
        engine.close()
    assert denoiser.num_blocks == 2


@pytest.mark.slow  # two CLI commands
def test_plan_and_run_show_the_guidance_used(hv15, tmp_path, capsys):
    from omni_console.console.cli import main

    size = ["--height", "16", "--width", "16", "--frames", "9"]
    assert main(["plan", "--model", str(hv15), *size, "--guidance", "4.5"]) == 0
    assert "guidance scale\t4.5\t--guidance" in capsys.readouterr().out.splitlines()
    assert main(["plan", "--model", str(hv15), *size]) == 0
    assert "guidance scale\t1\tpipeline default" in capsys.readouterr().out.splitlines()  # the guider's config
    out = tmp_path / "fox.mp4"
    assert main(["run", "--model", str(hv15), "--prompt", PROMPT, *size, "--steps", "2", "--guidance", "4.5",
                 "--output", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["guidance"] == 4.5 and out.is_file() and report["files"] == [str(out)]
    assert main(["run", "--model", str(hv15), "--prompt", PROMPT, *size, "--steps", "2", "--output", str(out),
                 "--overwrite"]) == 0  # the text report: the guider's own scale
    rows = [line.strip("│ ").split("│") for line in capsys.readouterr().out.splitlines() if "guidance" in line]
    assert [[cell.strip() for cell in row] for row in rows] == [["guidance scale", "1"]]
