"""Lean phases on a CPU: streamed text encoders are bit-identical to plain ones and hold their ring only
during their stage; VAE slicing is each sample's own decode, tiling changes pixels and is labelled;
the `--vram-budget` planner picks nothing lean with a big budget and the right option with a small one."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_families import WAN_LAYOUT, make_wan_pipeline

from omni_console.engine.demo.demo_model import save_pipeline, tiny_clip_text_config, tiny_t5_config, tiny_vae
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.model_dir.encoder_layers import layer_modules
from omni_console.engine.planning.auto_plan import NothingFits, auto_plan
from omni_console.engine.planning.lean import Tiles, leaner_after_oom, tiled_decode
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.planning.request_profile import RequestProfile, RequestSize
from omni_console.offload.layer_stage import LayerStage
from omni_console.offload.policy import build_policy
from omni_console.offload.staged_calls import stage_around

LAYERS = 5
WAN_LAYERS = 24  # the tiny Wan's UMT5 made deeper than its VAE is large, so that its text phase can bind


def _encoders() -> dict[str, torch.nn.Module]:
    from transformers import CLIPTextModel, Qwen2Config, Qwen2Model, T5EncoderModel, UMT5EncoderModel

    torch.manual_seed(0)
    qwen = Qwen2Config(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                       num_attention_heads=2, num_key_value_heads=1)
    return {"clip": CLIPTextModel(tiny_clip_text_config(100, layers=LAYERS)).eval(),
            "t5": T5EncoderModel(tiny_t5_config(100, layers=LAYERS)).eval(),
            "umt5": UMT5EncoderModel(tiny_t5_config(100, layers=LAYERS, umt5=True)).eval(),
            "qwen2": Qwen2Model(qwen).eval()}


@pytest.mark.parametrize("family", ["clip", "t5", "umt5", "qwen2"])
def test_a_streamed_encoder_is_bit_identical_and_holds_two_layers_only_in_its_stage(family):
    plain = _encoders()[family]
    module = copy.deepcopy(plain)
    ids = torch.randint(0, 98, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = plain(input_ids=ids).last_hidden_state
    layers = [m for m in module.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == LAYERS]
    stage = LayerStage(family, module, max(layers, key=lambda m: sum(p.numel() for p in m.parameters())), "cpu",
                       pin=False)
    slots_seen: list[int] = []
    probe = stage.ring._blocks[2].module.register_forward_pre_hook(
        lambda *_: slots_seen.append(stage.ring.num_slots))
    undo = stage_around(stage, module)
    try:
        with torch.no_grad():
            for _ in range(2):  # the second prompt reopens the ring
                assert torch.equal(module(input_ids=ids).last_hidden_state, expected)
                assert stage.ring.num_slots == 0 and not stage.loaded  # nothing held between prompts
    finally:
        probe.remove()
        undo()
        stage.close()
    assert slots_seen == [2, 2]  # inside the stage: two slots for five layers
    assert stage.device_bytes < stage.staged_bytes


def test_layer_lists_found_in_the_headers_match_the_built_encoders(tmp_path: Path):
    path = _wan_with_deep_encoder(tmp_path / "wan")
    info = discover_model(path).component("text_encoder")
    assert info.layers is not None and info.layers.attr == "encoder.block" and info.layers.count == WAN_LAYERS
    from transformers import UMT5EncoderModel

    built = UMT5EncoderModel.from_pretrained(path / "text_encoder")
    assert layer_modules(built, info.layers) == list(built.encoder.block)


def _wan_with_deep_encoder(path: Path) -> Path:
    """The tiny Wan pipeline with a UMT5 of `WAN_LAYERS` layers (the tiny families' encoders have two)."""
    from transformers import UMT5EncoderModel

    if (path / "model_index.json").exists():
        return path
    pipe = make_wan_pipeline(0)
    torch.manual_seed(5)
    pipe.text_encoder = UMT5EncoderModel(tiny_t5_config(len(pipe.tokenizer), d_model=32, layers=WAN_LAYERS,
                                                        umt5=True)).eval()
    save_pipeline(pipe, path, class_names=WAN_LAYOUT, shard_transformer=False, variant=None, keep_default=False)
    return path


@pytest.fixture(scope="module")
def deep_wan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _wan_with_deep_encoder(tmp_path_factory.mktemp("lean") / "wan")


@pytest.mark.slow
def test_the_engine_streams_the_encoder_and_tiles_the_vae_as_the_policy_says(deep_wan: Path, wan_loadable):
    import diffusers

    from omni_console.engine.engine import Engine
    from omni_console.engine.running.runner import GenerateRequest
    from omni_console.offload.events import LogEvent

    req = GenerateRequest(prompt="a red fox in snow", steps=2, height=32, width=32, seed=7,
                          extra={"num_frames": 5, "max_sequence_length": 32})
    pipe = diffusers.WanPipeline.from_pretrained(deep_wan, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    expected = np.asarray(pipe(**req.call_kwargs(pipe)).frames[0][0])
    engine = Engine(deep_wan, device="cpu")
    sub = engine.bus.subscribe()
    engine.load(build_policy({}, 0, stream_encoders="on", vae_tiling="on"))
    assert isinstance(engine.placement.stagers["text_encoder"], LayerStage)
    assert engine.pipe.vae.use_tiling  # diffusers' own flag (32x32 fits one tile: the pixels stay the same)
    assert np.array_equal(np.asarray(engine.generate(req).image), expected)
    logs = [e.message for e in sub.drain() if isinstance(e, LogEvent)]
    assert any("streamed layer by layer (24 layers through 2 slots" in m for m in logs), logs
    assert any("decode tiled (pixels differ" in m for m in logs), logs
    engine.close()


def test_slicing_decodes_each_sample_as_alone_and_tiling_changes_pixels():
    vae = tiny_vae(latent_channels=16, scaling_factor=1.0, shift_factor=0.0)  # tiles of 64 px (sample_size)
    z = torch.randn(2, 16, 24, 24, generator=torch.Generator().manual_seed(0))  # 192 px: three tiles a side
    with torch.no_grad():
        alone = torch.cat([vae.decode(z[i:i + 1]).sample for i in range(2)])
        plain = vae.decode(z).sample
        vae.enable_slicing()
        sliced = vae.decode(z).sample
        vae.disable_slicing()
        vae.enable_tiling()
        tiled = vae.decode(z).sample
    assert torch.equal(sliced, alone)  # each sample exactly as a batch of one decodes it
    assert torch.allclose(sliced, plain, atol=1e-4)  # the batched decode differs at most in the last bits
    assert not torch.equal(tiled, plain)  # tiling changes pixels: the plan says so


def test_tiling_geometry_counts_the_overlapping_tiles():
    wan = Tiles(256, 256, 192, 192)
    t = tiled_decode(wan, 480, 832)
    assert t.tiles == 15 and t.peak_fraction == pytest.approx(256 * 256 / (480 * 832))
    assert t.work_factor == pytest.approx((256 + 256 + 96) * (4 * 256 + 64) / (480 * 832))
    assert tiled_decode(wan, 256, 256).tiles == 1  # one tile: diffusers does not tile


# --- the planner ---------------------------------------------------------------------------------

SIZE = RequestSize(height=480, width=832, frames=9)


def _profile(blocks: int, text: int, denoise: int, decode: int) -> RequestProfile:
    return RequestProfile(model="/m", model_bytes=1, device="d", size=SIZE, block_compute_s=[1e-3] * blocks,
                          other_s=1e-3, forwards_per_step=1, text_extra_bytes=text, denoise_extra_bytes=denoise,
                          decode_extra_bytes=decode, bandwidth_bytes_per_s=1e9, measured_at="2026-12-01T00:00:00")


@pytest.fixture(scope="module")
def wan_plan(deep_wan: Path):
    return make_plan(discover_model(deep_wan), build_policy({}, 0))


def _lean(chosen) -> set[str]:
    return {n for n in ("stream_encoders", "vae_tiling", "vae_slicing", "ff_chunking") if chosen.plan.policy.lean_on(n)}


def test_a_big_budget_needs_nothing_lean(wan_plan):
    profile = _profile(len(wan_plan.blocks), 1000, 1000, 1000)
    chosen = auto_plan(wan_plan, wan_plan.model.nbytes * 4, SIZE, profile, "cached", 1e9, "cached")
    assert _lean(chosen) == set()
    assert any(r.startswith("lean phases: none needed") for r in chosen.reasons), chosen.reasons


def test_a_large_decode_is_tiled_and_said_to_change_pixels(wan_plan):
    decode = 2_000_000_000  # the decode's activations dwarf the weights and the output (Wan at 480x832)
    profile = _profile(len(wan_plan.blocks), 1000, 1000, decode)
    budget = wan_plan.model.nbytes + decode // 2
    chosen = auto_plan(wan_plan, budget, SIZE, profile, "cached", 1e9, "cached")
    assert _lean(chosen) == {"vae_tiling"}
    assert chosen.forecast.peak_bytes <= budget
    line = next(r for r in chosen.reasons if r.startswith("VAE decode tiled"))
    assert "pixels differ" in line and "% decode time (15 overlapping tiles)" in line
    assert chosen.forecast.phase_peaks["vae_decode"] < wan_plan.forecast.device_resident_bytes + decode


def test_a_tight_text_phase_streams_the_encoder_and_nothing_else(wan_plan):
    from omni_console.engine.planning.lean import encoder_stage_bytes
    from omni_console.engine.planning.request_forecast import forecast_request

    encoder = wan_plan.model.component("text_encoder")
    profile = _profile(len(wan_plan.blocks), 1000, 1000, 1000)
    least = forecast_request(wan_plan, SIZE, profile, "cached", 1e9, "cached").phase_peaks  # all streamed/staged
    streamed = least["text_encoding"] - encoder.nbytes + encoder_stage_bytes(encoder, True)
    budget = max(streamed, least["denoise"], least["vae_decode"]) + 1
    assert budget < least["text_encoding"]
    whole = make_plan(wan_plan.model, build_policy({}, 0, stream_encoders="off"))
    with pytest.raises(NothingFits):  # staged whole, the encoder does not fit...
        auto_plan(whole, budget, SIZE, profile, "cached", 1e9, "cached")
    chosen = auto_plan(wan_plan, budget, SIZE, profile, "cached", 1e9, "cached")  # ...streamed, it does
    assert _lean(chosen) == {"stream_encoders"}
    assert chosen.forecast.peak_bytes <= budget
    line = next(r for r in chosen.reasons if r.startswith("text encoders streamed"))
    assert "exact (bit-identical)" in line


def test_nothing_fits_even_lean_names_every_phase(wan_plan):
    profile = _profile(len(wan_plan.blocks), 1000, 10 * wan_plan.model.nbytes, 1000)  # denoise alone too big
    with pytest.raises(NothingFits) as exc:
        auto_plan(wan_plan, wan_plan.model.nbytes * 2, SIZE, profile, "cached", 1e9, "cached")
    text = str(exc.value)
    assert "text encoders streamed layer by layer, VAE decode tiled" in text
    assert "by phase: text encoding" in text and ", denoise" in text and ", VAE decode" in text


def test_a_larger_budget_drops_what_a_smaller_one_chose(wan_plan):
    decode = 2_000_000_000
    profile = _profile(len(wan_plan.blocks), 1000, 1000, decode)
    tight = auto_plan(wan_plan, wan_plan.model.nbytes + decode // 2, SIZE, profile, "cached", 1e9, "cached")
    assert tight.plan.policy.vae_tiling == "on" and tight.plan.policy.lean_auto == ("vae_tiling",)
    roomy = auto_plan(tight.plan, decode * 2, SIZE, profile, "cached", 1e9, "cached")  # the console's next `b`
    assert _lean(roomy) == set() and roomy.plan.policy.vae_tiling == "auto"


def test_off_and_on_are_obeyed(wan_plan):
    decode = 2_000_000_000
    profile = _profile(len(wan_plan.blocks), 1000, 1000, decode)
    off = make_plan(wan_plan.model, build_policy({}, 0, vae_tiling="off"))
    with pytest.raises(NothingFits):
        auto_plan(off, wan_plan.model.nbytes + decode // 2, SIZE, profile, "cached", 1e9, "cached")
    on = make_plan(wan_plan.model, build_policy({}, 0, stream_encoders="on"))
    roomy = auto_plan(on, decode * 2, SIZE, profile, "cached", 1e9, "cached")
    assert _lean(roomy) == {"stream_encoders"}


def test_after_an_oom_the_next_leaner_phase(wan_plan):
    assert leaner_after_oom(wan_plan, "vae_decode") == "vae_tiling"
    assert leaner_after_oom(wan_plan, "text_encoding") == "stream_encoders"
    tiled = make_plan(wan_plan.model, build_policy({}, 0, vae_tiling="on", vae_slicing="off"))
    assert leaner_after_oom(tiled, "vae_decode") is None
    from omni_console.engine.planning.lean import leaner_policy

    stepped = leaner_policy(wan_plan, "vae_decode")
    assert stepped is not None and stepped.vae_tiling == "on" and stepped.stream_encoders == "auto"
    assert leaner_policy(tiled, "vae_decode") is None


@pytest.mark.slow
def test_a_live_replan_switches_tiling_and_refuses_to_switch_encoder_streaming(deep_wan: Path, wan_loadable):
    from omni_console.engine.engine import Engine
    from omni_console.engine.options import EngineOptions
    from omni_console.offload.errors import PolicyError

    engine = Engine(deep_wan, device="cpu", options=EngineOptions(live_replan=True))
    try:
        engine.load(build_policy({}, 0))
        assert not engine.pipe.vae.use_tiling
        event = engine.replan(build_policy({}, 0, vae_tiling="on"))
        assert engine.pipe.vae.use_tiling and "VAE decode tiled on" in event.summary
        engine.replan(build_policy({}, 0, vae_tiling="off"))
        assert not engine.pipe.vae.use_tiling
        with pytest.raises(PolicyError, match="is a new load"):
            engine.replan(build_policy({}, 0, stream_encoders="on"))
        engine.unload()
        engine.load(build_policy({"text_encoder": False}, 0, stream_encoders="on"))  # resident: not streamed
        assert not isinstance(engine.placement.stagers["text_encoder"], LayerStage)
        engine.unload()
        engine.load(build_policy({}, 0, stream_encoders="on"))
        assert isinstance(engine.placement.stagers["text_encoder"], LayerStage)
        with pytest.raises(PolicyError, match="streams layer by layer: keeping it resident is a new load"):
            engine.replan(build_policy({"text_encoder": False}, 0, stream_encoders="on"))
    finally:
        engine.close()


def test_a_tiled_decode_is_profiled_as_untiled_and_forecast_back_exactly(wan_plan):
    from omni_console.engine.planning.lean import decode_extra, untiled_decode_extra

    tiled_plan = make_plan(wan_plan.model, build_policy({}, 0, vae_tiling="on"))
    measured = 900_000_000
    untiled = untiled_decode_extra(tiled_plan, SIZE, measured)
    assert untiled > measured  # what an untiled decode would need: the next plan can decide to tile
    assert decode_extra(tiled_plan, SIZE, untiled) == pytest.approx(measured, rel=1e-6)
    assert untiled_decode_extra(wan_plan, SIZE, measured) == measured  # untiled: as measured


@pytest.mark.slow
def test_feed_forward_chunking_on_sd3_matches_plain_diffusers(sd3_model_dir: Path):
    """SD3's `enable_forward_chunking` (chunks over the batch: guidance's two halves) on a CPU."""
    import diffusers

    from omni_console.engine.engine import Engine
    from omni_console.engine.running.runner import GenerateRequest

    req = GenerateRequest(prompt="a red fox in snow", steps=2, height=64, width=64, seed=7, guidance=5.0,
                          extra={"max_sequence_length": 32})
    pipe = diffusers.StableDiffusion3Pipeline.from_pretrained(sd3_model_dir, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    expected = np.asarray(pipe(**req.call_kwargs(pipe)).images[0])
    engine = Engine(sd3_model_dir, device="cpu")
    try:
        engine.load(build_policy({}, 0, ff_chunking="on"))
        assert [b._chunk_size for b in engine.pipe.transformer.transformer_blocks] == [1, 1, 1]  # diffusers' own
        assert np.array_equal(np.asarray(engine.generate(req).image), expected)
    finally:
        engine.close()
