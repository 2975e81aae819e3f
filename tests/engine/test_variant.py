"""`--variant NAME`: the chosen files hold that variant, or the operator gets one line and exit 2 —
never a quiet fall-back to the float32 files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from omni_console.console.cli import main
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.model_dir.weights import ModelDirError, find_weights


def _plan_error(capsys, model: Path, variant: str) -> str:
    assert main(["plan", "--model", str(model), "--variant", variant]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "Traceback" not in captured.err
    return captured.err


def test_variant_absent_from_every_component_is_refused(demo_model_dir: Path, capsys):
    err = _plan_error(capsys, demo_model_dir, "fp16")
    assert err.startswith("omni-console: error: --variant fp16: ")
    assert "has no fp16 files (it has: plain)" in err
    weighted = [c.name for c in discover_model(demo_model_dir).components if c.has_weights]
    assert any(f": {name} has no fp16 files" in err for name in weighted), err


def test_component_lacking_the_variant_is_named(demo_model_dir: Path, tmp_path: Path, capsys):
    model = tmp_path / "model"
    shutil.copytree(demo_model_dir, model)
    weighted = [c for c in discover_model(model).components if c.has_weights]
    for comp in weighted:  # every component gets fp16 files ...
        for plain in list((model / comp.name).glob("*.safetensors")):
            shutil.copyfile(plain, plain.with_name(plain.name.replace(".safetensors", ".fp16.safetensors")))
    lacking = weighted[-1].name  # ... but one, whose fp16 files are removed again
    for fp16 in (model / lacking).glob("*.fp16.safetensors"):
        fp16.unlink()

    err = _plan_error(capsys, model, "fp16")
    assert f"--variant fp16: {lacking} has no fp16 files (it has: plain)" in err

    for plain in list((model / lacking).glob("*.safetensors")):  # complete the variant: only fp16 files are read
        shutil.copyfile(plain, plain.with_name(plain.name.replace(".safetensors", ".fp16.safetensors")))
    found = discover_model(model, "fp16")
    for comp in found.components:
        if comp.has_weights:
            assert comp.variant == "fp16" and comp.files and all(".fp16." in f.name for f in comp.files), comp.name
        else:  # tokenizers and schedulers: no weights, no variant, no refusal
            assert comp.variant is None and not comp.files


def test_variant_only_model(tmp_path: Path, capsys):
    from tiny_families import build_tiny_pixart_sigma

    model = build_tiny_pixart_sigma(tmp_path / "fp16", seed=0, variant="fp16")
    for variant in (None, "fp16"):  # a variant-only folder is read without --variant as well
        dits = discover_model(model, variant).dits
        assert dits[0].variant == "fp16" and all(".fp16." in f.name for f in dits[0].files)
    err = _plan_error(capsys, model, "bf16")
    assert "--variant bf16: " in err and "has no bf16 files (it has: fp16)" in err


def test_sharded_variant_listed_once(tmp_path: Path):
    from tiny_families import build_tiny_sd3

    model = build_tiny_sd3(tmp_path / "both", seed=0, variant="fp16", keep_default=True, shard_transformer=True)
    chosen = find_weights(model / "transformer", "fp16")
    assert chosen is not None and chosen.variant == "fp16" and len(chosen.files) == 2
    assert all(".fp16-" in f.name for f in chosen.files)
    with pytest.raises(ModelDirError) as refused:
        find_weights(model / "transformer", "bf16")
    assert "--variant bf16: transformer has no bf16 files (it has: plain, fp16) in " in str(refused.value)
