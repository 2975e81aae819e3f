"""Cheap mistakes are answered before torch or diffusers is imported (they take seconds to import).

Each case runs the real command line in a child process, which reports the heavy modules it ended up
with; the assertion is on those imports, not on time (the 2-core test machine is shared).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omni_console.console import run_flags
from omni_console.console.run_flags import DEMO_PIPELINE, check_existing_output
from omni_console.engine.errors import ConfigError
from omni_console.engine.model_dir.call_source import makes_still_images
from omni_console.engine.model_dir.discovery import discover_model

HEAVY = ("torch", "diffusers", "transformers")
CHILD = ("import sys\nfrom omni_console.console.cli import main\ncode = main(sys.argv[1:])\n"
         f"print('heavy:', ','.join(m for m in {HEAVY!r} if m in sys.modules))\nsys.exit(code)\n")


def cli(tmp_path: Path, *argv: str) -> tuple[int, str, str]:
    """(exit code, the heavy modules imported, stderr) of `omni-console ARGV` in a fresh process."""
    env = {**os.environ, "OMNI_CONSOLE_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, timeout=120,
                          env=env, cwd=tmp_path)
    heavy = done.stdout.rsplit("heavy:", 1)[-1].strip()
    return done.returncode, heavy, done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "words"), [
    (["--output", "taken.png"], "--output 'taken.png' exists; pass --overwrite to replace it"),
    (["--output", "taken.mp4"], "--output 'taken.mp4' exists; pass --overwrite to replace it"),
    (["--output", "new.png", "--steps", "0"], "--steps 0: must be at least 1"),
    (["--output", "new.png", "--steps", "10001"], "--steps 10001: at most 10000 steps"),
    (["--output", "new.png", "--frames", "4097"], "--frames 4097: at most 4096 frames in one request"),
    (["--output", "new.xyz"], "--output 'new.xyz': no image writer for '.xyz'"),
    (["--output", "new.png", "--seed", "-1"], "--seed -1: must be between 0 and 2**64-1"),
    (["--output", "new.png", "--fps", "0"], "--fps 0.0: must be a positive finite number"),
    (["--output", "new.png", "--height", "0"], "--height 0: must be a positive number of pixels"),
    (["--output", "new.png", "--telemetry-hz", "0"], "--telemetry-hz: telemetry rate must be > 0"),
    (["--output", "new.png", "--resident-layers", "-1"], "resident_layers"),
    (["--output", "new.png", "--parallel", "cfg", "--gpus", "3"], "it needs --gpus 2, got 3"),
    (["--output", "new.png", "--param", "sigmas"], "--param 'sigmas': expected KEY=VALUE"),
    (["--output", "new.png", "--param", "1x=2"], "--param '1x': a parameter name is a Python identifier"),
    (["--output", "new.png", "--param", "eta=1", "--param", "eta=2"], "--param eta: given twice"),
    (["--output", "new.png", "--param", "sigmas=[1.0, NaN]"], "--param sigmas: holds a non-finite number"),
    (["--output", "new.png", "--param", "frame_rate=0"], "--param frame_rate=0: the video is written at this"),
    (["--output", "new.png", "--device", "tpu"], "--device 'tpu': not a device name (use cpu, cuda or cuda:N)"),
    (["--output", "new.png", "--device", "cuda:x"], "--device 'cuda:x': not a device name"),
])
def test_run_answers_before_torch_is_imported(tmp_path, argv, words):
    """No --model: the demo is not even built (the cache stays empty) before the answer."""
    for name in ("taken.png", "taken.mp4"):
        (tmp_path / name).write_bytes(b"the user's file")
    code, heavy, err = cli(tmp_path, "run", *argv)
    assert code == 2 and heavy == "", (heavy, err)
    assert err.count("\n") == 1 and err.startswith("omni-console: error: ") and words in err, err
    assert (tmp_path / "taken.png").read_bytes() == b"the user's file"
    assert not list((tmp_path / "cache").glob("demo*"))  # the demo model was not built
    assert not (tmp_path / "new.png").exists()


@pytest.mark.slow
def test_an_existing_output_of_a_still_image_model_is_refused_before_torch(demo_model_dir, tmp_path):
    (tmp_path / "shot.png").write_bytes(b"the user's file")
    code, heavy, err = cli(tmp_path, "run", "--model", str(demo_model_dir), "--output", "shot.png")
    assert (code, heavy) == (2, "")
    assert err == "omni-console: error: --output 'shot.png' exists; pass --overwrite to replace it\n"


@pytest.mark.slow
@pytest.mark.skipif(not run_flags.no_gpu_driver(), reason="a GPU driver is here: torch decides whether cuda:N exists")
@pytest.mark.parametrize("command", ["run", "plan"])
def test_cuda_without_a_gpu_driver_is_answered_before_torch(tmp_path, command):
    """`plan` said nothing and planned for the CPU; `run` answered only after importing torch."""
    code, heavy, err = cli(tmp_path, command, "--device", "cuda:7", *(["--output", "new.png"] * (command == "run")))
    assert (code, heavy) == (2, "")
    assert err == "omni-console: error: --device 'cuda:7': CUDA is not available on this machine (use --device cpu)\n"


def test_the_driver_check_is_certain_only_on_linux(monkeypatch):
    monkeypatch.setattr(run_flags.os.path, "exists", lambda path: False)
    monkeypatch.setattr(run_flags.sys, "platform", "darwin")
    assert run_flags.no_gpu_driver() is False  # elsewhere torch decides (after the import)
    monkeypatch.setattr(run_flags.sys, "platform", "linux")
    assert run_flags.no_gpu_driver() is True
    monkeypatch.setattr(run_flags.os.path, "exists", lambda path: path == "/dev/kfd")  # ROCm's torch.cuda
    assert run_flags.no_gpu_driver() is False


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "line"), [
    (["plan", "--frames", "0"], "--frames 0: must be at least 1"),
    (["demo-model", "demo", "--seed", "-1"], "--seed -1: must be between 0 and 2**64-1 (18446744073709551615)"),
])
def test_plan_and_demo_model_answer_before_torch_is_imported(tmp_path, argv, line):
    code, heavy, err = cli(tmp_path, *argv)
    assert (code, heavy) == (2, "")
    assert err == f"omni-console: error: {line}\n"
    assert not (tmp_path / "demo").exists()


# --- the early check refuses only what the full check would ---------------------------------------

def _args(model: Path | None, output: Path) -> argparse.Namespace:
    return argparse.Namespace(model=model, variant=None, output=output, overwrite=False)


def test_the_demo_pipeline_named_here_is_the_demo_models(demo_model_dir):
    assert discover_model(demo_model_dir, None).pipeline_class == DEMO_PIPELINE
    assert makes_still_images(DEMO_PIPELINE) is True


def test_the_seed_bound_is_the_engines():
    from omni_console.engine.running.request_checks import SEED_MAX

    assert run_flags.SEED_MAX == SEED_MAX


def test_an_existing_output_is_refused_from_the_pipeline_class_alone(demo_model_dir, tmp_path, monkeypatch):
    """No weight header is read for it (reading them imports numpy: 0.3 s of the answer on this machine); a
    folder without a readable index is left to discovery, which says why."""
    from omni_console.engine.model_dir import weights

    monkeypatch.setattr(weights, "read_header", lambda path: pytest.fail(f"read the header of {path}"))
    (tmp_path / "shot.png").write_bytes(b"the user's file")
    with pytest.raises(ConfigError, match="exists; pass --overwrite"):
        check_existing_output(_args(demo_model_dir, tmp_path / "shot.png"))
    check_existing_output(_args(tmp_path, tmp_path / "shot.png"))  # no model_index.json here: not refused early


def test_a_video_models_png_output_that_exists_is_left_to_the_full_check(wan_model_dir, tmp_path):
    """A video writes NAME-0001.png, …: an existing NAME.png is no reason to refuse before the frame count is
    known; an existing NAME.mp4 is (the video is that one file)."""
    for name in ("clip.png", "clip.mp4"):
        (tmp_path / name).write_bytes(b"the user's file")
    check_existing_output(_args(wan_model_dir, tmp_path / "clip.png"))  # not refused here
    with pytest.raises(ConfigError, match="exists; pass --overwrite"):
        check_existing_output(_args(wan_model_dir, tmp_path / "clip.mp4"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["FluxPipeline", "StableDiffusion3Pipeline", "PixArtSigmaPipeline", "WanPipeline",
                                  "LTXPipeline", "CogVideoXPipeline", "MochiPipeline", "LattePipeline",
                                  "HunyuanVideoPipeline", "QwenImagePipeline"])
def test_the_source_reading_agrees_with_the_imported_signature(name):
    from omni_console.engine.running.call_options import call_signature, option_parameter

    assert makes_still_images(name) is (option_parameter(call_signature(name), "frames") is None)


def test_the_device_types_named_here_are_torchs():
    """The torch-free check knows torch's device types (it names them in the error for an unknown one)."""
    import torch

    with pytest.raises(RuntimeError) as raised:
        torch.device("nosuchtype")
    listed = str(raised.value).split("Expected one of ", 1)[1].split(" device type", 1)[0]
    assert frozenset(listed.split(", ")) == run_flags._TORCH_DEVICE_TYPES


@pytest.mark.slow
@pytest.mark.parametrize(("param", "line"), [
    ("num_inference_step=3", "--param num_inference_step: FluxPipeline has no parameter num_inference_step (did "
                             "you mean num_inference_steps?)"),
    ("max_area=4096", "--param max_area: FluxPipeline has no parameter max_area"),
])
def test_a_parameter_the_pipeline_has_not_is_answered_before_torch(demo_model_dir, tmp_path, param, line):
    """A typo'd `--param` key, read against the pipeline's `__call__` in the installed source: the line
    `call_options` gives after the import (4-5 s later on this machine), now without it."""
    code, heavy, err = cli(tmp_path, "run", "--model", str(demo_model_dir), "--output", "new.png", "--param", param)
    assert (code, heavy, err) == (2, "", f"omni-console: error: {line}\n")


@pytest.mark.slow
def test_a_parameter_a_flag_of_its_own_sets_is_answered_before_torch(demo_model_dir, tmp_path):
    """`--param guidance_scale=…` was refused only after the import (5 s); the same line, now at once."""
    code, heavy, err = cli(tmp_path, "run", "--model", str(demo_model_dir), "--output", "new.png",
                           "--param", "guidance_scale=nan")
    assert (code, heavy, err) == (2, "", "omni-console: error: --param guidance_scale: use --guidance for "
                                         "guidance scale\n")


def test_the_early_limits_and_dedicated_parameters_are_the_engines():
    from omni_console.engine.running import request_limits
    from omni_console.engine.running.call_options import OPTION_NOUNS, OPTION_PARAMETERS
    from omni_console.engine.running.param_syntax import DEDICATED_PARAMETERS

    assert (run_flags.MAX_STEPS, run_flags.MAX_FRAMES) == (request_limits.MAX_STEPS, request_limits.MAX_FRAMES)
    engine = {p: (option, OPTION_NOUNS[option]) for option, params in OPTION_PARAMETERS.items() for p in params}
    assert engine == DEDICATED_PARAMETERS


def test_the_early_parameter_check_leaves_what_it_cannot_read_to_the_full_check(tmp_path):
    """No model_index.json, an unknown class, or a key the call has: nothing to say early."""
    from omni_console.engine.running.param_syntax import check_parameter_names

    check_parameter_names(tmp_path, {"x": 1}, "--param")  # no index: discovery says so
    (tmp_path / "model_index.json").write_text('{"_class_name": "NoSuchPipeline"}')
    check_parameter_names(tmp_path, {"x": 1}, "--param")
    (tmp_path / "model_index.json").write_text('{"_class_name": "ClassifierFreeGuidance"}')  # has a __call__
    check_parameter_names(tmp_path, {"x": 1}, "--param")  # not a pipeline: discovery's line, not this one
    (tmp_path / "model_index.json").write_text('{"_class_name": "FluxPipeline"}')
    check_parameter_names(tmp_path, {"joint_attention_kwargs": {}, "callback": 1}, "--param")  # callback: later
    with pytest.raises(ConfigError, match="guidance_scale: use --guidance for guidance scale$"):
        check_parameter_names(tmp_path, {"guidance_scale": 1.0}, "--param")
    with pytest.raises(ConfigError, match="FluxPipeline has no parameter x$"):
        check_parameter_names(tmp_path, {"x": 1}, "--param")


@pytest.mark.slow  # imports every diffusers pipeline
def test_the_source_read_parameters_hold_every_parameter_of_every_pipelines_call():
    """The early check must never refuse what the pipeline takes: for every pipeline diffusers exports, the
    names read from the source contain its `__call__`'s (inspect.signature), or the check stays silent (a
    class whose first bases do not lead to `DiffusionPipeline`, such as a mixin listed first, or a modular
    pipeline: left to the full check)."""
    import inspect

    import diffusers

    from omni_console.engine.planning.model_configs import call_parameter_names

    checked = 0
    for name in (n for n in dir(diffusers) if n.endswith("Pipeline")):
        try:
            signature = inspect.signature(getattr(diffusers, name).__call__)
        except Exception:  # a placeholder class (a missing optional package) or no signature
            continue
        names = call_parameter_names(name)
        taken = {p for p, v in signature.parameters.items()
                 if p != "self" and v.kind in (v.POSITIONAL_OR_KEYWORD, v.KEYWORD_ONLY)}
        assert names is None or taken <= names, (name, sorted(taken - names))
        checked += names is not None
    assert checked > 250  # of about 340 in diffusers 0.42
