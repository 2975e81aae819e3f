"""LoRAs composed with two experts (Wan 2.2), streamed UNet units (SDXL), another DiT family (SD3) and the step
caches, each bit-identical to plain diffusers set up the same way (test_lora.py's references: `load_lora_weights`
+ `set_adapters` for sidecar, + `fuse_lora` for merge)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from lora_writers import write_kohya_unet_lora, write_peft_lora
from test_lora import PROMPT, assert_same, engine_outputs, plain_output

from omni_console.engine.engine import Engine
from omni_console.engine.options import EngineOptions
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.errors import PolicyError
from omni_console.offload.policy import build_policy

UNET_REQUEST = GenerateRequest(prompt=PROMPT, steps=2, height=64, width=64, seed=3, guidance=5.0, output_type="np")
SD3_REQUEST = GenerateRequest(prompt=PROMPT, steps=2, height=64, width=64, seed=3, guidance=5.0,
                              max_sequence_length=32, output_type="np")


@pytest.fixture(scope="module")
def sdxl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_families_unet import build_tiny_sdxl

    return build_tiny_sdxl(tmp_path_factory.mktemp("models") / "sdxl", seed=0)


@pytest.fixture(scope="module")
def wan22_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_families_experts import build_tiny_wan22_a14b

    return build_tiny_wan22_a14b(tmp_path_factory.mktemp("models") / "wan22-a14b", seed=0)


@pytest.mark.slow  # 12 loads and 24 requests of a tiny SDXL per mode, with its units streamed in a byte ring
@pytest.mark.parametrize("mode", ["sidecar", "merge"])
def test_sdxl_peft_and_kohya_loras_on_streamed_units(sdxl_dir: Path, tmp_path: Path, mode: str):
    peft = write_peft_lora(tmp_path / "peft.safetensors", sdxl_dir / "unet", "unet",
                           pattern=r"attn[12]\.to_(q|k|v|out\.0)\.weight", seed=1)
    kohya = write_kohya_unet_lora(tmp_path / "kohya.safetensors", sdxl_dir / "unet",
                                  pattern=r"(attn[12]\.to_(q|k|v|out\.0)|ff\.net\.2)\.weight$", seed=2)
    loras = [(kohya, 0.75), (peft, 0.5)]
    expected = plain_output(sdxl_dir, UNET_REQUEST, loras, mode)
    assert not np.array_equal(expected, plain_output(sdxl_dir, UNET_REQUEST, [], mode))
    outs = engine_outputs(sdxl_dir, UNET_REQUEST, loras, mode, blocks=6)
    assert_same(outs, expected)
    merged = [n for policy, _, n in outs if policy.mode == "dlo"]
    assert (max(merged) > 0) == (mode == "merge")  # the units' slots really merged on arrival


@pytest.mark.slow  # a third DiT family: SD3's joint blocks, context-stream linears included
@pytest.mark.parametrize("mode", ["sidecar", "merge"])
def test_sd3_peft_lora(sd3_model_dir: Path, tmp_path: Path, mode: str):
    lora = write_peft_lora(tmp_path / "sd3.safetensors", sd3_model_dir / "transformer", "transformer",
                           pattern=r"transformer_blocks\.\d+\.(attn\.(to_|add_)|ff)", seed=3)
    expected = plain_output(sd3_model_dir, SD3_REQUEST, [(lora, 0.7)], mode)
    outs = engine_outputs(sd3_model_dir, SD3_REQUEST, [(lora, 0.7)], mode, blocks=3)
    assert_same(outs, expected)


def _wan22_request() -> GenerateRequest:
    from tiny_families_experts import EXPERTS_GENERATION as gen

    return GenerateRequest(prompt=PROMPT, steps=gen["num_inference_steps"], height=gen["height"], width=gen["width"],
                           seed=3, guidance=1.0, frames=gen["num_frames"],
                           max_sequence_length=gen["max_sequence_length"], output_type="np")


def _wan22_plain(path: Path, high: Path, low: Path, mode: str) -> np.ndarray:
    """diffusers' own way: the high-noise LoRA into `transformer`, the low-noise one (keys `transformer.`) into
    `transformer_2` with `load_into_transformer_2=True`."""
    from diffusers import DiffusionPipeline
    from safetensors.torch import load_file

    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    pipe.load_lora_weights(str(high), adapter_name="high")
    low_keys = {"transformer." + k.split(".", 1)[1]: v for k, v in load_file(str(low)).items()}
    pipe.load_lora_weights(low_keys, adapter_name="low", load_into_transformer_2=True)
    pipe.set_adapters(["high", "low"], [0.75, 0.5])
    if mode == "merge":
        pipe.fuse_lora(components=["transformer", "transformer_2"])
    request = _wan22_request()
    return np.asarray(pipe(**request.call_kwargs(pipe)).frames[0])


@pytest.mark.slow  # two experts, three policies, two requests each
@pytest.mark.parametrize("mode", ["sidecar", "merge"])
def test_wan22_loras_per_expert_as_diffusers_loads_them(wan22_dir: Path, wan_loadable, tmp_path: Path, mode: str):
    from tiny_families_experts import BOUNDARY_RATIO

    high = write_peft_lora(tmp_path / "high.safetensors", wan22_dir / "transformer", "transformer",
                           pattern=r"blocks\.\d+\.(attn1|attn2|ffn)", seed=5)
    low = write_peft_lora(tmp_path / "low.safetensors", wan22_dir / "transformer_2", "transformer_2",
                          pattern=r"blocks\.\d+\.(attn1|ffn)", seed=6)
    expected = _wan22_plain(wan22_dir, high, low, mode)
    options = EngineOptions(loras=((str(high), 0.75), (str(low), 0.5)), lora_mode=mode)
    engine = Engine(wan22_dir, device="cpu", options=options)
    try:
        assert [f.components for f in engine.loras] == [("transformer",), ("transformer_2",)]
        for policy in (build_policy({}, 0), build_policy({}, 1), build_policy({}, 0, mode="resident")):
            if mode == "merge" and policy.mode == "dlo":  # refused before load, in one line
                with pytest.raises(PolicyError, match="^--lora-mode merge with two experts: .* use --lora-mode "
                                                      "sidecar"):
                    engine.load(policy)
                continue
            engine.load(policy)
            if engine.pipe.config.get("boundary_ratio") is None:  # as tests/engine/test_experts.py sets it
                engine.pipe.register_to_config(boundary_ratio=BOUNDARY_RATIO)
            for _ in range(2):
                got = np.stack(engine.generate(_wan22_request()).frames)
                assert np.array_equal(got.reshape(expected.shape), expected), policy
            engine.unload()
    finally:
        engine.close()


@pytest.mark.slow  # a cached request per mode and policy
@pytest.mark.parametrize("mode", ["sidecar", "merge"])
def test_a_step_cache_with_a_lora_is_diffusers_enable_cache_after_load_lora_weights(demo_model_dir: Path,
                                                                                     tmp_path: Path, mode: str):
    from diffusers import DiffusionPipeline

    from omni_console.engine.demo.demo_model import DEMO_GENERATION
    from omni_console.engine.running.cache_spec import parse_cache
    from omni_console.engine.running.step_cache import cache_config

    lora = write_peft_lora(tmp_path / "c.safetensors", demo_model_dir / "transformer", "transformer",
                           pattern=r"attn\.to_|ff", seed=9)
    request = GenerateRequest(prompt="a red fox", steps=5, height=64, width=64, seed=3,
                              guidance=float(DEMO_GENERATION["guidance_scale"]),
                              extra={"max_sequence_length": DEMO_GENERATION["max_sequence_length"]},
                              output_type="np", cache=parse_cache("first-block:threshold=0.5"))
    pipe = DiffusionPipeline.from_pretrained(demo_model_dir, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    pipe.load_lora_weights(str(lora), adapter_name="plain0")
    if mode == "merge":
        pipe.fuse_lora(components=["transformer"], lora_scale=0.5)
    else:
        pipe.set_adapters(["plain0"], [0.5])
    pipe.transformer.enable_cache(cache_config(request.cache, pipe))
    expected = np.asarray(pipe(**request.call_kwargs(pipe)).images)
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(loras=((str(lora), 0.5),), lora_mode=mode))
    try:
        for policy in (build_policy({}, 0), build_policy({}, 2, placement="spread"),
                       build_policy({}, 0, mode="resident")):
            engine.load(policy)
            got = np.asarray(engine.generate(request).image)[None]
            engine.unload()
            assert np.array_equal(got.reshape(expected.shape), expected), policy
    finally:
        engine.close()
