"""Header-only discovery: roles, block lists in execution order and byte totals, checked against
the tensors actually saved; sharded and variant checkpoints; every bad-input case."""

from __future__ import annotations

import json
import re
import shutil
import struct
from collections import defaultdict
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.model_dir.weights import ModelDirError

BLOCK = re.compile(r"^([A-Za-z_]+)\.(\d+)\.")


def saved_tensors(folder: Path) -> dict:
    """Every tensor really saved in a component folder (reads data: the test oracle only)."""
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def saved_block_bytes(folder: Path) -> dict[str, list[int]]:
    per: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for name, t in saved_tensors(folder).items():
        m = BLOCK.match(name)
        if m:
            per[m.group(1)][int(m.group(2))] += t.numel() * t.element_size()
    return {attr: [d[i] for i in range(len(d))] for attr, d in per.items()}


def test_demo_model_roles_blocks_and_bytes(demo_model_dir: Path):
    model = discover_model(demo_model_dir)
    assert model.pipeline_class == "FluxPipeline"
    roles = {c.name: c.role for c in model.components}
    assert roles == {"scheduler": "other", "text_encoder": "encoder", "text_encoder_2": "encoder",
                     "tokenizer": "other", "tokenizer_2": "other", "transformer": "dit", "vae": "vae"}
    dit = model.component("transformer")
    assert [(b.attr, b.count) for b in dit.block_lists] == [
        ("transformer_blocks", 2), ("single_transformer_blocks", 4)]  # execution order
    saved = saved_block_bytes(dit.folder)
    for block_list in dit.block_lists:
        assert list(block_list.block_bytes) == saved[block_list.attr]
    for comp in model.components:
        if comp.has_weights:
            tensors = saved_tensors(comp.folder)
            assert comp.nbytes == sum(t.numel() * t.element_size() for t in tensors.values()), comp.name
            assert comp.num_params == sum(t.numel() for t in tensors.values())
    assert dit.non_block_bytes == dit.nbytes - sum(sum(v) for v in saved.values())
    assert model.auxiliary_names == ["text_encoder", "text_encoder_2", "vae"]


@pytest.mark.parametrize("fixture,pipeline,dit_lists,encoders,vaes", [
    ("sd3_model_dir", "StableDiffusion3Pipeline", ["transformer_blocks"],
     ["text_encoder", "text_encoder_2", "text_encoder_3"], ["vae"]),
    ("pixart_model_dir", "PixArtSigmaPipeline", ["transformer_blocks"], ["text_encoder"], ["vae"]),
    ("wan_model_dir", "WanPipeline", ["blocks"], ["text_encoder"], ["vae"]),
])
def test_other_families(request, fixture, pipeline, dit_lists, encoders, vaes):
    root: Path = request.getfixturevalue(fixture)
    model = discover_model(root)
    assert model.pipeline_class == pipeline
    assert [c.name for c in model.by_role("encoder")] == encoders
    assert [c.name for c in model.by_role("vae")] == vaes
    (dit,) = model.dits
    assert [b.attr for b in dit.block_lists] == dit_lists
    saved = saved_block_bytes(dit.folder)
    for block_list in dit.block_lists:
        assert list(block_list.block_bytes) == saved[block_list.attr]
    tensors = saved_tensors(dit.folder)
    assert dit.nbytes == sum(t.numel() * t.element_size() for t in tensors.values())


def test_sharded_and_variant_checkpoints(tmp_path: Path):
    from tiny_families import build_tiny_pixart_sigma

    sharded = build_tiny_pixart_sigma(tmp_path / "sharded", seed=1, shard_transformer=True)
    model = discover_model(sharded)
    dit = model.dits[0]
    assert len(dit.files) >= 2 and all("-of-" in f.name for f in dit.files)
    assert dit.nbytes == sum(t.numel() * t.element_size() for t in saved_tensors(dit.folder).values())

    variant = build_tiny_pixart_sigma(tmp_path / "variant", seed=1, variant="fp16")
    model = discover_model(variant, variant="fp16")
    assert model.dits[0].variant == "fp16"
    assert all(".fp16." in f.name for f in model.dits[0].files)


def _copy(demo: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(demo, target)
    return target


def _bad_header_file(path: Path, claimed_bytes: int) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [claimed_bytes // 4], "data_offsets": [0, claimed_bytes]}})
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + b"\0" * 16)


def _weights(root: Path, comp: str) -> Path:
    return next((root / comp).glob("*.safetensors"))


BAD_CASES = {
    "missing path": (lambda root: root / "nope", "no such model directory"),
    "file not dir": (lambda root: root / "model_index.json", "is a file"),
    "no model_index": (lambda root: ((root / "model_index.json").unlink(), root)[-1], "no model_index.json"),
    "malformed index": (lambda root: ((root / "model_index.json").write_text("{oops"), root)[-1],
                        "model_index.json: malformed JSON"),
    "malformed config": (lambda root: ((root / "vae" / "config.json").write_text("[1,"), root)[-1],
                         "config.json: malformed JSON"),
    "missing component": (lambda root: (shutil.rmtree(root / "vae"), root)[-1], "component folder for 'vae'"),
    "corrupt header": (lambda root: (_weights(root, "vae").write_bytes(b"\x10\0\0\0\0\0\0\0{not json at all"),
                                     root)[-1], "corrupt safetensors header"),
    "claims more bytes": (lambda root: (_bad_header_file(_weights(root, "vae"), 4096), root)[-1],
                          "corrupt safetensors header"),
    "pickle only": (lambda root: (_weights(root, "vae").unlink(),
                                  (root / "vae" / "diffusion_pytorch_model.bin").write_bytes(b"\x80\x04K\x01."),
                                  root)[-1], "pickle format"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_model_dirs_give_one_clear_line(case, demo_model_dir: Path, tmp_path: Path, capsys):
    from omni_console.console.cli import main

    make, expected = BAD_CASES[case]
    root = make(_copy(demo_model_dir, tmp_path))
    with pytest.raises(ModelDirError, match=re.escape(expected)):
        discover_model(root)
    assert main(["plan", "--model", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and "Traceback" not in err


def test_pickle_is_never_opened(demo_model_dir: Path, tmp_path: Path, monkeypatch):
    """A folder with only a .bin is refused before anything could unpickle it."""
    import pickle

    import torch

    root = _copy(demo_model_dir, tmp_path)
    _weights(root, "vae").unlink()
    (root / "vae" / "diffusion_pytorch_model.bin").write_bytes(b"not even a pickle")
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load called"))
    monkeypatch.setattr(pickle, "load", lambda *a, **k: pytest.fail("pickle.load called"))
    with pytest.raises(ModelDirError, match="never unpickles"):
        discover_model(root)


def test_headers_only_on_a_large_sparse_checkpoint(tmp_path: Path):
    """A 2 GB (sparse) weight file is discovered instantly: only its header is read."""
    import resource

    root = tmp_path / "big"
    (root / "transformer").mkdir(parents=True)
    (root / "model_index.json").write_text(json.dumps(
        {"_class_name": "FluxPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"]}))
    (root / "transformer" / "config.json").write_text("{}")
    n = 2 * 2**30 // 2
    header = {f"blocks.{i}.w": {"dtype": "BF16", "shape": [n // 4], "data_offsets": [i * n // 2, (i + 1) * n // 2]}
              for i in range(4)}
    raw = json.dumps(header).encode()
    path = root / "transformer" / "diffusion_pytorch_model.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + 2 * n)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model = discover_model(root)
    assert model.dits[0].nbytes == 2 * n and model.dits[0].block_lists[0].count == 4
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: far below 2 GB


def test_save_file_roundtrip_other_component(tmp_path: Path):
    """An unknown weighted component is `other` and counted, not staged."""
    import torch

    root = tmp_path / "m"
    (root / "controlnet").mkdir(parents=True)
    (root / "model_index.json").write_text(json.dumps(
        {"_class_name": "StableDiffusionControlNetPipeline", "controlnet": ["diffusers", "ControlNetModel"]}))
    save_file({"a": torch.zeros(10)}, str(root / "controlnet" / "diffusion_pytorch_model.safetensors"))
    model = discover_model(root)
    assert model.components[0].role == "other" and model.components[0].nbytes == 40
