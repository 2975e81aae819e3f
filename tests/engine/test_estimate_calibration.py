"""The config estimator against what the GPU runs recorded (JSON under docs/ or benchmarks/results/).

The models are the benchmarks' own (Flux-dev-size: benchmarks/engine_e2e.py and budget_sweep.py;
Wan2.1-14B-size: benchmarks/video_e2e.py and budget_sweep.py): their configs are rebuilt here from the
same arguments, their block sizes are read from the recorded JSON, and each estimate is compared
with the recorded measurement — activations above the weights within 10 %, step times within 15 %.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from omni_console.engine.model_dir.blocks import BlockList
from omni_console.engine.model_dir.discovery import ComponentInfo, ModelInfo
from omni_console.engine.planning.activation_estimate import estimate_phases
from omni_console.engine.planning.compute_estimate import BLOCK_OVERHEAD_S, device_rates, forward_flops
from omni_console.engine.planning.plan import StreamedBlock
from omni_console.engine.planning.request_profile import RequestSize
from omni_console.engine.planning.step_forecast import replay_forward
from omni_console.offload.residency import BlockResidency

ROOT = Path(__file__).resolve().parents[2]
H200 = "NVIDIA H200"
FLUX_SIZE = RequestSize(height=1024, width=1024, max_sequence_length=512, guidance=3.5)
WAN_SIZE = RequestSize(height=480, width=832, frames=81, max_sequence_length=512, guidance=1.0)


def recorded(pattern: str) -> list[dict[str, Any]]:
    """Every recorded run whose file name matches (results may live in docs/ or benchmarks/results/)."""
    paths = sorted({p.name: p for d in ("docs", "benchmarks/results") for p in (ROOT / d).glob(pattern)}.values())
    assert paths, f"no recorded {pattern}"
    return [json.loads(p.read_text()) for p in paths]


def init_defaults(cls: type, **overrides: Any) -> dict[str, Any]:
    """A diffusers model's config as `save_pretrained` writes it: its `__init__` arguments."""
    params = inspect.signature(cls.__init__).parameters.values()
    config = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in (config | overrides).items()}


def component(root: Path, name: str, role: str, cls: str, config: dict[str, Any], nbytes: int,
              dtype: str = "bfloat16", lists: tuple[BlockList, ...] = ()) -> ComponentInfo:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    per = 4 if dtype == "float32" else 2  # torch's names, as discovery records them
    return ComponentInfo(name=name, role=role, library="diffusers", class_name=cls, folder=folder,  # type: ignore[arg-type]
                         files=(folder / "model.safetensors",), dtype_bytes={dtype: nbytes}, num_params=nbytes // per,
                         nbytes=nbytes, block_lists=lists)


def split_blocks(sizes: list[int], attrs: tuple[str, ...], counts: tuple[int, ...]) -> tuple[BlockList, ...]:
    assert sum(counts) == len(sizes)
    out, start = [], 0
    for attr, n in zip(attrs, counts, strict=True):
        out.append(BlockList(attr, tuple(sizes[start:start + n])))
        start += n
    return tuple(out)


@pytest.fixture(scope="module")
def flux(tmp_path_factory: pytest.TempPathFactory) -> ModelInfo:
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import CLIPTextConfig, T5Config

    sweep = recorded("budget_sweep-flux-*.json")[0]["resident"]
    cfg = init_defaults(FluxTransformer2DModel, guidance_embeds=True)
    lists = split_blocks(sweep["block_bytes"], ("transformer_blocks", "single_transformer_blocks"),
                         (cfg["num_layers"], cfg["num_single_layers"]))
    root = tmp_path_factory.mktemp("flux-size")
    t5 = T5Config(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                  feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False).to_dict()
    clip = CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                          num_attention_heads=12, max_position_embeddings=77, projection_dim=768).to_dict()
    vae = init_defaults(AutoencoderKL, in_channels=3, out_channels=3, latent_channels=16,
                        block_out_channels=[128, 256, 512, 512], down_block_types=["DownEncoderBlock2D"] * 4,
                        up_block_types=["UpDecoderBlock2D"] * 4, layers_per_block=2)
    comps = (component(root, "transformer", "dit", "FluxTransformer2DModel", cfg, sweep["weights_bytes"], lists=lists),
             component(root, "text_encoder", "encoder", "CLIPTextModel", clip, 246_144_352),
             component(root, "text_encoder_2", "encoder", "T5EncoderModel", t5, 9_524_621_312),
             component(root, "vae", "vae", "AutoencoderKL", vae, 167_666_902))
    return ModelInfo(path=root, pipeline_class="FluxPipeline", components=comps)


@pytest.fixture(scope="module")
def wan(tmp_path_factory: pytest.TempPathFactory) -> ModelInfo:
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import UMT5Config

    sweep = recorded("budget_sweep-wan-*.json")[0]["resident"]
    cfg = init_defaults(WanTransformer3DModel, patch_size=[1, 2, 2], num_attention_heads=40, attention_head_dim=128,
                        in_channels=16, out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40,
                        cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6)
    lists = split_blocks(sweep["block_bytes"], ("blocks",), (cfg["num_layers"],))
    root = tmp_path_factory.mktemp("wan-size")
    umt5 = UMT5Config(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                      feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False).to_dict()
    comps = (component(root, "transformer", "dit", "WanTransformer3DModel", cfg, sweep["weights_bytes"], lists=lists),
             component(root, "text_encoder", "encoder", "UMT5EncoderModel", umt5, 13_462_118_400),
             component(root, "vae", "vae", "AutoencoderKLWan", init_defaults(AutoencoderKLWan), 507_570_124, "float32"))
    return ModelInfo(path=root, pipeline_class="WanPipeline", components=comps)




def within(estimate: float | None, measured: float, tolerance: float) -> None:
    assert estimate is not None and measured > 0
    print(f"estimate {estimate:.5g} recorded {measured:.5g} error {(estimate - measured) / measured:+.1%}")
    assert abs(estimate - measured) / measured <= tolerance, f"estimate {estimate:.4g} vs recorded {measured:.4g}"


def test_denoise_activations_match_the_budget_sweeps(flux: ModelInfo, wan: ModelInfo) -> None:
    for model, size, name in ((flux, FLUX_SIZE, "flux"), (wan, WAN_SIZE, "wan")):
        for run in recorded(f"budget_sweep-{name}-*.json"):  # a DiT forward, batch 1, 512 text tokens
            within(estimate_phases(model, size).denoise_extra, run["resident"]["activation_bytes"], 0.10)


def test_a_unets_activations_match_the_unet_sweep(tmp_path: Path) -> None:
    from diffusers import AutoencoderKL, UNet2DConditionModel

    for index, run in enumerate(recorded("unet_stream-*.json")):  # SDXL-size, one guided step (batch 2) at 1024²
        assert (run["preset"], run["res"], run["batch"]) == ("sdxl", 1024, 2)
        root = tmp_path / f"run-{index}"
        unet = init_defaults(UNet2DConditionModel, block_out_channels=[320, 640, 1280], sample_size=128,
                             layers_per_block=2, cross_attention_dim=2048)
        vae = init_defaults(AutoencoderKL, block_out_channels=[128, 256, 512, 512], latent_channels=4)
        weights = run["resident"]["model_bytes"]
        model = ModelInfo(path=root, pipeline_class="StableDiffusionXLPipeline", components=(
            component(root, "unet", "unet", "UNet2DConditionModel", unet, weights),
            component(root, "vae", "vae", "AutoencoderKL", vae, 167_000_000)))
        size = RequestSize(height=1024, width=1024, guidance=5.0)
        within(estimate_phases(model, size).denoise_extra, run["resident"]["peak_allocated"] - weights, 0.10)


def _text_extra(report: dict[str, Any]) -> int:
    """A DLO run's text-encoding activations: its peak (the staged encoder's phase) less the weights."""
    assert report["vae_decode_peak_bytes"] < report["peak_allocated_bytes"]  # the peak was the text phase
    return report["peak_allocated_bytes"] - report["forecast"]["peak_device_weight_bytes"]


def _decode_extra(report: dict[str, Any]) -> int:
    """A resident run's VAE-decode activations: the decode peak less every weight (all on the device)."""
    assert report["policy"]["mode"] == "resident"
    return report["vae_decode_peak_bytes"] - report["forecast"]["peak_device_weight_bytes"]


def test_text_and_decode_activations_match_the_pipeline_runs(flux: ModelInfo, wan: ModelInfo) -> None:
    flux_estimate, wan_estimate = estimate_phases(flux, FLUX_SIZE), estimate_phases(wan, WAN_SIZE)
    for run in recorded("ranks_e2e-*.json"):  # Flux-size through `run --json` at 1024²
        assert run["res"] == 1024
        within(flux_estimate.text_extra, _text_extra(run["single"]), 0.10)
        within(flux_estimate.decode_extra, _decode_extra(run["resident"]), 0.10)
    for run in recorded("video_e2e-*.json"):  # Wan-size through `run --json` at 81x480x832, guidance 1
        assert (run["args"]["frames"], run["args"]["height"], run["args"]["width"]) == ("81", "480", "832")
        within(wan_estimate.text_extra, _text_extra(run["dlo"]["report"]), 0.10)
        within(wan_estimate.decode_extra, _decode_extra(run["resident"]["report"]), 0.10)


def _blocks(model: ModelInfo) -> list[StreamedBlock]:
    dit = model.components[0]
    return [StreamedBlock(dit.name, bl.attr, i, n, True)
            for bl in dit.block_lists for i, n in enumerate(bl.block_bytes)]


def _step(model: ModelInfo, size: RequestSize, resident: int, slots: int, placement: str = "leading") -> float:
    rates = device_rates(H200)
    assert rates is not None
    blocks = _blocks(model)
    flops = forward_flops(model, blocks, size)
    assert flops is not None
    compute = [f / rates[0] + BLOCK_OVERHEAD_S for f in flops]
    residency = BlockResidency.placed(placement, len(blocks), resident, slots)
    return replay_forward(compute, [b.nbytes for b in blocks], residency, rates[1]).seconds


def test_step_times_match_the_recorded_steps(flux: ModelInfo, wan: ModelInfo) -> None:
    for model, size, name in ((flux, FLUX_SIZE, "flux"), (wan, WAN_SIZE, "wan")):
        for run in recorded(f"budget_sweep-{name}-*.json"):
            within(_step(model, size, len(_blocks(model)), 2), run["resident"]["step_s"], 0.15)
            for point in run["sweep"]:  # every streamed configuration the sweep measured
                within(_step(model, size, point["resident"], point["slots"], point["placement"]), point["step_s"], 0.15)
    for run in recorded("dlo_stream-*.json"):  # Flux-size: resident, and the project's DLO
        within(_step(flux, FLUX_SIZE, 57, 2), run["resident"]["step_s"], 0.15)
        for point in run["dlo"]:
            within(_step(flux, FLUX_SIZE, point["resident_layers"], 2), point["step_s"], 0.15)
    for run in recorded("video_e2e-*.json"):  # the whole Wan pipeline's step (guidance 1: one forward)
        within(_step(wan, WAN_SIZE, 40, 2), run["resident"]["steady_step_s"], 0.15)
        within(_step(wan, WAN_SIZE, 0, 2), run["dlo"]["steady_step_s"], 0.15)


def test_a_cpu_or_an_unknown_gpu_gets_no_throughput() -> None:
    assert device_rates("cpu") is None and device_rates("Some Future Accelerator") is None
    assert device_rates("NVIDIA H100 PCIe")[0] < device_rates("NVIDIA H100 80GB HBM3")[0]
    assert device_rates("NVIDIA L40S")[0] > device_rates("NVIDIA L40")[0] > device_rates("NVIDIA L4")[0]
