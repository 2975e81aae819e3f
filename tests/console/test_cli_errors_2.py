"""Issue 23 items 6-8: every careless or hostile flag is one true line — refused before anything loads
(exit 2), a failure once loading began is exit 1, an interrupt is 130, a cancel keeps no image."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cli_helpers import one_error_line
from no_pickle_guard import no_unpickling  # noqa: F401  (fixture)

from omni_console.console.cli import main
from omni_console.engine.engine import Engine
from omni_console.engine.running.runner import GenerateRequest, RequestCancelled
from omni_console.offload.policy import build_policy

pytestmark = pytest.mark.usefixtures("no_unpickling")


def refused(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    return one_error_line(capsys)


def run_refused(capsys, loads, model: Path, out: Path, *flags: str) -> str:
    line = refused(capsys, ["run", "--model", str(model), "--output", str(out), "--device", "cpu", *flags])
    assert loads == [] and not out.exists()
    return line


# ------------------------------------------------------------------ item 8: flags checked before anything

@pytest.mark.parametrize("command", ["run", "plan"])
def test_a_negative_vram_budget_is_the_flags_own_line(command, demo_model_dir, tmp_path, capsys, loads):
    line = refused(capsys, [command, "--model", str(demo_model_dir), "--vram-budget", "-5GB"]
                   + (["--output", str(tmp_path / "o.png")] if command == "run" else []))
    assert "--vram-budget must be a positive size" in line and "expected one argument" not in line


@pytest.mark.parametrize("flags,words", [
    (["--device", "bogus"], "--device 'bogus': not a device name"),
    (["--device", "cuda:x"], "--device 'cuda:x': not a device name"),
    (["--height", "-5"], "--height -5: must be a positive number of pixels"),
    (["--width", "0"], "--width 0: must be a positive number of pixels"),
    (["--frames", "-1"], "--frames -1: must be at least 1"),
    (["--max-sequence-length", "0"], "--max-sequence-length 0: must be at least 1"),
    (["--guidance", "nan"], "--guidance nan: must be a finite number"),
])
def test_plan_refuses_what_run_refuses(flags, words, demo_model_dir, capsys):
    assert words in refused(capsys, ["plan", "--model", str(demo_model_dir), *flags])


@pytest.mark.parametrize("fps", ["1e12", "1e-9"])
def test_a_frame_rate_no_writer_can_hold_is_refused_before_load(fps, demo_model_dir, tmp_path, capsys, loads):
    line = run_refused(capsys, loads, demo_model_dir, tmp_path / "o.mp4", "--fps", fps)
    assert "--fps" in line and "between 0.01 and 1000" in line


def test_a_billion_token_text_is_refused_before_load(demo_model_dir, tmp_path, capsys, loads):
    line = run_refused(capsys, loads, demo_model_dir, tmp_path / "o.png", "--max-sequence-length", "1000000000")
    assert "--max-sequence-length 1000000000: the pipeline's tokenizers take at most 512 tokens" in line


def test_several_images_per_prompt_are_refused_not_written_as_one(demo_model_dir, tmp_path, capsys, loads):
    line = run_refused(capsys, loads, demo_model_dir, tmp_path / "o.png", "--param", "num_images_per_prompt=3")
    assert "num_images_per_prompt=3: a request makes one image" in line


@pytest.mark.parametrize("param", ["latents=[1,2,3]", "prompt_embeds=[[0.5]]", "latents=\"x\""])
def test_a_tensor_parameter_from_json_is_refused_before_load(param, demo_model_dir, tmp_path, capsys, loads):
    line = run_refused(capsys, loads, demo_model_dir, tmp_path / "o.png", "--param", param)
    assert "which a --param value (JSON) cannot give" in line and param.split("=")[0] in line


def test_a_schedule_longer_than_the_steps_is_refused(demo_model_dir, tmp_path, capsys, loads):
    sigmas = json.dumps([1 - i / 5000 for i in range(4973)])
    line = run_refused(capsys, loads, demo_model_dir, tmp_path / "o.png", "--steps", "2", "--param", f"sigmas={sigmas}")
    assert "--param sigmas has 4973 values but --steps is 2" in line


def test_a_schedule_sets_the_step_count(demo_model_dir, tmp_path, capsys):
    out = tmp_path / "o.png"
    assert main(["run", "--model", str(demo_model_dir), "--device", "cpu", "--output", str(out),
                 "--param", "sigmas=[1.0, 0.6, 0.3]"]) == 0
    err = capsys.readouterr().err
    assert "step 3/3" in err and "/2 " not in err and out.exists()


def test_too_many_frames_are_refused_before_load(wan_model_dir, tmp_path, capsys, loads):
    line = run_refused(capsys, loads, wan_model_dir, tmp_path / "o.mp4", "--frames", "100001")
    assert "--frames 100001: at most 4096 frames" in line


def test_a_modular_pipeline_is_refused_by_plan_as_by_run(demo_model_dir, tmp_path, capsys):
    root = tmp_path / "model"
    shutil.copytree(demo_model_dir, root)
    index = json.loads((root / "model_index.json").read_text())
    index["_class_name"] = "ModularPipeline"
    (root / "model_index.json").write_text(json.dumps(index))
    for argv in (["plan"], ["run", "--output", str(tmp_path / "o.png")]):
        line = refused(capsys, [*argv, "--model", str(root)])
        assert "'ModularPipeline' is not a diffusers pipeline" in line


# ------------------------------------------------------------------ item 7: one line, not a traceback

def test_demo_model_with_a_seed_past_64_bits(tmp_path, capsys):
    line = refused(capsys, ["demo-model", str(tmp_path / "d"), "--seed", "99999999999999999999999"])
    assert "--seed 99999999999999999999999: must be between 0 and 2**64-1" in line
    assert not (tmp_path / "d").exists()


def test_an_ascii_terminal_gets_escapes_not_a_traceback(demo_model_dir, tmp_path):
    root = tmp_path / "modèle-→"
    shutil.copytree(demo_model_dir, root)
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "LC_ALL": "C"}
    for argv in (["plan", "--model", str(root)], ["plan", "--model", str(tmp_path / "absent-é")]):
        proc = subprocess.run([sys.executable, "-m", "omni_console.console.cli", *argv], env=env,
                              capture_output=True, timeout=240)
        assert b"Traceback" not in proc.stderr and b"UnicodeEncodeError" not in proc.stderr, proc.stderr
        assert proc.returncode == (0 if root.name in argv[-1] else 2)
    assert b"mod\\xe8le" in proc.stderr or b"absent-\\xe9" in proc.stderr


# ------------------------------------------------------------------ item 8: true exit codes, one line

def test_a_load_failure_is_exit_1_and_one_line(demo_model_dir, tmp_path, capsys):
    root = tmp_path / "model"
    shutil.copytree(demo_model_dir, root)
    config = root / "text_encoder" / "config.json"
    doc = json.loads(config.read_text())
    doc["num_attention_heads"] = 3  # the hidden size is not a multiple: the build fails once loading began
    config.write_text(json.dumps(doc))
    out = tmp_path / "o.png"
    assert main(["run", "--model", str(root), "--device", "cpu", "--output", str(out)]) == 1
    err = capsys.readouterr().err
    failing = [line for line in err.splitlines() if "fail" in line or "rror" in line or line.startswith(" ")]
    assert len(failing) == 1 and failing[0].startswith("omni-console: load failed: "), err
    assert "Traceback" not in err and not out.exists()


def test_a_model_file_refused_during_the_load_is_exit_1(demo_model_dir, tmp_path, capsys, monkeypatch):
    """A ModelDirError raised once loading began (a file changed after discovery) is a failed load, not bad input."""
    from omni_console.engine.loading import loader
    from omni_console.engine.model_dir.weights import ModelDirError

    def changed(info):
        raise ModelDirError(f"{info.folder}: changed since discovery")

    monkeypatch.setattr(loader, "load_component", changed)
    assert main(["run", "--model", str(demo_model_dir), "--device", "cpu", "--output", str(tmp_path / "o.png")]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if "changed since discovery" in line]
    assert len(lines) == 1 and lines[0].startswith("omni-console: load failed: "), lines


def test_ctrl_c_while_the_output_is_written_exits_130(demo_model_dir, tmp_path, capsys, monkeypatch):
    from omni_console.engine.service import outputs

    original = outputs.write_result

    def write_then_interrupt(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # the guard's handler runs on this (main) thread
        return original(*args, **kwargs)

    monkeypatch.setattr(outputs, "write_result", write_then_interrupt)  # run's write, through the service
    assert main(["run", "--model", str(demo_model_dir), "--device", "cpu", "--output", str(tmp_path / "o.png")]) == 130
    assert capsys.readouterr().err.strip().endswith("omni-console: interrupted (SIGINT); nothing written")
    assert os.listdir(tmp_path) == []  # nothing of the output, no temporary file


@pytest.mark.slow
def test_a_cancel_during_the_vae_decode_keeps_no_image(demo_model_dir):
    engine = Engine(demo_model_dir, device="cpu")
    try:
        engine.load(build_policy(None, 0))
        cancel = threading.Event()
        decode = engine.pipe.vae.decode

        def decode_then_cancel(*args, **kwargs):
            cancel.set()  # esc pressed while the VAE decodes: every denoise step already ran
            return decode(*args, **kwargs)

        engine.pipe.vae.decode = decode_then_cancel
        # the cancel is seen at the VAE's next block: the request ends there, with no image to save
        with pytest.raises(RequestCancelled, match="cancelled after 2/2 steps"):
            engine.generate(GenerateRequest(prompt="x", steps=2, height=64, width=64,
                                            extra={"max_sequence_length": 32}), cancel)
        assert engine.state.value == "ready"
    finally:
        engine.close()
