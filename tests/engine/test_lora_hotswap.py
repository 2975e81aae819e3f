"""Switching to a LoRA of the same layout (another LoRA with the same keys and shapes, or the same files at other
scales) is diffusers' hot swap: the PEFT layers stay and take the new A/B. Each request still equals plain
diffusers with that LoRA loaded afresh; anything else (another layout, another count) unloads and loads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from lora_writers import write_peft_lora
from test_lora import FLUX_REQUEST, plain_output

from omni_console.engine.engine import Engine
from omni_console.engine.options import EngineOptions
from omni_console.offload.policy import build_policy


def peft_layers(engine: Engine) -> dict[str, int]:
    """Each PEFT layer of the transformer by name, as the object it is (a hot swap keeps every one)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return {n: id(m) for n, m in engine.pipe.transformer.named_modules() if isinstance(m, BaseTunerLayer)}


@pytest.mark.slow  # one load, five requests, five plain pipelines
def test_a_lora_of_the_same_layout_is_hot_swapped_and_still_matches_diffusers(demo_model_dir: Path,
                                                                                tmp_path: Path):
    pattern = r"attn\.(to_|add_)|ff"
    a, b = (write_peft_lora(tmp_path / f"{n}.safetensors", demo_model_dir / "transformer", "transformer",
                            pattern=pattern, seed=s) for n, s in (("a", 1), ("b", 2)))
    wide = write_peft_lora(tmp_path / "wide.safetensors", demo_model_dir / "transformer", "transformer",
                           pattern=pattern, rank=8, seed=3)  # another rank: another layout
    steps = [  # (lora, scale, mode, hot-swapped)
        (b, 0.5, "merge", True),  # another LoRA of a's layout
        (b, 0.9, "sidecar", True),  # the same file at another scale, in the other mode
        (a, 0.3, "sidecar", True),
        (wide, 0.6, "merge", False),
    ]
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(loras=((str(a), 0.7),), lora_mode="merge"))
    try:
        engine.load(build_policy({}, 2))  # two blocks resident (merged once), the others merged as they arrive
        arena = engine.placement.streamer.filler.arena
        for lora, scale, mode, hot in steps:
            before = peft_layers(engine)
            engine.set_loras(((str(lora), scale),), mode)
            assert (peft_layers(engine) == before) is hot, (lora.name, scale, mode)
            got = np.asarray(engine.generate(FLUX_REQUEST).image)[None]
            expected = plain_output(demo_model_dir, FLUX_REQUEST, [(lora, scale)], mode)
            assert np.array_equal(got.reshape(expected.shape), expected), (lora.name, scale, mode)
        assert engine.placement.streamer.filler.arena is arena  # the base weights were never read again
    finally:
        engine.close()


@pytest.mark.slow  # one load, one switch
def test_a_hot_swap_never_writes_into_the_previous_loras_tensors(demo_model_dir: Path, tmp_path: Path):
    """On a CPU, PEFT's A/B were the checked file's own tensors: swapping the next LoRA in wrote into them, and the
    previous LoRA applied again (a re-plan, the benchmark's switch back) was the next one."""
    import torch

    pattern = r"attn\.(to_|add_)|ff"
    a, b = (write_peft_lora(tmp_path / f"{n}.safetensors", demo_model_dir / "transformer", "transformer",
                            pattern=pattern, seed=s) for n, s in (("a", 1), ("b", 2)))
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(loras=((str(a), 0.7),), lora_mode="sidecar"))
    try:
        engine.load(build_policy({}, 2))
        first = engine.loras[0]
        kept = {k: t.clone() for k, t in first.tensors.items()}
        before = peft_layers(engine)
        engine.set_loras(((str(b), 0.7),), "sidecar")
        assert peft_layers(engine) == before  # it was a hot swap
        assert all(torch.equal(first.tensors[k], t) for k, t in kept.items())
    finally:
        engine.close()


@pytest.mark.slow  # one load, two requests, two plain pipelines
def test_a_same_layout_lora_with_another_alpha_still_matches_diffusers(demo_model_dir: Path, tmp_path: Path):
    """Alike in keys and shapes, unlike in alpha (8 and 2): the hot swap must carry the new alpha into each layer's
    scaling (diffusers 0.42 swaps it; a refusal would load afresh), so each request equals plain diffusers with
    that LoRA loaded afresh, in both modes."""
    pattern = r"attn\.to_|ff"
    x, y = (write_peft_lora(tmp_path / f"{n}.safetensors", demo_model_dir / "transformer", "transformer",
                            pattern=pattern, seed=s, alpha=alpha) for n, s, alpha in (("x", 5, 8.0), ("y", 6, 2.0)))
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(loras=((str(x), 0.8),), lora_mode="merge"))
    try:
        engine.load(build_policy({}, 2))
        for lora, mode in ((y, "merge"), (x, "sidecar")):
            engine.set_loras(((str(lora), 0.8),), mode)
            got = np.asarray(engine.generate(FLUX_REQUEST).image)[None]
            expected = plain_output(demo_model_dir, FLUX_REQUEST, [(lora, 0.8)], mode)
            assert np.array_equal(got.reshape(expected.shape), expected), (lora.name, mode)
    finally:
        engine.close()
