"""LoRAs on two experts (Wan 2.2 A14B: `transformer` high-noise, `transformer_2` low-noise), each expert's keys loaded
as diffusers loads them there, in both modes under every policy test_lora.py uses, and switched between requests;
each request bit-identical to plain diffusers set up the same way (`load_lora_weights`, with
`load_into_transformer_2=True` for the low-noise expert's keys, + `set_adapters`, + `fuse_lora` of both experts for
merge). Merge follows the expert switch: the running expert's streamed blocks merge as they arrive, its resident
blocks as the switch copies them to the device, and the host masters are never written.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from lora_writers import write_peft_lora
from test_lora import PROMPT, policies

from omni_console.engine.engine import Engine
from omni_console.engine.loading.stream_dtype import storage_leaves
from omni_console.engine.options import EngineOptions
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.errors import PolicyError
from omni_console.offload.policy import build_policy

EXPERT2 = "transformer_2."


@pytest.fixture(scope="module")
def wan22_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_families_experts import build_tiny_wan22_a14b

    return build_tiny_wan22_a14b(tmp_path_factory.mktemp("models") / "wan22-a14b", seed=0)


@pytest.fixture(scope="module")
def expert_loras(wan22_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a LoRA on the high-noise expert, keys `transformer.`; one on the low-noise expert, keys `transformer_2.`)."""
    folder = tmp_path_factory.mktemp("loras")
    high = write_peft_lora(folder / "high.safetensors", wan22_dir / "transformer", "transformer",
                           pattern=r"blocks\.\d+\.(attn1|attn2|ffn)", seed=5)
    low = write_peft_lora(folder / "low.safetensors", wan22_dir / "transformer_2", "transformer_2",
                          pattern=r"blocks\.\d+\.(attn1|ffn)", seed=6)
    return high, low


def wan22_request() -> GenerateRequest:
    from tiny_families_experts import EXPERTS_GENERATION as gen

    return GenerateRequest(prompt=PROMPT, steps=gen["num_inference_steps"], height=gen["height"], width=gen["width"],
                           seed=3, guidance=1.0, frames=gen["num_frames"],
                           max_sequence_length=gen["max_sequence_length"], output_type="np")


def plain_wan22(path: Path, loras: list[tuple[Path, float]], mode: str, fp8: bool = False) -> np.ndarray:
    """diffusers' own way: a file's `transformer.` keys into `transformer`; its `transformer_2.` keys, renamed
    `transformer.`, into `transformer_2` with `load_into_transformer_2=True`; `set_adapters` with the scales, and
    for merge `fuse_lora` of both experts. `fp8`: both experts' fp8-stored layers rounded through fp8 first, as
    the streamer's upcast computes with them (test_lora_fp8.py's reference)."""
    from diffusers import DiffusionPipeline
    from safetensors.torch import load_file

    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    if fp8:
        with torch.no_grad():
            for expert in (pipe.transformer, pipe.transformer_2):
                for _, leaf in storage_leaves(expert):
                    for p in leaf.parameters(recurse=False):
                        p.copy_(p.to(torch.float8_e4m3fn).to(p.dtype))
    names = [f"plain{i}" for i in range(len(loras))]
    for (file, _), name in zip(loras, names, strict=True):
        tensors = load_file(str(file))
        first = {k: v for k, v in tensors.items() if not k.startswith(EXPERT2)}
        second = {"transformer." + k[len(EXPERT2):]: v for k, v in tensors.items() if k.startswith(EXPERT2)}
        if first:
            pipe.load_lora_weights(first, adapter_name=name)
        if second:
            pipe.load_lora_weights(second, adapter_name=name, load_into_transformer_2=True)
    if loras:
        pipe.set_adapters(names, [scale for _, scale in loras])
        if mode == "merge":
            pipe.fuse_lora(components=["transformer", "transformer_2"])
    return np.asarray(pipe(**wan22_request().call_kwargs(pipe)).frames[0])


def generate(engine: Engine) -> np.ndarray:
    from tiny_families_experts import BOUNDARY_RATIO

    if engine.pipe.config.get("boundary_ratio") is None:  # as tests/engine/test_experts.py sets it
        engine.pipe.register_to_config(boundary_ratio=BOUNDARY_RATIO)
    return np.stack(engine.generate(wan22_request()).frames)


@pytest.mark.slow  # two experts, six policies, two requests each
@pytest.mark.parametrize("mode", ["sidecar", "merge"])
def test_loras_per_expert_in_every_policy_match_diffusers(wan22_dir: Path, wan_loadable, expert_loras, mode: str):
    high, low = expert_loras
    loras = [(high, 0.75), (low, 0.5)]  # scales exact in binary: set_adapters' and fuse_lora's products agree
    expected = plain_wan22(wan22_dir, loras, mode)
    assert not np.array_equal(expected, plain_wan22(wan22_dir, loras[:1], mode))  # the low-noise expert's LoRA counts
    engine = Engine(wan22_dir, device="cpu", options=EngineOptions(loras=tuple((str(f), s) for f, s in loras),
                                                                   lora_mode=mode))
    try:
        assert [f.components for f in engine.loras] == [("transformer",), ("transformer_2",)]
        for policy in policies(3):
            engine.load(policy)
            streamer = engine.placement.streamer
            arena = streamer.filler.arena.tensor.clone() if streamer is not None else None
            for i in range(2):  # the second request finds the first expert as the switch back left it
                got = generate(engine)
                assert np.array_equal(got.reshape(expected.shape), expected), (policy, i)
            merge = engine._loras_applied.merge
            if mode == "sidecar" or streamer is None:
                assert merge is None, policy
            else:  # each expert's streamed blocks merged as they arrived, its resident ones as a switch placed them
                assert (merge.merged_blocks > 0) == (streamer.num_streamed > 0), policy
                assert (merge.merged_resident > 0) == (streamer.num_resident > 0), policy
                assert torch.equal(streamer.filler.arena.tensor, arena), policy  # the host masters as loaded
            engine.unload()
    finally:
        engine.close()


@pytest.mark.slow  # one load per policy, five requests, five plain pipelines
@pytest.mark.parametrize("policy", [build_policy({}, 1), build_policy({}, 0, prefetch_slots=3)],
                         ids=["one-resident", "every-slot-held"])
def test_switching_loras_between_requests_with_two_experts_matches_diffusers(wan22_dir: Path, wan_loadable,
                                                                             expert_loras, policy):
    high, low = expert_loras
    steps = [  # (loras, mode)
        (((high, 0.75), (low, 0.5)), "merge"),
        (((high, 0.25), (low, 0.5)), "merge"),  # re-scaled
        (((low, 0.5),), "merge"),  # one removed
        (((high, 0.75), (low, 0.5)), "sidecar"),
        ((), "merge"),  # every LoRA removed
    ]
    first = tuple((str(f), s) for f, s in steps[0][0])
    engine = Engine(wan22_dir, device="cpu", options=EngineOptions(loras=first, lora_mode="merge"))
    try:
        engine.load(policy)
        arena = engine.placement.streamer.filler.arena
        masters = arena.tensor.clone()
        for i, (loras, mode) in enumerate(steps):
            if i:
                engine.set_loras(tuple((str(f), s) for f, s in loras), mode)
            got = generate(engine)
            expected = plain_wan22(wan22_dir, list(loras), mode)
            assert np.array_equal(got.reshape(expected.shape), expected), (i, loras, mode)
        assert engine.placement.streamer.filler.arena is arena  # the base weights were never read again
        assert torch.equal(arena.tensor, masters)
    finally:
        engine.close()


@pytest.mark.slow  # two experts stored in fp8, three policies, two requests each
@pytest.mark.parametrize("mode", ["sidecar", "merge"])
def test_fp8_storage_with_loras_per_expert_matches_the_rounded_pipeline(wan22_dir: Path, wan_loadable, expert_loras,
                                                                       mode: str):
    """Each expert's delta lands on its streamed blocks' upcast weights, after each arrival's upcast, never in fp8
    (resident fp8 blocks of two experts are upcast per forward, `--upcast-resident` is refused with two experts:
    merge refuses them before load, the sidecar runs them)."""
    high, low = expert_loras
    loras = [(high, 0.75), (low, 0.5)]
    expected = plain_wan22(wan22_dir, loras, mode, fp8=True)
    engine = Engine(wan22_dir, device="cpu", options=EngineOptions(loras=tuple((str(f), s) for f, s in loras),
                                                                   lora_mode=mode))
    try:
        for policy in (build_policy({}, 0, stream_dtype="float8_e4m3fn"),
                       build_policy({}, 0, prefetch_slots=3, stream_dtype="float8_e4m3fn"),
                       build_policy({}, 1, stream_dtype="float8_e4m3fn")):
            if mode == "merge" and policy.resident_layers:
                with pytest.raises(PolicyError, match="^--lora-mode merge with fp8 resident blocks upcast per forward"):
                    engine.load(policy)
                continue
            engine.load(policy)
            for i in range(2):
                got = generate(engine)
                assert np.array_equal(got.reshape(expected.shape), expected), (policy, i)
            engine.unload()
    finally:
        engine.close()
