"""LoRAs composed with streamed UNet units (SDXL), another DiT family (SD3) and the step caches, each
bit-identical to plain diffusers set up the same way (test_lora.py's references: `load_lora_weights` +
`set_adapters` for sidecar, + `fuse_lora` for merge). Two experts (Wan 2.2): test_lora_experts.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from lora_writers import write_kohya_unet_lora, write_peft_lora
from test_lora import PROMPT, assert_same, engine_outputs, plain_output

from omni_console.engine.engine import Engine
from omni_console.engine.options import EngineOptions
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.policy import build_policy

UNET_REQUEST = GenerateRequest(prompt=PROMPT, steps=2, height=64, width=64, seed=3, guidance=5.0, output_type="np")
SD3_REQUEST = GenerateRequest(prompt=PROMPT, steps=2, height=64, width=64, seed=3, guidance=5.0,
                              max_sequence_length=32, output_type="np")


@pytest.fixture(scope="module")
def sdxl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_families_unet import build_tiny_sdxl

    return build_tiny_sdxl(tmp_path_factory.mktemp("models") / "sdxl", seed=0)


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
