"""Kandinsky 5 T2I and HiDream render sizes of their own: a size they would replace is refused before
load, naming the size they render (they rendered 1024x1024 for 64x64 without a word)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from omni_console.engine.errors import ConfigError
from omni_console.engine.running.fixed_sizes import check_fixed_sizes, hidream_rendered, listed_resolutions

NAMES = {"height": "--height", "width": "--width"}


def _model(pipeline: str, vae_folder=None):
    vaes = [SimpleNamespace(folder=vae_folder)] if vae_folder is not None else []
    return SimpleNamespace(pipeline_class=pipeline, by_role=lambda role: vaes if role == "vae" else [])


def test_kandinsky5_t2i_refuses_64x64_naming_the_sizes_it_renders():
    with pytest.raises(ConfigError) as refused:
        check_fixed_sizes(_model("Kandinsky5T2IPipeline"), 64, 64, NAMES)
    line = str(refused.value)
    assert line.startswith("--height 64 --width 64: Kandinsky5T2IPipeline renders only 1024x1024, 640x1408")


def test_kandinsky5_t2i_takes_each_listed_size_and_its_default():
    sizes = listed_resolutions("Kandinsky5T2IPipeline")
    assert sizes is not None and (1024, 1024) in sizes
    for width, height in sizes:
        check_fixed_sizes(_model("Kandinsky5T2IPipeline"), height, width, NAMES)
    check_fixed_sizes(_model("Kandinsky5T2IPipeline"), None, None, NAMES)


def test_hidream_refuses_64x64_naming_1024x1024(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"block_out_channels": [128, 256, 512, 512]}))
    with pytest.raises(ConfigError, match=r"would render 1024x1024 \(it scales every request to 1024x1024"):
        check_fixed_sizes(_model("HiDreamImagePipeline", tmp_path), 64, 64, NAMES)
    check_fixed_sizes(_model("HiDreamImagePipeline", tmp_path), 1024, 1024, NAMES)


def test_hidream_size_follows_diffusers_arithmetic_with_a_tiny_vae(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"block_out_channels": [32, 64]}))  # factor 2: 256x256
    assert hidream_rendered(64, 64, 2) == (256, 256)
    check_fixed_sizes(_model("HiDreamImagePipeline", tmp_path), 256, 256, NAMES)
    with pytest.raises(ConfigError, match="would render 256x256"):
        check_fixed_sizes(_model("HiDreamImagePipeline", tmp_path), 64, 64, NAMES)
