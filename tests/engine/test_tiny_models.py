"""Tiny offline models: deterministic, safetensors-only, and loadable by the real diffusers pipelines."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from omni_console.engine.demo.build_dir import COMPLETE_MARKER
from omni_console.engine.demo.demo_model import (
    DEMO_GENERATION,
    build_demo_model,
    default_demo_model_path,
    ensure_demo_model,
)

pytestmark = pytest.mark.slow  # end to end (builds and runs every tiny family): .ci/run runs it, `pytest -q` skips it

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


def test_ensure_demo_model_replaces_incomplete_leftover(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
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


# --- other families ----------------------------------------------------------------------------

FAMILIES = {
    # fixture: (family key, pipeline class, builder, model_index class, block lists and counts)
    "sd3_model_dir": ("sd3", "StableDiffusion3Pipeline", "build_tiny_sd3", {"transformer_blocks": 3}),
    "pixart_model_dir": ("pixart_sigma", "PixArtSigmaPipeline", "build_tiny_pixart_sigma", {"transformer_blocks": 4}),
    "wan_model_dir": ("wan", "WanPipeline", "build_tiny_wan", {"blocks": 3}),
}


@pytest.mark.parametrize("fixture", list(FAMILIES))
def test_family_layout_and_determinism(fixture: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    import tiny_families

    _, pipeline_name, builder_name, _ = FAMILIES[fixture]
    root: Path = request.getfixturevalue(fixture)
    index = json.loads((root / "model_index.json").read_text())
    assert index["_class_name"] == pipeline_name
    weights = _weight_files(root)
    assert weights and all(f.suffix == ".safetensors" for f in weights), weights
    assert _total_bytes(root) < 10_000_000

    builder = getattr(tiny_families, builder_name)
    torch.manual_seed(99)
    assert _hashes(builder(tmp_path / "same", seed=0)) == _hashes(root)
    base, other = _hashes(root), _hashes(builder(tmp_path / "other", seed=1))
    assert {n for n in base if n.endswith(".safetensors")} <= {n for n in base if base[n] != other[n]}


@pytest.mark.parametrize("fixture", list(FAMILIES))
def test_family_loads_and_generates(fixture: str, request: pytest.FixtureRequest) -> None:
    import diffusers
    from tiny_families import FAMILY_GENERATION

    family, pipeline_name, _, blocks = FAMILIES[fixture]
    root: Path = request.getfixturevalue(fixture)
    if family == "wan":
        request.getfixturevalue("wan_loadable")
    pipe = getattr(diffusers, pipeline_name).from_pretrained(str(root), local_files_only=True)
    for attr, count in blocks.items():
        assert len(getattr(pipe.transformer, attr)) == count
    kwargs = FAMILY_GENERATION[family]
    out = pipe("a photo of a cat", generator=torch.Generator().manual_seed(0), output_type="np", **kwargs)
    if family == "wan":
        frames = out.frames
        assert frames.shape == (1, kwargs["num_frames"], kwargs["height"], kwargs["width"], 3)
    else:
        frames = out.images
        assert frames.shape == (1, kwargs["height"], kwargs["width"], 3)
    assert float(frames.std()) > 0.0


# --- sharded and variant layouts ---------------------------------------------------------------


def _tensor_dtypes(path: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {str(f.get_slice(k).get_dtype()) for k in f.keys()}  # noqa: SIM118 - safe_open is not a dict


def test_sharded_transformer_layout_loads_same_weights(demo_model_dir: Path, tmp_path: Path) -> None:
    from diffusers import FluxPipeline
    from tiny_families import build_tiny_flux

    root = build_tiny_flux(tmp_path / "sharded", seed=0, shard_transformer=True)
    names = sorted(p.name for p in (root / "transformer").iterdir())
    assert names == [
        "config.json",
        "diffusion_pytorch_model-00001-of-00002.safetensors",
        "diffusion_pytorch_model-00002-of-00002.safetensors",
        "diffusion_pytorch_model.safetensors.index.json",
    ]
    weight_map = json.loads((root / "transformer" / "diffusion_pytorch_model.safetensors.index.json").read_text())[
        "weight_map"
    ]
    assert set(weight_map.values()) == set(names[1:3])
    assert (root / "vae" / "diffusion_pytorch_model.safetensors").is_file()  # only the transformer is sharded

    def render(path: Path):
        pipe = FluxPipeline.from_pretrained(str(path), local_files_only=True)
        gen = torch.Generator().manual_seed(0)
        return torch.from_numpy(pipe("a cat", generator=gen, output_type="np", **DEMO_GENERATION).images)

    assert torch.equal(render(root), render(demo_model_dir))


def test_fp16_variant_only(tmp_path: Path) -> None:
    from diffusers import PixArtSigmaPipeline
    from tiny_families import build_tiny_pixart_sigma

    root = build_tiny_pixart_sigma(tmp_path / "fp16", seed=0, variant="fp16")
    weights = _weight_files(root)
    assert weights and all(f.name.endswith(".fp16.safetensors") for f in weights), weights
    assert {f.parent.name for f in weights} == {"transformer", "text_encoder", "vae"}
    assert _tensor_dtypes(root / "transformer" / "diffusion_pytorch_model.fp16.safetensors") == {"F16"}
    pipe = PixArtSigmaPipeline.from_pretrained(str(root), local_files_only=True, variant="fp16")
    from safetensors.torch import load_file

    stored = load_file(str(root / "transformer" / "diffusion_pytorch_model.fp16.safetensors"))
    loaded = pipe.transformer.state_dict()
    assert stored.keys() == loaded.keys()
    assert all(torch.equal(stored[k].float(), loaded[k].float()) for k in stored)


def test_variant_beside_default_with_sharding(tmp_path: Path) -> None:
    from tiny_families import build_tiny_sd3

    root = build_tiny_sd3(tmp_path / "both", seed=0, variant="fp16", keep_default=True, shard_transformer=True)
    names = sorted(p.name for p in (root / "transformer").iterdir())
    assert names == [
        "config.json",
        "diffusion_pytorch_model-00001-of-00002.safetensors",
        "diffusion_pytorch_model-00002-of-00002.safetensors",
        "diffusion_pytorch_model.fp16-00001-of-00002.safetensors",
        "diffusion_pytorch_model.fp16-00002-of-00002.safetensors",
        "diffusion_pytorch_model.safetensors.index.fp16.json",
        "diffusion_pytorch_model.safetensors.index.json",
    ]
    for enc in ("text_encoder", "text_encoder_2", "text_encoder_3"):
        assert {p.name for p in (root / enc).glob("*.safetensors")} == {"model.safetensors", "model.fp16.safetensors"}
        assert _tensor_dtypes(root / enc / "model.safetensors") == {"F32"}
        assert _tensor_dtypes(root / enc / "model.fp16.safetensors") == {"F16"}
        # configs stay those of the float32 default files
        assert json.loads((root / enc / "config.json").read_text())["dtype"] == "float32"


def test_demo_model_never_replaces_a_folder_of_other_files(tmp_path: Path, capsys):
    from omni_console.console.cli import main

    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("precious")
    assert main(["demo-model", str(user)]) == 2
    assert "not an omni-console demo model" in capsys.readouterr().err
    assert (user / "notes.txt").read_text() == "precious" and len(list(user.iterdir())) == 1
    (tmp_path / "file").write_text("x")
    assert main(["demo-model", str(tmp_path / "file")]) == 2
    # a new folder, then a rebuild over the earlier demo build, are fine
    assert main(["demo-model", str(tmp_path / "demo")]) == 0
    assert main(["demo-model", str(tmp_path / "demo")]) == 0
