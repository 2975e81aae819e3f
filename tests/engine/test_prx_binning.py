"""PRX bins every request to its 512 px table and resizes the image back (resolution binning, on by
default): 64x64 was rendered at 512x512, silently. A size it would render otherwise is refused before
load, naming the size and how to render the one asked for; `--param use_resolution_binning=false` (as
diffusers' own test passes it) renders the asked size and is not refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_families_loading import stand_in_for_ftfy
from tiny_families_new import build_tiny_new_family

from omni_console.console.cli import main
from omni_console.engine.errors import ConfigError
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.running.call_options import check_call
from omni_console.engine.running.fixed_sizes import prx_rendered
from omni_console.engine.running.runner import GenerateRequest


@pytest.fixture(scope="module")
def prx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_new_family("prx", tmp_path_factory.mktemp("prx") / "prx")


@pytest.fixture(autouse=True)
def without_ftfy(monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in_for_ftfy(monkeypatch, "diffusers.pipelines.prx.pipeline_prx")


def _request(**params) -> GenerateRequest:
    return GenerateRequest(prompt="a fox", steps=2, height=64, width=64, seed=0, params=params)


@pytest.mark.slow  # builds the family (diffusers' imports)
def test_binning_on_is_refused_naming_the_size_it_would_render(prx_dir, tmp_path, capsys):
    capsys.readouterr()
    out = tmp_path / "o.png"
    assert main(["run", "--model", str(prx_dir), "--output", str(out), "--height", "64", "--width", "64"]) == 2
    err = capsys.readouterr().err
    assert err == ("omni-console: error: --height 64 --width 64: PRXPipeline would render 512x512 and resize it "
                   "to 64x64 (resolution binning); pass --param use_resolution_binning=false to render 64x64, or "
                   "ask for 512x512\n"), err
    assert not out.exists()
    model = discover_model(prx_dir)
    assert prx_rendered(model, 64, 64) == (512, 512)  # diffusers' own table, read from its module
    check_call(model, _request(use_resolution_binning=False))  # the asked size: not refused
    with pytest.raises(ConfigError, match="would render 512x512"):
        check_call(model, _request())
    check_call(model, GenerateRequest(prompt="a fox", steps=2, height=512, width=512, seed=0))  # a binned size
