"""Tiny offline models: deterministic, safetensors-only, and loadable by the real diffusers pipelines."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from omni_console.engine.demo_model import (
    COMPLETE_MARKER,
    DEMO_GENERATION,
    build_demo_model,
    default_demo_model_path,
    ensure_demo_model,
)

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".h5", ".gguf")


def _hashes(root: Path) -> dict[str, str]:
    return {
        str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(root.rglob("*"))
        if f.is_file()
    }


def _weight_files(root: Path) -> list[Path]:
    return [f for f in root.rglob("*") if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES)]


def _total_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


# --- demo (Flux) -------------------------------------------------------------------------------


def test_demo_same_seed_is_byte_identical(demo_model_dir: Path, tmp_path: Path) -> None:
    torch.manual_seed(1234)  # the caller's RNG state must not leak into the build
    again = build_demo_model(tmp_path / "again", seed=0)
    first, second = _hashes(demo_model_dir), _hashes(again)
    assert first == second
    assert any(name.endswith(".safetensors") for name in first)


def test_demo_different_seed_differs(demo_model_dir: Path, tmp_path: Path) -> None:
    other = _hashes(build_demo_model(tmp_path / "seed1", seed=1))
    base = _hashes(demo_model_dir)
    assert base.keys() == other.keys()
    changed = {name for name in base if base[name] != other[name]}
    weights = {name for name in base if name.endswith(".safetensors")}
    assert weights and weights <= changed


def test_demo_layout_is_safetensors_only_and_small(demo_model_dir: Path) -> None:
    weights = _weight_files(demo_model_dir)
    assert weights and all(f.suffix == ".safetensors" for f in weights), weights
    index = json.loads((demo_model_dir / "model_index.json").read_text())
    assert index["_class_name"] == "FluxPipeline"
    assert index["transformer"] == ["diffusers", "FluxTransformer2DModel"]
    assert index["tokenizer"] == ["transformers", "CLIPTokenizer"]
    assert index["tokenizer_2"] == ["transformers", "T5TokenizerFast"]
    for comp in ("transformer", "vae", "text_encoder", "text_encoder_2"):
        assert list((demo_model_dir / comp).glob("*.safetensors")), comp
    assert 1_000_000 < _total_bytes(demo_model_dir) < 10_000_000
    assert (demo_model_dir / COMPLETE_MARKER).is_file()
    assert not [p for p in demo_model_dir.parent.iterdir() if ".tmp-" in p.name]


def test_demo_transformer_block_lists(demo_model_dir: Path) -> None:
    from safetensors import safe_open

    path = demo_model_dir / "transformer" / "diffusion_pytorch_model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        keys = list(f.keys())
    double = {k.split(".")[1] for k in keys if k.startswith("transformer_blocks.")}
    single = {k.split(".")[1] for k in keys if k.startswith("single_transformer_blocks.")}
    assert double == {"0", "1"}
    assert single == {"0", "1", "2", "3"}


def test_demo_generates_with_flux_pipeline(demo_model_dir: Path) -> None:
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(str(demo_model_dir), local_files_only=True)
    assert len(pipe.transformer.transformer_blocks) == 2
    assert len(pipe.transformer.single_transformer_blocks) == 4

    def run(**overrides: object):
        kwargs = {**DEMO_GENERATION, **overrides}
        gen = torch.Generator().manual_seed(0)
        return pipe("a photo of a cat", generator=gen, output_type="np", **kwargs).images

    images = run()
    assert images.shape == (1, DEMO_GENERATION["height"], DEMO_GENERATION["width"], 3)
    assert float(images.std()) > 0.0
    assert torch.equal(torch.from_numpy(images), torch.from_numpy(run()))  # same seed, same pixels
    assert run(height=32, width=48).shape == (1, 32, 48, 3)


def test_ensure_demo_model_builds_once_into_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    expected = default_demo_model_path(0)
    assert expected.parent == tmp_path / "cache"
    assert expected.name.startswith("demo-flux-v") and expected.name.endswith("-seed0")
    path = ensure_demo_model(0)
    assert path == expected and (path / COMPLETE_MARKER).is_file()
    stamp = (path / "model_index.json").stat().st_mtime_ns
    assert ensure_demo_model(0) == path
    assert (path / "model_index.json").stat().st_mtime_ns == stamp  # reused, not rebuilt


def test_ensure_demo_model_replaces_incomplete_leftover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    target = default_demo_model_path(0)
    target.mkdir(parents=True)
    (target / "model_index.json").write_text("{}")  # a half-written folder, no marker
    path = ensure_demo_model(0)
    assert json.loads((path / "model_index.json").read_text())["_class_name"] == "FluxPipeline"


def test_session_cache_dir_is_isolated(_isolated_cache_dir: Path) -> None:
    import os

    assert os.environ["OMNI_CONSOLE_CACHE_DIR"] == str(_isolated_cache_dir)
    assert default_demo_model_path(0).parent == _isolated_cache_dir
