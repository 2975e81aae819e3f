"""Every bad `run` input: exit 2, one line on stderr naming the flag, before any weight loads."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from cli_helpers import one_error_line
from PIL import Image

from omni_console.console import run_flags
from omni_console.console.cli import main
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.running import outputs
from omni_console.engine.running.request_checks import SEED_MAX, check_request, size_rule
from omni_console.engine.running.runner import GenerateRequest


def run_refused(capsys, loads: list[str], model: Path, out: Path, *flags: str) -> str:
    assert main(["run", "--model", str(model), "--output", str(out), *flags]) == 2
    line = one_error_line(capsys)
    assert loads == [] and not out.exists()
    return line


# -- --dlo-offload-components ---------------------------------------------------------------------

def test_policy_json_nested_100000_deep_is_one_line(demo_model_dir, tmp_path, capsys, loads):
    line = run_refused(capsys, loads, demo_model_dir, tmp_path / "o.png", "--dlo-offload-components", "[" * 100_000)
    assert "--dlo-offload-components is nested too deeply" in line


def test_policy_json_duplicate_key_is_refused_naming_it(demo_model_dir, tmp_path, capsys, loads):
    line = run_refused(capsys, loads, demo_model_dir, tmp_path / "o.png",
                       "--dlo-offload-components", '{"vae": true, "vae": false}')
    assert line == "omni-console: error: --dlo-offload-components has a duplicate key 'vae'"


def test_plan_refuses_duplicate_keys_too(demo_model_dir, capsys):
    assert main(["plan", "--model", str(demo_model_dir), "--dlo-offload-components",
                 '{"text_encoder": false, "vae": true, "text_encoder": true}']) == 2
    assert "duplicate key 'text_encoder'" in one_error_line(capsys)


# -- argparse ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags,words", [(["--steps", "abc"], "argument --steps: 'abc' is not a whole number"),
                                         (["--bogus-flag"], "unrecognized arguments: --bogus-flag"),
                                         (["--seed"], "argument --seed: expected one argument")])
def test_unparseable_flags_are_one_line_not_a_usage_block(flags, words, tmp_path, capsys, loads):
    assert main(["run", "--output", str(tmp_path / "o.png"), *flags]) == 2
    line = one_error_line(capsys)
    assert words in line and "omni-console run --help" in line


# -- --device ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("device,words", [("bogus", "--device 'bogus': not a device name (use cpu, cuda or cuda:N)"),
                                          ("cuda:x", "not a device name"),
                                          ("meta", "meta devices are not supported"),
                                          ("cpu:2", "there is one CPU device")])
def test_unusable_device_names(device, words, demo_model_dir, tmp_path, capsys, loads):
    assert words in run_refused(capsys, loads, demo_model_dir, tmp_path / "o.png", "--device", device)


def test_cuda_without_cuda(demo_model_dir, tmp_path, capsys, loads, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = run_refused(capsys, loads, demo_model_dir, tmp_path / "o.png", "--device", "cuda")
    assert "--device 'cuda': CUDA is not available on this machine (use --device cpu)" in line


def test_cuda_index_beyond_the_device_count(demo_model_dir, tmp_path, capsys, loads, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(run_flags, "no_gpu_driver", lambda: False)  # a driver, as on a GPU machine
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    line = run_refused(capsys, loads, demo_model_dir, tmp_path / "o.png", "--device", "cuda:7")
    assert "--device 'cuda:7': this machine has 2 CUDA devices (cuda:0 to cuda:1)" in line


# -- --telemetry-hz (run and the console app) ----------------------------------------------------------

@pytest.mark.parametrize("hz", ["0", "nan", "inf", "-1", "1000"])
def test_run_telemetry_rate(hz, demo_model_dir, tmp_path, capsys, loads):
    line = run_refused(capsys, loads, demo_model_dir, tmp_path / "o.png", "--telemetry-hz", hz)
    assert "--telemetry-hz" in line and "telemetry rate must be > 0 and <= 100 Hz" in line


@pytest.mark.parametrize("hz", ["0", "nan", "inf", "-1"])
def test_console_telemetry_rate(hz, demo_model_dir, capsys, loads):
    assert main(["--model", str(demo_model_dir), "--telemetry-hz", hz]) == 2
    assert "telemetry rate must be > 0 and <= 100 Hz" in one_error_line(capsys)


# -- the request: steps, sizes, seed, guidance -------------------------------------------------------

@pytest.mark.parametrize("flags,words", [
    (["--steps", "0"], "--steps 0: must be at least 1"),
    (["--steps", "-1"], "--steps -1: must be at least 1"),
    (["--height", "0"], "--height 0: must be a positive number of pixels"),
    (["--width", "-64"], "--width -64: must be a positive number of pixels"),
    (["--height", "70"], "--height 70: FluxPipeline needs a multiple of 16 (e.g. 64 or 80)"),
    (["--width", "8"], "--width 8: FluxPipeline needs a multiple of 16 (e.g. 16)"),
    (["--seed", "-1"], "--seed -1: must be between 0 and 2**64-1"),
    (["--seed", str(2**64)], f"--seed {2**64}: must be between 0 and 2**64-1"),
    (["--guidance", "nan"], "--guidance nan: must be a finite number"),
    (["--guidance", "inf"], "--guidance inf: must be a finite number"),
    (["--guidance=-inf"], "--guidance -inf: must be a finite number"),
])
def test_demo_request_refused_before_load(flags, words, demo_model_dir, tmp_path, capsys, loads):
    assert words in run_refused(capsys, loads, demo_model_dir, tmp_path / "o.png", *flags)


@pytest.mark.parametrize("fixture,flags,words", [
    ("sd3_model_dir", ["--height", "72"],
     "--height 72: StableDiffusion3Pipeline needs a multiple of 16 (e.g. 64 or 80)"),
    ("sd3_model_dir", ["--width", "512"], "--width 512: StableDiffusion3Pipeline takes at most 256"),
    ("pixart_model_dir", ["--width", "40"], "--width 40: PixArtSigmaPipeline needs a multiple of 16 (e.g. 32 or 48)"),
    ("wan_model_dir", ["--height", "24"], "--height 24: WanPipeline needs a multiple of 16 (e.g. 16 or 32)"),
])
def test_other_families_sizes_refused_before_load(fixture, flags, words, request, tmp_path, capsys, loads):
    model = request.getfixturevalue(fixture)
    capsys.readouterr()  # building a session fixture here (the first test to ask for it) may print progress bars
    assert words in run_refused(capsys, loads, model, tmp_path / "o.png", *flags)


@pytest.mark.slow
def test_a_size_the_rule_allows_is_rendered_exactly(demo_model_dir, tmp_path, capsys):
    out = tmp_path / "tall.png"
    assert main(["run", "--model", str(demo_model_dir), "--output", str(out), "--height", "80", "--width", "48",
                 "--json"]) == 0
    assert Image.open(out).size == (48, 80)  # (width, height): not resized to another size


def _set_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_size_rule_is_derived_from_the_configs(demo_model_dir, sd3_model_dir, wan_model_dir, tmp_path):
    assert (size_rule(discover_model(demo_model_dir)).height_multiple) == 16  # VAE 8 × Flux 2x2 packing
    flux = shutil.copytree(demo_model_dir, tmp_path / "flux")
    _set_config(flux / "vae", block_out_channels=[16, 16, 32])  # 3 levels: VAE factor 4
    assert size_rule(discover_model(flux)).height_multiple == 8
    sd3 = shutil.copytree(sd3_model_dir, tmp_path / "sd3")
    _set_config(sd3 / "transformer", patch_size=4, pos_embed_max_size=10)
    rule = size_rule(discover_model(sd3))
    assert (rule.height_multiple, rule.max_height) == (32, 10 * 4 * 8)
    wan = shutil.copytree(wan_model_dir, tmp_path / "wan")
    _set_config(wan / "vae", scale_factor_spatial=16)
    _set_config(wan / "transformer", patch_size=[1, 2, 4])
    rule = size_rule(discover_model(wan))
    assert (rule.height_multiple, rule.width_multiple) == (32, 64)


def test_seed_range_is_the_generator_range(demo_model_dir):
    model = discover_model(demo_model_dir)
    check_request(model, GenerateRequest(prompt="p", seed=SEED_MAX))
    torch.Generator("cpu").manual_seed(SEED_MAX)  # the largest seed the check lets through works
    with pytest.raises((RuntimeError, ValueError)):
        torch.Generator("cpu").manual_seed(SEED_MAX + 1)  # ... and the next one would fail after load


# -- --output -------------------------------------------------------------------------------------

def test_output_that_is_a_directory(demo_model_dir, tmp_path, capsys, loads):
    folder = tmp_path / "looks-like.png"
    folder.mkdir()
    assert main(["run", "--model", str(demo_model_dir), "--output", str(folder), "--overwrite"]) == 2
    assert f"--output '{folder}' is a directory" in one_error_line(capsys)
    assert loads == [] and list(folder.iterdir()) == []


def test_output_under_a_file(demo_model_dir, tmp_path, capsys, loads):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "sub" / "o.png"
    line = run_refused(capsys, loads, demo_model_dir, out)
    assert f"{tmp_path / 'file'} is not a directory" in line


@pytest.mark.parametrize("name,words", [("o.xyz", "no image writer for '.xyz'"),
                                        ("o.xbm", "no image writer for '.xbm'"),  # XBM cannot write RGB
                                        ("noext", "no file suffix")])
def test_output_suffix_without_a_writer(name, words, demo_model_dir, tmp_path, capsys, loads):
    line = run_refused(capsys, loads, demo_model_dir, tmp_path / name)
    assert words in line and ".png, .jpg" in line


def test_existing_output_needs_overwrite(demo_model_dir, tmp_path, capsys, loads):
    out = tmp_path / "o.png"
    out.write_bytes(b"keep me")
    assert main(["run", "--model", str(demo_model_dir), "--output", str(out)]) == 2
    assert one_error_line(capsys) == f"omni-console: error: --output '{out}' exists; pass --overwrite to replace it"
    assert out.read_bytes() == b"keep me" and loads == []


def test_overwrite_replaces_in_one_step_keeping_the_mode(demo_model_dir, tmp_path, capsys):
    out = tmp_path / "o.png"
    out.write_bytes(b"old")
    out.chmod(0o640)
    assert main(["run", "--model", str(demo_model_dir), "--output", str(out), "--overwrite", "--json"]) == 0
    assert Image.open(out).size == (64, 64) and (out.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.png"]  # no temp file left behind


def test_missing_parents_are_created_at_save(demo_model_dir, tmp_path, capsys):
    out = tmp_path / "a" / "b" / "o.png"
    assert main(["run", "--model", str(demo_model_dir), "--output", str(out), "--json"]) == 0
    assert Image.open(out).size == (64, 64)


def test_output_in_a_directory_we_cannot_write_simulated(demo_model_dir, tmp_path, capsys, loads, monkeypatch):
    def no_permission(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(outputs.tempfile, "mkstemp", no_permission)
    line = run_refused(capsys, loads, demo_model_dir, tmp_path / "new" / "o.png")
    assert f"cannot create files in {tmp_path} (Permission denied)" in line
    assert not (tmp_path / "new").exists()


def test_writability_probe_really_creates_and_removes_a_file(tmp_path, monkeypatch):
    made: list[Path] = []
    real = outputs.tempfile.mkstemp

    def spy(*args, **kwargs):
        fd, name = real(*args, **kwargs)
        made.append(Path(name))
        return fd, name

    monkeypatch.setattr(outputs.tempfile, "mkstemp", spy)
    outputs.check_output(tmp_path / "o.png")
    assert len(made) == 1 and made[0].parent == tmp_path and not made[0].exists()
    assert list(tmp_path.iterdir()) == []


def _make_unwritable(directory: Path) -> bool:
    """chmod stops a normal user but not root (for whom `os.access` says "writable" too); root needs
    the immutable attribute. True if the directory really refuses new files."""
    directory.chmod(0o555)
    if outputs._probe_writable(directory) is not None:
        return True
    if shutil.which("chattr") and subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode == 0:
        return outputs._probe_writable(directory) is not None
    return False


def test_output_in_a_really_read_only_directory(demo_model_dir, tmp_path, capsys, loads):
    locked = tmp_path / "locked"
    locked.mkdir()
    try:
        if not _make_unwritable(locked):
            pytest.skip("cannot make a directory unwritable for this user here")
        line = run_refused(capsys, loads, demo_model_dir, locked / "o.png")
        assert f"cannot create files in {locked}" in line
    finally:
        if shutil.which("chattr"):
            subprocess.run(["chattr", "-i", str(locked)], capture_output=True)
        locked.chmod(0o755)
