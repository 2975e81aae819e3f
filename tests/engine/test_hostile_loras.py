"""Hostile `--lora` files: each is one line on stderr and exit 2, before anything loads, never a traceback,
and nothing is ever unpickled. The good LoRA beside them shows its bytes in the plan."""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from lora_writers import write_peft_lora
from no_pickle_guard import no_unpickling  # noqa: F401  (fixture)
from safetensors.torch import save_file

from omni_console.console.cli import main
from omni_console.console.lora_flags import MAX_SCALE, lora_spec
from omni_console.engine.engine import Engine

Q = "transformer.transformer_blocks.0.attn.to_q"  # the demo's first attention query (64 -> 64)


def _good(path: Path, **changes: torch.Tensor) -> Path:
    tensors = {f"{Q}.lora_A.weight": torch.ones(4, 64) * 0.01, f"{Q}.lora_B.weight": torch.ones(64, 4) * 0.01}
    tensors.update(changes)
    save_file(tensors, str(path))
    return path


def _pickle(path: Path) -> Path:
    path.write_bytes(pickle.dumps({f"{Q}.lora_A.weight": [0.0] * 8}))
    return path


def _huge_header(path: Path) -> Path:
    path.write_bytes(struct.pack("<Q", 2**40) + b"{}")
    return path


def _many(path: Path) -> Path:
    save_file({f"transformer.t{i}.lora_A.weight": torch.zeros(1) for i in range(10_000)}, str(path))
    return path


CASES = {
    "pickle named .safetensors": (_pickle, "its safetensors header claims"),
    "huge header": (_huge_header, "more than the 16 MiB a LoRA's needs"),
    "truncated": (lambda p: (p.write_bytes(b"\x01\x00"), p)[1], "shorter than its header length"),
    "not safetensors": (lambda p: _good(p.with_suffix(".pt")), "not a .safetensors file"),
    "mismatched shapes": (lambda p: _good(p, **{f"{Q}.lora_A.weight": torch.ones(4, 65)}),
                          f"key {Q}.lora_A.weight: A (4, 65) and B (64, 4) do not fit"),
    "rank mismatch": (lambda p: _good(p, **{f"{Q}.lora_B.weight": torch.ones(64, 3)}), "rank or shape mismatch"),
    "NaN": (lambda p: _good(p, **{f"{Q}.lora_B.weight": torch.full((64, 4), float("nan"))}),
            f"tensor {Q}.lora_B.weight holds non-finite values"),
    "inf": (lambda p: _good(p, **{f"{Q}.lora_A.weight": torch.full((4, 64), float("inf"))}), "non-finite"),
    "keys for another family": (
        lambda p: _good(p, **{"transformer.blocks.0.attn1.to_q.lora_A.weight": torch.ones(4, 64),
                              "transformer.blocks.0.attn1.to_q.lora_B.weight": torch.ones(64, 4)}),
        "key transformer.blocks.0.attn1.to_q.lora_A.weight matches no linear or conv module of transformer"),
    "another pipeline's component": (
        lambda p: _good(p, **{"unet.down_blocks.0.lora_A.weight": torch.ones(4, 64)}),
        "key unet.down_blocks.0.lora_A.weight names no component of this FluxPipeline"),
    "A without B": (lambda p: (save_file({f"{Q}.lora_A.weight": torch.ones(4, 64)}, str(p)), p)[1],
                    "has no lora_B beside it"),
    "10,000 tiny tensors": (_many, "10000 tensors, more than the 8192 a LoRA holds"),
    "a folder": (lambda p: (p.mkdir(), p)[1], "not a regular file"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_lora_is_one_line_before_load(case: str, demo_model_dir: Path, tmp_path: Path, capsys,
                                              no_unpickling):  # noqa: F811
    make, words = CASES[case]
    path = make(tmp_path / "lora.safetensors")
    capsys.readouterr()
    code = main(["plan", "--model", str(demo_model_dir), "--device", "cpu", "--lora", str(path)])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, (code, err)
    assert lines[0].startswith(f"omni-console: error: --lora {path}: ") and words in lines[0], lines[0]
    assert "Traceback" not in err


def test_run_refuses_a_bad_lora_before_load(demo_model_dir: Path, tmp_path: Path, monkeypatch, capsys):
    path = _good(tmp_path / "nan.safetensors", **{f"{Q}.lora_B.weight": torch.full((64, 4), float("nan"))})
    loads: list[str] = []
    monkeypatch.setattr(Engine, "load", lambda self, *a, **k: loads.append("load"))
    code = main(["run", "--model", str(demo_model_dir), "--device", "cpu", "--lora", f"{path}:0.5",
                 "--output", str(tmp_path / "out.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and loads == [] and len(err) == 1 and "non-finite" in err[0]
    assert not (tmp_path / "out.png").exists()


def test_plan_shows_each_lora_and_its_bytes(demo_model_dir: Path, tmp_path: Path, capsys):
    lora = write_peft_lora(tmp_path / "style.safetensors", demo_model_dir / "transformer", "transformer",
                           pattern=r"attn\.to_q", seed=0)
    from safetensors import safe_open

    with safe_open(str(lora), framework="pt") as f:
        nbytes = sum(f.get_tensor(k).nbytes for k in f.keys())  # noqa: SIM118 (not a dict)
    capsys.readouterr()
    assert main(["plan", "--model", str(demo_model_dir), "--device", "cpu", "--lora", f"{lora}:0.8",
                 "--lora-mode", "sidecar"]) == 0
    out = capsys.readouterr().out
    assert f"LoRA style.safetensors: {nbytes / 1e3:.1f} kB at scale 0.8 on transformer" in out
    assert "LoRA mode sidecar: A/B kept on the device" in out
    assert f"LoRA in the vLLM-Omni export: Omni(..., lora_path={tmp_path})" in out
    assert "lora_scale=0.8" in out and "cannot express: vLLM-Omni reads a PEFT adapter folder" in out
    assert main(["plan", "--model", str(demo_model_dir), "--device", "cpu", "--json", "--lora", str(lora)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["loras"] == [{"path": str(lora), "bytes": nbytes, "scale": 1.0, "components": ["transformer"],
                                  "mode": "auto"}]
    assert document["lora"]["vllm_omni"].startswith(f"Omni(..., lora_path={tmp_path})")


@given(st.floats(min_value=-MAX_SCALE, max_value=MAX_SCALE, allow_nan=False))
def test_lora_spec_reads_path_and_scale(scale: float):
    assert lora_spec(f"a/b.safetensors:{scale!r}") == ("a/b.safetensors", scale)
    assert lora_spec("a/b.safetensors") == ("a/b.safetensors", 1.0)
    assert lora_spec("c:d/e.safetensors") == ("c:d/e.safetensors", 1.0)  # not a number: part of the path


@pytest.mark.parametrize("text", ["x.safetensors:nan", "x.safetensors:inf", "x.safetensors:1e9"])
def test_lora_spec_refuses_a_scale_that_is_not_finite_or_too_large(text: str, capsys):
    assert main(["plan", "--lora", text]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "must be a finite number" in err[0]


def test_merge_into_fp8_resident_blocks_is_refused_before_load(demo_model_dir: Path, tmp_path: Path, monkeypatch,
                                                               capsys):
    lora = _good(tmp_path / "ok.safetensors")
    loads: list[str] = []
    monkeypatch.setattr(Engine, "load", lambda self, *a, **k: loads.append("load"))
    base = ["run", "--model", str(demo_model_dir), "--device", "cpu", "--lora", str(lora),
            "--stream-dtype", "float8_e4m3fn", "--resident-layers", "2", "--output", str(tmp_path / "o.png")]
    assert main([*base, "--upcast-resident", "off", "--lora-mode", "merge"]) == 2 and loads == []
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["omni-console: error: --lora-mode merge with fp8 resident blocks upcast per forward would merge "
                   "into fp8 storage: use --lora-mode sidecar or --upcast-resident auto|N"]
    main([*base, "--upcast-resident", "off"])  # auto: the sidecar there, planned, then loaded
    main([*base, "--upcast-resident", "off", "--lora-mode", "sidecar"])
    main([*base, "--upcast-resident", "2", "--lora-mode", "merge"])  # resident blocks kept upcast: merged there
    assert loads == ["load", "load", "load"]
