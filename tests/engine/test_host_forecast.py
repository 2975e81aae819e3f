"""Issue 35 item 1: the host forecast reproduces the host peaks measured on a real GPU run, and follows
the plan's tiers, live re-plan masters and the request's size; "the profile learns from it": the peak RSS a
request measured feeds the next host forecast, as the CUDA context a request measured feeds the next device
forecast, and it carries over to the next plan of the model (under `--ram-budget auto` the next plan is rarely
the same: the flux16 run's second forecast was still the default one, 6.2 % under the peak)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from omni_console.engine.engine import Engine
from omni_console.engine.model_dir.blocks import BlockList
from omni_console.engine.model_dir.discovery import ComponentInfo, ModelInfo
from omni_console.engine.planning.host_forecast import (
    CUDA_BASELINE_LOAD,
    CUDA_BASELINE_RUN,
    host_forecast,
    learned_baseline,
)
from omni_console.engine.planning.host_profile import host_forecast_for, with_host_peak
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.planning.request_profile import RequestProfile, RequestSize
from omni_console.engine.running import generation
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.policy import build_policy
from omni_console.offload.tiers import COLD_CHUNK, HostTiers, bounce_ring_bytes

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
DIT_BLOCKS = 57  # Flux: 19 double + 38 single blocks
T5_LAYERS = 24


def measured(name: str) -> dict:
    return json.loads((RESULTS / f"host_rss_breakdown-flux-2026-12-05-h100-{name}.json").read_text())


def mapping_sizes(run: dict, snapshot: int) -> list[int]:
    """Sizes of the anonymous mappings at a peak snapshot, largest RSS first (the engine's arenas)."""
    return [m["size"] for m in run["peak_snapshots"][snapshot]["mappings"] if m["name"] == "[anon]"]


def rss_at(run: dict, event: str) -> int:
    """The first RSS sample after the progress line `event`."""
    t = next(t for t, line in run["progress"] if line.startswith(event))
    return next(s["Rss"] for s in run["samples"] if s["t"] >= t)


def flux_size_model() -> ModelInfo:
    """The Flux-size checkpoint as its arenas measured it: DiT blocks, T5 (its layers), CLIP, VAE."""
    nobudget, eight = measured("nobudget"), measured("8gb")
    dit_blocks, t5, clip, _, vae = mapping_sizes(nobudget, -1)[:5]
    t5_layers = mapping_sizes(eight, -1)[2]
    root = Path("/nonexistent/flux-size")

    def comp(name: str, role: str, cls: str, nbytes: int, **kw) -> ComponentInfo:
        return ComponentInfo(name, role, "diffusers", cls, root / name, files=(root / name / "w.safetensors",),
                             nbytes=nbytes, **kw)

    per_block = dit_blocks // DIT_BLOCKS
    dit = comp("transformer", "dit", "FluxTransformer2DModel", per_block * DIT_BLOCKS + 130_000_000,
               block_lists=(BlockList("transformer_blocks", (per_block,) * DIT_BLOCKS),))
    per_layer = t5_layers // T5_LAYERS
    return ModelInfo(root, "FluxPipeline", (
        dit, comp("text_encoder", "encoder", "CLIPTextModel", clip),
        comp("text_encoder_2", "encoder", "T5EncoderModel", t5,
             layers=BlockList("encoder.block", (per_layer,) * T5_LAYERS)),
        comp("vae", "vae", "AutoencoderKL", vae)))


SIZE = RequestSize(height=1024, width=1024)


def test_no_budget_run_peak_is_the_measured_one():
    run = measured("nobudget")
    forecast = host_forecast(make_plan(flux_size_model(), build_policy({}, 0)), SIZE)
    assert forecast.peak_bytes == pytest.approx(run["peak"]["Rss"], rel=0.02)
    assert forecast.phase_peaks["load"] == pytest.approx(rss_at(run, "state loading → ready"), rel=0.03)
    assert forecast.peak_phase == "vae_decode"  # the baseline grows with the first request, then the output
    assert forecast.part("encoder layer ring arena") == 0


def test_eight_gb_plan_is_the_measured_peak_less_the_double_pin():
    """`run --vram-budget 8`: live re-plan masters, 6 resident blocks, the VAE resident, T5 by layer. Measured
    before the layer ring read the encoder's arena in place (offload/in_place_filler.py): the run held the
    layers a second time, the mapping the breakdown names; the forecast is that peak without it."""
    run = measured("8gb")
    policy = build_policy({"vae": False}, 6, placement="spread", stream_encoders="on")
    forecast = host_forecast(make_plan(flux_size_model(), policy), SIZE, live_replan=True)
    assert forecast.part("encoder layer ring arena") == 0
    duplicate = mapping_sizes(run, -1)[2]
    assert forecast.peak_bytes == pytest.approx(run["peak"]["Rss"] - duplicate, rel=0.02)
    assert forecast.peak_bytes == pytest.approx(measured("nobudget")["peak"]["Rss"], rel=0.02)


def test_live_replan_keeps_masters_of_resident_components():
    model = flux_size_model()
    plan = make_plan(model, build_policy({"vae": False}, 6))
    run, live = host_forecast(plan), host_forecast(plan, live_replan=True)
    vae = next(c.info.nbytes for c in plan.components if c.info.name == "vae")
    resident_blocks = sum(b.nbytes for b in plan.blocks if not b.streamed)
    assert live.part("pinned staged masters") - run.part("pinned staged masters") == vae
    assert live.part("pinned blocks") - run.part("pinned blocks") == resident_blocks
    assert live.phase_peaks["denoise"] - run.phase_peaks["denoise"] == vae + resident_blocks


def test_file_tiers_cost_only_the_bounce_ring():
    plan = make_plan(flux_size_model(), build_policy({}, 0))
    pinned = host_forecast(plan)
    streamed = [b for b in plan.blocks if b.streamed]
    tiers = HostTiers(blocks=("disk",) * 10 + ("page_cache",) * 5, components=(("text_encoder_2", "page_cache"),))
    tiered = host_forecast(replace(plan, tiers=tiers))
    moved = sum(b.nbytes for b in streamed[:15])
    t5 = next(c.info.nbytes for c in plan.components if c.info.name == "text_encoder_2")
    # the streamer's ring (the largest file-tier block) and the staged components' (64 MiB chunks of the T5)
    ring = bounce_ring_bytes(max(b.nbytes for b in streamed[:15])) + bounce_ring_bytes(COLD_CHUNK)
    assert tiered.part("bounce ring") == ring > 0
    assert pinned.phase_peaks["denoise"] - tiered.phase_peaks["denoise"] == moved + t5 - ring
    assert pinned.part("bounce ring") == 0
    # the T5 is built with its weights left in its files (engine/loading/file_build.py): no load buffer either
    assert tiered.part("load read buffers") == pinned.part("load read buffers") < t5
    # one its library must read whole (quantized) is in host memory once at load: a load buffer, not a master
    quantized = replace(plan, components=tuple(
        replace(c, info=replace(c.info, quant_method="bitsandbytes")) if c.info.name == "text_encoder_2" else c
        for c in plan.components))
    assert host_forecast(replace(quantized, tiers=tiers)).part("load read buffers") == t5


def test_a_load_without_block_masters_holds_one_resident_block_before_it_moves():
    """flux16 (`run --ram-budget`, no live masters): each resident block is read from its files into host tensors,
    moved to the device and its pages given back before the next (offload/resident_blocks.py `move_resident`), so
    the load holds the largest resident block once; with masters they come from the arena, and on a CPU the host
    copy is the device's own (counted as device weights)."""
    plan = make_plan(flux_size_model(), build_policy({}, 14, placement="spread"))
    block = max(b.nbytes for b in plan.blocks if not b.streamed)
    non_block = next(c.info.non_block_bytes for c in plan.components if c.residency == "streamed")
    assert block > non_block
    assert host_forecast(plan).part("load read buffers") == block
    assert host_forecast(plan, live_replan=True).part("load read buffers") == non_block
    assert host_forecast(plan, on_cpu=True).part("load read buffers") == 0


def test_decoded_output_scales_with_frames_and_pixels():
    plan = make_plan(flux_size_model(), build_policy({}, 0))
    one = host_forecast(plan, RequestSize(height=480, width=832, frames=1))
    video = host_forecast(plan, RequestSize(height=480, width=832, frames=81))
    assert video.part("decoded output") == 81 * one.part("decoded output") == 81 * 480 * 832 * 3 * 5
    assert video.phase_peaks["denoise"] == one.phase_peaks["denoise"]
    assert host_forecast(plan, RequestSize()).notes  # the pipeline's default size: said, not guessed


def test_a_learned_baseline_meets_the_measured_peak():
    plan = make_plan(flux_size_model(), build_policy({}, 0))
    first = host_forecast(plan, SIZE)
    peak = first.peak_bytes + 700_000_000  # what a request measured
    again = host_forecast(plan, SIZE, baseline=learned_baseline(peak, first))
    assert again.peak_bytes == peak and again.baseline_source == "cached"
    assert first.part("process baseline") == CUDA_BASELINE_RUN
    assert first.part("process baseline at load") == CUDA_BASELINE_LOAD


def test_a_budget_the_load_of_a_file_tier_encoder_would_break_is_refused():
    from omni_console.engine.planning.ram_plan import ram_plan
    from omni_console.engine.planning.tier_plan import NothingFitsHost
    from omni_console.offload.tiers import TierRates

    plain = make_plan(flux_size_model(), build_policy({}, 0))
    plan = replace(plain, components=tuple(  # a T5 its library must read whole to build (quantized, say)
        replace(c, info=replace(c.info, quant_method="bitsandbytes")) if c.info.name == "text_encoder_2" else c
        for c in plain.components))
    t5 = next(c.info.nbytes for c in plan.components if c.info.name == "text_encoder_2")
    on_disk = host_forecast(replace(plan, tiers=HostTiers(components=(("text_encoder_2", "disk"),))))
    # the run phases fit once the T5 is on disk; the load holds it once (9.8 GB) as it is built
    budget = on_disk.phase_peaks["denoise"] + 100 * 2**20
    assert on_disk.phase_peaks["load"] > budget and on_disk.part("load read buffers") >= t5
    with pytest.raises(NothingFitsHost, match="while loading.*text_encoder_2"):
        ram_plan(plan, budget, TierRates(20e9, 4e9, 2e9), cap=budget)
    roomy = on_disk.phase_peaks["load"] + 100 * 2**20  # room for the load too: a plan, whose load fits
    chosen = ram_plan(plan, roomy, TierRates(20e9, 4e9, 2e9), cap=roomy)
    assert host_forecast(replace(plan, tiers=chosen.tiers)).phase_peaks["load"] <= roomy


def test_a_t5_built_over_its_files_lets_the_small_host_budget_load():
    """issue 35's flux16: the budget that the T5's load transient broke is planned, and its load phase fits."""
    from omni_console.engine.planning.ram_plan import ram_plan
    from omni_console.offload.tiers import TierRates

    plan = make_plan(flux_size_model(), build_policy({}, 0))
    on_disk = host_forecast(replace(plan, tiers=HostTiers(components=(("text_encoder_2", "disk"),))))
    budget = on_disk.phase_peaks["denoise"] + 100 * 2**20
    assert on_disk.phase_peaks["load"] <= budget  # nothing of the T5 is read at load
    chosen = ram_plan(plan, budget, TierRates(20e9, 4e9, 2e9), cap=budget)
    assert host_forecast(replace(plan, tiers=chosen.tiers)).phase_peaks["load"] <= budget


# ---------------------------------------------------------------- learning from a measured peak

FLUX16_PEAK_OVER_FORECAST = 12_784_852_992 / 12_033_778_816  # host_tiers-2026-12-06-h100-flux16-after-hostload


def flux16_tiers(page_cache: int, encoder: str) -> HostTiers:
    """The shape of the flux16 run's tier plan: a third of the streamed blocks pinned, the rest on disk but for a
    few from the page cache, the T5 on disk (two auto plans of that run differed exactly so)."""
    blocks = tuple("pinned" if i % 3 == 0 else "page_cache" if i % 3 == 1 and i < 3 * page_cache else "disk"
                   for i in range(57))
    return HostTiers(blocks=blocks, components=(("text_encoder", encoder), ("text_encoder_2", "disk")))


def profile(size: RequestSize) -> RequestProfile:
    return RequestProfile(model="/nonexistent/flux-size", model_bytes=1, device="NVIDIA H100 80GB HBM3", size=size,
                          block_compute_s=[1e-3] * 57, other_s=1e-3, forwards_per_step=1, measured_at="now")


def test_a_measured_peak_is_the_next_forecast_of_this_plan_and_carries_to_the_next_plan():
    policy = build_policy({"vae": False}, 14, placement="spread", stream_encoders="on")
    ran = replace(make_plan(flux_size_model(), policy), tiers=flux16_tiers(3, "disk"))
    before = host_forecast(ran, SIZE)
    measured = int(before.peak_bytes * FLUX16_PEAK_OVER_FORECAST)  # a fake VmHWM, as flux16 measured it
    learned = with_host_peak(profile(SIZE), ran, measured, live_replan=False)
    assert learned.host_peak_bytes == measured
    assert learned.host_baseline_bytes == CUDA_BASELINE_RUN + measured - before.peak_bytes  # the base absorbs it

    again = host_forecast_for(ran, SIZE, "NVIDIA H100 80GB HBM3", learned)
    assert again.peak_bytes == measured and again.baseline_source == "cached" and not again.notes

    # the next auto plan moved one block from disk to the page cache and CLIP from the page cache to disk
    next_plan = replace(ran, tiers=flux16_tiers(4, "page_cache"))
    assert next_plan.tiers != ran.tiers
    after = host_forecast_for(next_plan, SIZE, "NVIDIA H100 80GB HBM3", learned)
    assert after.baseline_source == "cached" and "another plan" in after.notes[-1]
    assert after.part("process baseline") == learned.host_baseline_bytes
    assert after.peak_bytes == pytest.approx(measured, rel=0.03)  # the "within 3 % after one"
    unlearned = host_forecast_for(next_plan, SIZE, "NVIDIA H100 80GB HBM3", profile(SIZE))
    assert unlearned.baseline_source == "default" and measured / unlearned.peak_bytes > 1.05


def test_a_load_peak_above_the_measured_one_does_not_lower_the_base():
    """VmHWM includes the load: where the modelled load phase over-counts, the base stays the run phases'."""
    plan = make_plan(flux_size_model(), build_policy({}, 0))
    first = host_forecast(plan, SIZE)
    high_load = replace(first, phase_peaks={**first.phase_peaks, "load": first.peak_bytes * 2},
                        peak_bytes=first.peak_bytes * 2, peak_phase="load")
    assert learned_baseline(first.peak_bytes, high_load) == first.part("process baseline")
    assert learned_baseline(first.peak_bytes + 10, high_load) == first.part("process baseline") + 10


def test_the_engine_feeds_a_requests_peak_rss_to_the_next_forecast(demo_model_dir, monkeypatch, tmp_path):
    """A CPU request on the demo model with a fake measured peak (VmHWM): the engine's next forecast, of its plan
    and of another tier plan, rests on it."""
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    engine = Engine(demo_model_dir, device="cpu")
    policy = build_policy({}, 0)
    first = engine.make_plan(policy)
    size = RequestSize(height=64, width=64)
    default = engine.forecast(size, plan=first).host
    assert default is not None and default.baseline_source == "default"
    fake = default.peak_bytes + 300_000_000  # 300 MB more than forecast, as a real host might measure
    monkeypatch.setattr(generation, "peak_rss", lambda: fake)
    engine.load(policy)
    result = engine.generate(GenerateRequest(prompt="a fox", steps=2, height=64, width=64, seed=1, output_type="np"))
    assert result.check is not None and result.check.measured_host_peak == fake
    learned = engine.forecast(size).host
    assert learned is not None and learned.baseline_source == "cached"
    assert learned.peak_bytes == pytest.approx(fake, rel=0.03)
    other = engine.make_plan(policy, HostTiers(blocks=("disk",) * len(first.blocks)))
    carried, unlearned = engine.forecast(size, plan=other).host, host_forecast(other, size, on_cpu=True)
    assert carried is not None and carried.baseline_source == "cached" and "another plan" in carried.notes[-1]
    # what the request taught is the process's own base: the other plan's forecast moves by just as much
    assert carried.part("process baseline") == learned.part("process baseline")
    assert carried.peak_bytes - unlearned.peak_bytes == learned.peak_bytes - default.peak_bytes
