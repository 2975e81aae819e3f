"""LoRAs through the engine against plain diffusers set up the same way.

sidecar: bit-identical to `DiffusionPipeline.from_pretrained(dir)` + `load_lora_weights(file)` + `set_adapters`
with the same scale; merge: to the same pipeline after `fuse_lora(components=<every LoRA-loadable component>,
lora_scale=)` (Flux's `fuse_lora` fuses only the transformer by default, leaving a text encoder's LoRA unfused
at scale 1; the engine merges every component at the operator's scale). Every policy the family tests
use, plus one whose ring holds every streamed block (a block then stays in its slot between forwards and must
not be merged twice), and two requests per load (the second finds the slots as the first left them).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from lora_writers import write_kohya_flux_lora, write_peft_lora

from omni_console.engine.engine import Engine
from omni_console.engine.options import EngineOptions
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.policy import build_policy

PROMPT = "a red fox in the snow"
FLUX_REQUEST = GenerateRequest(prompt=PROMPT, steps=2, height=64, width=64, seed=3, guidance=3.0, output_type="np")
WAN_REQUEST = GenerateRequest(prompt=PROMPT, steps=2, height=32, width=32, frames=5, seed=3, guidance=3.0,
                              max_sequence_length=32, output_type="np")


def policies(blocks: int) -> list:
    return [build_policy({}, 0), build_policy({"default": False}, 1), build_policy({"vae": False}, blocks),
            build_policy({}, 1, placement="spread"), build_policy({}, 0, prefetch_slots=blocks),
            build_policy({}, 0, mode="resident")]


def plain_output(path: Path, request: GenerateRequest, loras: list[tuple[Path, float]], mode: str) -> np.ndarray:
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    names = [f"plain{i}" for i in range(len(loras))]
    for (file, _), name in zip(loras, names, strict=True):
        pipe.load_lora_weights(str(file), adapter_name=name)
    if not loras:
        pass
    elif mode == "merge" and len(loras) == 1:  # every component with LoRA layers (Flux's default: the transformer)
        pipe.fuse_lora(components=list(pipe._lora_loadable_modules), lora_scale=loras[0][1])
    else:
        pipe.set_adapters(names, [scale for _, scale in loras])
        if mode == "merge":
            pipe.fuse_lora(components=list(pipe._lora_loadable_modules))
    out = pipe(**request.call_kwargs(pipe))
    return np.asarray(out.frames[0] if hasattr(out, "frames") else out.images)


def engine_outputs(path: Path, request: GenerateRequest, loras: list[tuple[Path, float]], mode: str,
                   blocks: int) -> list[tuple[object, np.ndarray, int]]:
    """(policy, output, blocks merged on upload) for two requests under each policy."""
    options = EngineOptions(loras=tuple((str(f), s) for f, s in loras), lora_mode=mode)
    engine = Engine(path, device="cpu", options=options)
    outs = []
    try:
        for policy in policies(blocks):
            engine.load(policy)
            for _ in range(2):
                result = engine.generate(request)
                got = np.stack(result.frames) if result.is_video else np.asarray(result.image)[None]
                merge = engine._loras_applied.merge
                outs.append((policy, got, merge.merged_blocks if merge is not None else 0))
            engine.unload()
    finally:
        engine.close()
    return outs


def assert_same(outs: list, expected: np.ndarray) -> None:
    for policy, got, _ in outs:
        assert got.size == expected.size and np.array_equal(got.reshape(expected.shape), expected), policy


@pytest.mark.slow  # 12 loads and 24 requests of the demo model, 2 plain pipelines
@pytest.mark.parametrize("mode", ["sidecar", "merge"])
def test_flux_peft_lora_is_bit_identical_to_diffusers(demo_model_dir: Path, tmp_path: Path, mode: str):
    lora = write_peft_lora(tmp_path / "style.safetensors", demo_model_dir / "transformer", "transformer",
                           pattern=r"attn\.(to_|add_)|ff", seed=1)
    base = plain_output(demo_model_dir, FLUX_REQUEST, [], "sidecar")
    expected = plain_output(demo_model_dir, FLUX_REQUEST, [(lora, 0.7)], mode)
    assert not np.array_equal(base, expected)  # the LoRA changes the image
    outs = engine_outputs(demo_model_dir, FLUX_REQUEST, [(lora, 0.7)], mode, blocks=6)
    assert_same(outs, expected)
    merged = [n for policy, _, n in outs if policy.mode == "dlo"]
    assert (max(merged) > 0) == (mode == "merge")  # merge mode really merged on upload


@pytest.mark.slow  # two LoRAs in two key styles, both modes
@pytest.mark.parametrize("mode", ["sidecar", "merge"])
def test_flux_kohya_and_peft_loras_at_once(demo_model_dir: Path, tmp_path: Path, mode: str):
    kohya = write_kohya_flux_lora(tmp_path / "kohya.safetensors", double=2, single=4, inner=64, mlp=256, seed=2)
    peft = write_peft_lora(tmp_path / "peft.safetensors", demo_model_dir / "transformer", "transformer",
                           pattern=r"single_transformer_blocks\.\d+\.(attn|proj_mlp)", seed=3)
    loras = [(kohya, 0.75), (peft, 0.5)]  # scales exact in binary: set_adapters' and fuse_lora's products agree
    expected = plain_output(demo_model_dir, FLUX_REQUEST, loras, mode)
    outs = engine_outputs(demo_model_dir, FLUX_REQUEST, loras, mode, blocks=6)
    assert_same(outs, expected)


@pytest.mark.slow  # a video family: Wan's blocks, its LoRA keys as diffusers loads them
@pytest.mark.parametrize("mode", ["sidecar", "merge"])
def test_wan_lora_is_bit_identical_to_diffusers(wan_model_dir: Path, wan_loadable, tmp_path: Path, mode: str):
    lora = write_peft_lora(tmp_path / "wan.safetensors", wan_model_dir / "transformer", "transformer",
                           pattern=r"blocks\.\d+\.(attn1|attn2|ffn)", seed=4)
    expected = plain_output(wan_model_dir, WAN_REQUEST, [(lora, 0.7)], mode)
    outs = engine_outputs(wan_model_dir, WAN_REQUEST, [(lora, 0.7)], mode, blocks=3)
    assert_same(outs, expected)


@pytest.mark.slow  # a load and a request
def test_merge_leaves_the_host_masters_as_they_were(demo_model_dir: Path, tmp_path: Path):
    """Merging writes only device slots: every streamed block's bytes in the host arena are unchanged."""
    lora = write_peft_lora(tmp_path / "m.safetensors", demo_model_dir / "transformer", "transformer",
                           pattern=r"attn\.to_", seed=5)
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(loras=((str(lora), 1.0),), lora_mode="merge"))
    try:
        engine.load(build_policy({}, 0))
        arena = engine.placement.streamer.filler.arena
        before = arena.tensor.clone()
        engine.generate(GenerateRequest(prompt=PROMPT, steps=1, height=64, width=64, seed=0, output_type="np"))
        assert engine._loras_applied.merge.merged_blocks >= 6
        assert torch.equal(arena.tensor, before)
    finally:
        engine.close()


@pytest.mark.slow  # two loads, four requests, two plain pipelines
@pytest.mark.parametrize("mode", ["sidecar", "merge"])
def test_text_encoder_keys_apply_as_diffusers_applies_them(demo_model_dir: Path, tmp_path: Path, mode: str):
    """A LoRA on the transformer and the CLIP text encoder (staged: its weights go to the device per call)."""
    from safetensors.torch import load_file, save_file

    dit = write_peft_lora(tmp_path / "dit.safetensors", demo_model_dir / "transformer", "transformer",
                          pattern=r"attn\.to_", seed=7)
    te = write_peft_lora(tmp_path / "te.safetensors", demo_model_dir / "text_encoder", "text_encoder",
                         pattern=r"self_attn\.(q|v)_proj", seed=8)
    both = tmp_path / "both.safetensors"
    save_file({**load_file(str(dit)), **load_file(str(te))}, str(both))
    expected = plain_output(demo_model_dir, FLUX_REQUEST, [(both, 0.7)], mode)
    assert not np.array_equal(expected, plain_output(demo_model_dir, FLUX_REQUEST, [(dit, 0.7)], mode))
    options = EngineOptions(loras=((str(both), 0.7),), lora_mode=mode)
    engine = Engine(demo_model_dir, device="cpu", options=options)
    try:
        assert sorted(engine.loras[0].components) == ["text_encoder", "transformer"]
        for policy in (build_policy({}, 0), build_policy({"default": False}, 1)):  # encoder staged, then resident
            engine.load(policy)
            got = np.asarray(engine.generate(FLUX_REQUEST).image)[None]
            assert np.array_equal(got.reshape(expected.shape), expected), policy
            engine.unload()
    finally:
        engine.close()
