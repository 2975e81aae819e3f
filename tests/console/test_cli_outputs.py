"""What a run returns is what it writes: a non-finite parameter is refused before load (exit 2); an
all-NaN or all-black decode is one line, exit 1, no file; exit 0 always leaves the file named."""

from __future__ import annotations

import json

import pytest
import torch
from cli_helpers import one_error_line

from omni_console.console.cli import main

BASE = ["--device", "cpu", "--steps", "1", "--height", "32", "--width", "32", "--prompt", "a fox"]


@pytest.mark.parametrize("param", ["sigmas=[NaN]", "sigmas=[Infinity]", "sigmas=[1e999]", "sigmas=[-Infinity]"])
def test_a_non_finite_parameter_is_refused_before_load(param, demo_model_dir, tmp_path, capsys, loads):
    out = tmp_path / "o.png"
    code = main(["run", "--model", str(demo_model_dir), "--output", str(out), *BASE, "--param", param])
    line = one_error_line(capsys)
    assert code == 2 and loads == [] and not out.exists()
    assert "sigmas: holds a non-finite number (NaN or infinity)" in line


@pytest.mark.slow  # loads the demo model and runs one step
@pytest.mark.parametrize("fill", [float("nan"), 0.0], ids=["nan", "black"])
def test_a_nan_or_black_decode_keeps_no_file_and_exits_1(fill, demo_model_dir, tmp_path, capsys, monkeypatch):
    from diffusers import AutoencoderKL
    from diffusers.models.autoencoders.vae import DecoderOutput

    def blank_decode(self, z, *args, **kwargs):
        # -1 is black after diffusers' (x / 2 + 0.5) denormalisation; NaN stays NaN
        value = fill if fill != fill else -1.0
        return DecoderOutput(sample=torch.full((z.shape[0], 3, z.shape[2] * 8, z.shape[3] * 8), value))

    monkeypatch.setattr(AutoencoderKL, "decode", blank_decode)
    out = tmp_path / "o.png"
    code = main(["run", "--model", str(demo_model_dir), "--output", str(out), *BASE])
    err = capsys.readouterr().err.splitlines()
    assert code == 1 and not out.exists() and list(tmp_path.iterdir()) == []
    assert err[-1].startswith("omni-console: generation failed: FluxPipeline decoded to ")
    assert "no file written" in err[-1] and not any("Traceback" in line for line in err)


def test_a_normal_run_writes_its_file_and_reports_the_rendered_size(demo_model_dir, tmp_path, capsys):
    out = tmp_path / "o.png"
    assert main(["run", "--model", str(demo_model_dir), "--output", str(out), *BASE, "--json"]) == 0
    assert out.is_file() and out.stat().st_size > 0
    report = json.loads(capsys.readouterr().out)
    assert report["rendered_size"] == [32, 32] and report["files"] == [str(out)]


