"""Switching LoRAs between requests (`Engine.set_loras`): add, re-scale, change mode, remove, with no reload of
any base weight; each request equals plain diffusers set up the same way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from lora_writers import write_kohya_flux_lora, write_peft_lora
from test_lora import FLUX_REQUEST, plain_output

from omni_console.engine.engine import Engine
from omni_console.engine.errors import ConfigError
from omni_console.engine.options import EngineOptions
from omni_console.offload.policy import build_policy


@pytest.mark.slow  # two loads, ten requests, seven plain pipelines
@pytest.mark.parametrize("policy", [build_policy({}, 2), build_policy({}, 0, prefetch_slots=6)],
                         ids=["two-resident", "every-slot-held"])
def test_switching_loras_between_requests_matches_diffusers(demo_model_dir: Path, tmp_path: Path, policy):
    a = write_peft_lora(tmp_path / "a.safetensors", demo_model_dir / "transformer", "transformer",
                        pattern=r"attn\.(to_|add_)|ff", seed=1)
    b = write_kohya_flux_lora(tmp_path / "b.safetensors", double=2, single=4, inner=64, mlp=256, seed=2)
    steps = [  # (loras, mode)
        (((a, 0.7),), "merge"),
        (((b, 0.5),), "merge"),
        (((a, 0.75), (b, 0.5)), "sidecar"),
        (((a, 0.25),), "merge"),
        ((), "merge"),
    ]
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(loras=((str(a), 0.7),), lora_mode="merge"))
    try:
        engine.load(policy)
        arena = engine.placement.streamer.filler.arena
        for i, (loras, mode) in enumerate(steps):
            if i:
                seconds = engine.set_loras(tuple((str(f), s) for f, s in loras), mode)
                assert seconds < 0.5
            got = np.asarray(engine.generate(FLUX_REQUEST).image)[None]
            expected = plain_output(demo_model_dir, FLUX_REQUEST, [(f, s) for f, s in loras], mode)
            assert np.array_equal(got.reshape(expected.shape), expected), (i, loras, mode)
        assert engine.placement.streamer.filler.arena is arena  # the base weights were never read again
    finally:
        engine.close()


def test_a_bad_lora_switch_changes_nothing(demo_model_dir: Path, tmp_path: Path):
    engine = Engine(demo_model_dir, device="cpu")
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 3)
    with pytest.raises(ConfigError, match="shorter than its header length"):
        engine.set_loras(((str(tmp_path / "bad.safetensors"), 1.0),))
    assert engine.loras == []


@pytest.mark.slow  # one load, three requests, two plain pipelines
def test_a_request_carries_its_lora_set(demo_model_dir: Path, tmp_path: Path):
    """A queued request's `loras` are applied before it runs (none given: the set as it is), as the plain
    pipeline with the same LoRAs renders it."""
    from dataclasses import replace

    a = write_peft_lora(tmp_path / "a.safetensors", demo_model_dir / "transformer", "transformer",
                        pattern=r"attn\.to_|ff", seed=4)
    with_a = plain_output(demo_model_dir, FLUX_REQUEST, [(a, 0.5)], "sidecar")
    without = plain_output(demo_model_dir, FLUX_REQUEST, [], "sidecar")
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(lora_mode="sidecar"))
    try:
        engine.load(build_policy({}, 0))
        for loras, expected in ((((str(a), 0.5),), with_a), (None, with_a), ((), without)):
            got = np.asarray(engine.generate(replace(FLUX_REQUEST, loras=loras)).image)[None]
            assert np.array_equal(got.reshape(expected.shape), expected), loras
        with pytest.raises(ConfigError, match="--lora .*nothing.safetensors"):
            engine.generate(replace(FLUX_REQUEST, loras=((str(tmp_path / "nothing.safetensors"), 1.0),)))
        assert engine.options.loras == ()  # a bad set changes nothing
    finally:
        engine.close()


@pytest.mark.slow  # one load, three requests, two plain pipelines
def test_a_live_replan_moves_merged_blocks_from_their_clean_masters(demo_model_dir: Path, tmp_path: Path):
    """With live re-plan every block keeps a host master: merged resident blocks are copied afresh from it when the
    plan or the LoRA changes (never unmerged by arithmetic), so each request equals plain diffusers."""
    a = write_peft_lora(tmp_path / "a.safetensors", demo_model_dir / "transformer", "transformer",
                        pattern=r"attn\.(to_|add_)|ff", seed=1)
    options = EngineOptions(loras=((str(a), 0.75),), lora_mode="merge", live_replan=True)
    engine = Engine(demo_model_dir, device="cpu", options=options)
    try:
        engine.load(build_policy({}, 2))
        arena = engine.placement.streamer.filler.arena
        masters = arena.tensor.clone()
        expected = plain_output(demo_model_dir, FLUX_REQUEST, [(a, 0.75)], "merge")
        for step in ("loaded", "re-planned"):
            got = np.asarray(engine.generate(FLUX_REQUEST).image)[None]
            assert np.array_equal(got.reshape(expected.shape), expected), step
            engine.replan(build_policy({}, 3, placement="spread"))  # other blocks resident, others streamed
        assert engine._loras_applied.merge.merged_resident > 0
        engine.set_loras(((str(a), 0.25),), "merge")
        got = np.asarray(engine.generate(FLUX_REQUEST).image)[None]
        expected = plain_output(demo_model_dir, FLUX_REQUEST, [(a, 0.25)], "merge")
        assert np.array_equal(got.reshape(expected.shape), expected)
        assert torch.equal(arena.tensor, masters)  # the host masters were never written
    finally:
        engine.close()
