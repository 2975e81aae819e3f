"""benchmarks/host_tiers.py must work the first time on the GPU machine: every part that runs on a CPU is
checked here (the host limiter, the page-cache drop and its mincore check, the read-rate timer, the child's
memory peaks, the figures, and the whole harness on the tiny demo model under a tiny host limit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.child_watch import run_watched
from benchmarks.file_cache import cache_state, checkpoint_files, drop, read_rate
from benchmarks.host_limit import HostLimitError, available, host_limit
from benchmarks.host_tiers_figures import figure, ratios, same_output

ROOT = Path(__file__).resolve().parents[2]
MiB = 2**20


def _harness(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks.host_tiers", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def _cpu_preset(preset: str, folder: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """Run one CPU preset of the harness under a tiny host limit, writing its report to `out`; it must succeed."""
    done = _harness("--presets", preset, "--cpu", "--dir", str(folder), "--host-margin-mb", "256",
                    "--max-hold", str(4 * MiB), "--rate-gb", "0.01", "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def _locked_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmLck:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmLck line")


def test_the_host_limiter_locks_what_it_reports_and_releases_it_after() -> None:
    with host_limit(available() - 256 * MiB, max_hold=4 * MiB) as host:
        assert host.held == 4 * MiB
        assert _locked_bytes(host.pid) == host.held  # page-locked, not merely mapped
        assert host.available_before > host.host_bytes
        pid = host.pid
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_the_host_limiter_refuses_a_host_larger_than_what_is_available() -> None:
    with pytest.raises(HostLimitError, match="only .* bytes available") as caught, host_limit(available() * 4):
        pass
    assert "\n" not in str(caught.value)


def _cacheable_file(tmp_path: Path, size: int) -> Path:
    path = tmp_path / "model" / "weights.safetensors"
    path.parent.mkdir()
    path.write_bytes(os.urandom(size))
    if cache_state([path]).cached_bytes == 0:
        pytest.skip("this filesystem does not keep written pages in the page cache")
    return path


def test_a_drop_empties_the_files_page_cache_and_only_a_buffered_read_fills_it(tmp_path: Path) -> None:
    size = 8 * MiB + 123  # a tail that is not whole pages
    path = _cacheable_file(tmp_path, size)
    drop([path])
    assert cache_state([path]).cached_bytes == 0
    try:
        direct = read_rate([path], direct=True, chunk=MiB, depth=3)
    except OSError:
        pytest.skip("this filesystem refuses O_DIRECT")
    assert direct.nbytes == size and direct.bytes_per_s > 0
    assert cache_state([path]).cached_bytes == 0  # O_DIRECT went around the cache
    buffered = read_rate([path], direct=False, chunk=MiB, depth=3)
    assert buffered.nbytes == size
    assert cache_state([path]).fraction == 1.0


def test_a_read_stops_at_its_limit_and_the_file_list_follows_no_symlink(tmp_path: Path) -> None:
    path = _cacheable_file(tmp_path, 4 * MiB)
    (tmp_path / "outside.bin").write_bytes(b"x" * 4096)
    (path.parent / "link.bin").symlink_to(tmp_path / "outside.bin")
    assert checkpoint_files(path.parent) == [path]
    assert read_rate([path], direct=False, limit=MiB, chunk=MiB, depth=2).nbytes == MiB


def test_the_engines_own_disk_reader_reads_around_the_cache_in_its_own_chunks_and_threads(tmp_path: Path) -> None:
    from benchmarks.tier_reader import engine_reader_rate, reader_threads
    from omni_console.offload.file_spans import READ_CHUNK
    from omni_console.offload.tier_filler import READERS

    assert reader_threads() == READERS  # the harness's torch-free copy of the run's thread count
    size = 8 * MiB + 123
    path = _cacheable_file(tmp_path, size)
    drop([path])
    rate = engine_reader_rate([path], block=3 * MiB)  # three blocks through the ring's slots
    if not rate.o_direct:
        pytest.skip("this filesystem refuses O_DIRECT")
    assert size <= rate.nbytes < size + 4096 and rate.bytes_per_s > 0  # the tail read as a whole page
    assert rate.chunk_bytes == READ_CHUNK and rate.readers == READERS
    assert cache_state([path]).cached_bytes == 0  # O_DIRECT: the run's disk tier leaves the cache alone
    assert engine_reader_rate([path], limit=2 * MiB, block=MiB).nbytes == 2 * MiB


def test_the_engines_cached_tier_rates_are_found_for_the_checkpoints_file_system(tmp_path: Path, monkeypatch) -> None:
    from benchmarks.host_tiers import engine_tier_rates, filesystem_key
    from omni_console.engine.planning import tier_rates

    model = tmp_path / "model"
    model.mkdir()
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    assert filesystem_key(model) == tier_rates.filesystem_key(model)
    for fs, disk in (("0:0", 9e9), (tier_rates.filesystem_key(model), 2e9)):  # another file system's first
        tier_rates.save_rates(tier_rates.CachedRates(device="cpu", filesystem=fs, page_cache_bytes_per_s=5e9,
                                                     disk_bytes_per_s=disk, o_direct=True, note="",
                                                     measured_at="2026-12-07T00:00:00+00:00"))
    found = engine_tier_rates(tmp_path / "cache", model)
    assert found is not None and found["disk_bytes_per_s"] == 2e9 and found["o_direct"] is True
    entry = {"engine_tier_rates": found, "rates": {"disk_seq_bytes_per_s": 2.5e9,
                                                   "engine_reader": {"bytes_per_s": 2.4e9, "o_direct": True}}}
    r = ratios(entry)
    assert r["engine_disk_over_seq"] == 0.96 and r["engine_disk_rate_key"] == "rates.engine_reader.bytes_per_s"
    assert r["engine_probe_over_seq"] == 0.8 and r["engine_probe_disk_rate_key"] == "engine_tier_rates.disk_bytes_per_s"
    assert engine_tier_rates(tmp_path / "none", model) is None


def test_the_watcher_sees_a_childs_peak_rss_and_kills_it_at_its_timeout() -> None:
    code = "import time; b = bytearray(96 * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(0.3); print('ok')"
    watched = run_watched([sys.executable, "-c", code], interval=0.02)
    assert watched.returncode == 0 and watched.stdout.strip() == "ok"
    assert watched.peak_rss is not None and watched.peak_rss >= 96 * MiB
    assert watched.unreclaimable_peak is not None and watched.unreclaimable_peak >= 96 * MiB
    slow = run_watched([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    assert slow.timed_out and slow.returncode == -9 and slow.wall_s < 10


def test_the_watched_child_is_the_oom_killers_first_choice_when_asked() -> None:
    code = "print(open('/proc/self/oom_score_adj').read().strip())"
    assert run_watched([sys.executable, "-c", code], oom_score_adj=1000).stdout.strip() == "1000"
    assert run_watched([sys.executable, "-c", code]).stdout.strip() != "1000"


def test_figures_come_from_the_first_key_present_and_an_override_goes_first() -> None:
    plan = {"request_forecast": {"step_floor_seconds": 0.5, "host": {"peak_bytes": 10}}, "mine": {"host": 12},
            "ram_plan": {"host_peak_bytes": 11}}
    assert figure(plan, "plan_step_floor") == (0.5, "request_forecast.step_floor_seconds")
    assert figure(plan, "plan_host_peak") == (10, "request_forecast.host.peak_bytes")  # plan --json's own key
    assert figure({"ram_plan": {"host_peak_bytes": 11}}, "plan_host_peak") == (11, "ram_plan.host_peak_bytes")
    assert figure(plan, "plan_host_peak", {"plan_host_peak": "mine.host"}) == (12, "mine.host")
    assert figure({}, "plan_host_peak") == (None, None)


def test_the_ratios_of_a_no_waste_entry() -> None:
    entry = {"no_waste": True, "host_bytes": None,
             "plan_doc": {"forecast": {"pinned_host_bytes": 10 * 10**9},
                          "request_forecast": {"step_floor_seconds": 0.4, "host": {"process_base_bytes": 2 * 10**9}}},
             "run_doc": {"steps": [{"wall_s": 0.9}, {"wall_s": 0.5}, {"wall_s": 0.3}],
                         "host_peak_bytes": 21 * 10**9, "predicted_host_peak_bytes": 20 * 10**9},
             "run": {"peak_rss": 23 * 10**9}, "rates": {"disk_seq_bytes_per_s": 2e9}}
    r = ratios(entry)
    assert r["steady_step_s"] == 0.4 and r["step_over_floor"] == 1.0  # the median after the first step
    # the plan's bytes + the process base it names + 1.5 GB; strictly, without the base
    assert r["no_waste_limit"] == 13.5e9 and r["peak_rss_over_no_waste_limit"] == round(23 / 13.5, 4)
    assert r["no_waste_limit_strict"] == 11.5e9 and r["peak_rss_over_no_waste_limit_strict"] == 2.0
    assert r["process_base_key"] == "request_forecast.host.process_base_bytes"
    assert r["peak_rss_over_host"] is None and r["engine_disk_over_seq"] is None
    assert r["run_host_peak_over_forecast"] == 1.05  # run --json's own measured peak against its forecast
    assert r["run_pinned_over_plan"] is None  # an older run report: none of its pinned figures


def test_a_no_waste_entry_reads_the_plan_the_run_loaded_and_its_pinned_figures() -> None:
    entry = {"no_waste": True, "host_bytes": None,
             "plan_doc": {"forecast": {"pinned_host_bytes": 10 * 10**9}},
             "run_doc": {"forecast": {"pinned_host_bytes": 8 * 10**9, "host_pinned_bytes": 8.2e9},
                         "pinned_bytes": 8.2e9, "host_master_bytes": 8.3e9, "host_process_base_bytes": 1.9e9},
             "run": {"peak_rss": 11.4e9}}
    r = ratios(entry)
    assert r["plan_pinned_bytes"] == 8e9 and r["process_base_bytes"] == 1.9e9  # the run's own forecast's base
    assert r["no_waste_limit"] == 11.4e9 and r["peak_rss_over_no_waste_limit"] == 1.0
    assert r["peak_rss_over_no_waste_limit_strict"] == round(11.4 / 9.5, 4)
    assert r["run_pinned_over_plan"] == 1.025 and r["run_pinned_over_forecast"] == 1.0
    assert r["run_host_master_bytes"] == 8.3e9


def test_a_no_waste_entry_without_a_named_base_has_only_the_strict_ratio() -> None:
    entry = {"no_waste": True, "run_doc": {"forecast": {"pinned_host_bytes": 8 * 10**9}}, "run": {"peak_rss": 9.5e9}}
    r = ratios(entry)
    assert r["no_waste_limit"] is None and r["peak_rss_over_no_waste_limit"] is None
    assert r["peak_rss_over_no_waste_limit_strict"] == 1.0


def test_the_no_waste_preset_skips_the_second_plan_and_earlier_presets_leave_it_its_time() -> None:
    from benchmarks.host_tiers import PRESETS, Deadline

    assert not PRESETS["nowaste"].plan_after and PRESETS["flux16"].plan_after
    box = Deadline(300)
    assert box.left(1000) is not None and box.left(1000) <= 290
    box.reserve = PRESETS["nowaste"].need_s
    left = box.left(1000)
    assert left is not None and left <= 290 - PRESETS["nowaste"].need_s
    box.reserve = 280  # nothing left for this preset's children once the later ones are kept back
    assert box.left(1000) is None


def test_same_output_compares_pixels(tmp_path: Path) -> None:
    from PIL import Image

    a, b, c = tmp_path / "a.png", tmp_path / "b.png", tmp_path / "c.png"
    Image.new("RGB", (8, 8), (1, 2, 3)).save(a)
    Image.new("RGB", (8, 8), (1, 2, 3)).save(b)
    Image.new("RGB", (8, 8), (1, 2, 4)).save(c)
    assert same_output(a, b) is True and same_output(a, c) is False and same_output(a, tmp_path / "none") is None


def test_output_diff_says_how_far_two_outputs_are_apart_frame_by_frame(tmp_path: Path) -> None:
    import av
    import numpy as np

    from benchmarks.host_tiers_figures import output_diff

    def video(path: Path, frames: list[np.ndarray]) -> Path:
        with av.open(str(path), "w") as container:
            stream = container.add_stream("libx264", rate=8)
            stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv444p"
            stream.options = {"qp": "0"}  # lossless: the decoded frames are the written ones
            for f in frames:
                container.mux(stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
            container.mux(stream.encode())
        return path

    base = [np.full((32, 32, 3), 40 * i, np.uint8) for i in range(3)]
    moved = [f.copy() for f in base]
    moved[1][:4, :4] += 9
    a, b = video(tmp_path / "a.mp4", base), video(tmp_path / "b.mp4", moved)
    assert output_diff(a, video(tmp_path / "a2.mp4", base)) == {
        "frames": 3, "frames_other": 3, "identical": True, "max_abs_diff": 0, "mean_abs_diff": 0.0, "psnr_db": None,
        "frames_differing": 0}
    diff = output_diff(a, b)
    assert diff is not None and diff["identical"] is False and diff["frames_differing"] == 1
    assert diff["max_abs_diff"] == 9 and 0 < diff["mean_abs_diff"] < 1 and diff["psnr_db"] > 30
    short = output_diff(a, video(tmp_path / "c.mp4", base[:2]))
    assert short == {"frames": 3, "frames_other": 2, "identical": False, "shape_differs": True}
    assert output_diff(a, tmp_path / "none.mp4") is None


def test_the_resident_reference_gets_every_output_changing_choice_of_the_tiered_run() -> None:
    """wan32 on a 12 GB card: `--vram-budget auto` turned VAE tiling on (not exact); the reference decoded untiled,
    so its frames could not match. It now gets the run report's choices, and no budget of its own."""
    from benchmarks.host_tiers import PRESETS, flags, parse_args, reference_flags

    policy = {"mode": "dlo", "stream_encoders": "on", "vae_tiling": "on", "vae_slicing": "auto", "ff_chunking": "auto",
              "stream_dtype": None, "fp8_modulation": False, "lean_auto": ["stream_encoders", "vae_tiling"]}
    run_doc = {"policy": policy, "compile": None, "cache": None}
    matched = reference_flags(run_doc)
    assert matched == ["--vae-tiling", "on", "--vae-slicing", "off", "--ff-chunking", "off"]
    args = parse_args(["--presets", "wan32"])
    argv = flags("run", PRESETS["wan32"], args, Path("/m"), Path("/w"), True, resident=True, matched=matched)
    assert " ".join(argv).count("--mode resident --vae-tiling on --vae-slicing off --ff-chunking off") == 1
    assert "--vram-budget" not in argv and "--ram-budget" not in argv and "--stream-encoders" not in argv
    fp8 = {"policy": {**policy, "vae_tiling": "off", "ff_chunking": "on", "stream_dtype": "float8_e4m3fn",
                      "fp8_modulation": True},
           "compile": {"on": True}, "cache": {"cache": "first-block:threshold=0.05"}}
    assert reference_flags(fp8) == ["--vae-tiling", "off", "--vae-slicing", "off", "--ff-chunking", "on",
                                    "--stream-dtype", "float8_e4m3fn", "--fp8-modulation", "--compile", "regional",
                                    "--cache", "first-block:threshold=0.05"]
    assert reference_flags(None)[:2] == ["--vae-tiling", "off"]  # no report: untiled, as a plain resident run


def test_the_ratios_hold_the_resident_steps_and_the_pixel_difference() -> None:
    entry = {"run_doc": {"steps": [{"wall_s": 9.0}, {"wall_s": 8.0}, {"wall_s": 8.4}]},
             "resident": {"steady_step_s": 6.5, "steps_s": [7.0, 6.4, 6.6], "matched_flags": ["--vae-tiling", "on"]},
             "identical_to_resident": False, "resident_diff": {"identical": False, "max_abs_diff": 3,
                                                               "mean_abs_diff": 0.01, "psnr_db": 61.2}}
    r = ratios(entry)
    assert r["step_over_resident"] == round(8.2 / 6.5, 4) and r["resident_steps_s"] == [7.0, 6.4, 6.6]
    assert r["max_abs_diff_to_resident"] == 3 and r["psnr_to_resident_db"] == 61.2
    assert r["resident_matched_flags"] == ["--vae-tiling", "on"]


def test_the_expert_switch_step_is_the_one_after_the_boundary_line_and_is_set_against_the_other_steps() -> None:
    from benchmarks.host_tiers_figures import expert_switch

    walls = [12.0, 7.0, 7.2, 7.1, 6.9, 7.0, 7.5, 7.3, 7.2]
    run_doc = {"steps": [{"step": i + 1, "wall_s": w} for i, w in enumerate(walls)]}
    progress = [f"step {i}/9 7.00 s (stall 1.0 ms)" for i in range(1, 7)] + [
        "expert transformer → transformer_2 at timestep 857 (boundary): copied 5.6 GB, freed 5.6 GB in 312.4 ms",
        "step 7/9 7.50 s (stall 0.2 ms)", "step 8/9 7.30 s (stall 0.1 ms)", "step 9/9 7.20 s (stall 0.1 ms)",
        "expert transformer_2 → transformer (request end): copied 5.6 GB, freed 5.6 GB in 1.20 s"]
    r = expert_switch(run_doc, progress)
    assert r["switch_step"] == 7 and r["switch_from"] == "transformer" and r["switch_timestep"] == 857.0
    assert r["switch_event_s"] == 0.3124 and r["switch_step_s"] == 7.5
    assert r["other_steps_median_s"] == 7.1  # steps 2-6, 8, 9: not the first (one-time costs), not the switch's
    assert r["switch_step_over_others"] == round(7.5 / 7.1, 4)
    assert r["switch_event_over_others"] == round(0.3124 / 7.1, 4)
    assert r["new_expert_later_median_s"] == 7.25 and r["switch_step_over_new_expert"] == round(7.5 / 7.25, 4)
    assert r["pre_switch_step_over_others"] == round(7.0 / 7.1, 4)
    # in seconds, and only the boundary switch counts
    late = expert_switch(run_doc, progress[:6] + ["expert transformer → transformer_2 at timestep 857 (boundary): "
                                                  "copied 5.6 GB, freed 0 bytes in 1.25 s"])
    assert late["switch_step"] == 7 and late["switch_event_s"] == 1.25
    assert expert_switch(run_doc, progress[:6] + progress[-1:])["switch_step"] is None
    entry = {"expert_switch": True, "run_doc": run_doc, "run": {"progress": progress}}
    assert ratios(entry)["switch_step_over_others"] == r["switch_step_over_others"]


def test_the_a14b_preset_runs_the_fp8_checkpoint_on_a_32_gb_host_and_a_16_gb_card_across_the_boundary(
        tmp_path: Path) -> None:
    from diffusers import UniPCMultistepScheduler

    from benchmarks.host_tiers import DEFAULT_DIRS, PRESETS, SIZES, flags, parse_args
    from benchmarks.wan22_checkpoint import write_a14b_checkpoint
    from omni_console.engine.model_dir.discovery import discover_model

    preset = PRESETS["a14b"]
    assert (preset.host_gb, preset.card_gb, preset.ram_budget, preset.vram_budget) == (32, 16, "auto", "auto")
    assert preset.expert_switch and not preset.resident_reference and DEFAULT_DIRS["a14b"] == "/tmp/a14b-fp8"
    run = " ".join(flags("run", preset, parse_args(["--presets", "a14b"]), Path("/tmp/a14b-fp8"), tmp_path, True))
    assert "--height 480 --width 832 --guidance 4.0 --frames 81 --vram-budget auto --ram-budget auto --steps 9" in run
    assert "--stream-dtype" not in run  # the checkpoint is fp8 as stored
    # the tiny checkpoint of the same writer: two experts, their linears fp8 on disk, the A14B schedule
    root = tmp_path / "a14b"
    write_a14b_checkpoint(root, device="cpu", tiny=True)
    model = discover_model(root)
    assert [d.name for d in model.denoisers] == ["transformer", "transformer_2"]
    assert all("float8_e4m3fn" in d.dtypes for d in model.denoisers)
    scheduler = UniPCMultistepScheduler.from_pretrained(root / "scheduler")
    scheduler.set_timesteps(preset.steps)
    boundary = 0.875 * 1000  # model_index.json's boundary_ratio, as WanPipeline compares it
    assert json.loads((root / "model_index.json").read_text())["boundary_ratio"] == 0.875
    high = [t for t in scheduler.timesteps.tolist() if t >= boundary]
    assert len(high) == 6 and preset.steps - len(high) >= 2  # the switch at step 7, a later step of its expert
    assert SIZES["a14b-tiny"]["frames"] == 5 and PRESETS["tiny-a14b"].steps == preset.steps


def test_a_host_the_machine_cannot_simulate_is_refused_in_one_line_before_anything_runs(tmp_path: Path) -> None:
    done = _harness("--presets", "tiny", "--cpu", "--dir", str(tmp_path / "m"), "--host-gb", "1000000",
                    "--out", str(tmp_path / "r.json"), timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("host_tiers: cannot simulate") and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "m").exists() and not (tmp_path / "r.json").exists()


@pytest.mark.slow
def test_the_dry_run_shows_the_commands_and_uses_the_host_flag_only_where_the_cli_has_it(tmp_path: Path) -> None:
    listed = _harness("--presets", "flux16", "wan32", "--dry-run", "--ram-flag=--prefetch-slots")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert sum("--vram-budget auto --prefetch-slots auto" in ln for ln in lines) == 6  # 2 plans + 1 run each
    reference = [i for i, ln in enumerate(lines) if "--mode resident" in ln]
    assert len(reference) == 1 and "--frames 81" in lines[reference[0]] and "--guidance 5.0" in lines[reference[0]]
    assert "--mode resident [the run report's: --vae-tiling on|off" in lines[reference[0]]
    assert lines[reference[0] - 1].startswith("  omni-console plan")  # after the tiered plan, run and plan
    a14b = _harness("--presets", "a14b", "--dry-run").stdout.splitlines()
    assert a14b[0] == "a14b: a14b at /tmp/a14b-fp8; host 32.00 GB, card 16 GB; --ram-budget used"
    assert [ln.split()[1] for ln in a14b[1:]] == ["plan", "run", "plan"] and "--steps 9" in a14b[2]
    missing = _harness("--presets", "flux16", "--dry-run", "--ram-flag=--no-such-flag")
    assert missing.returncode == 0 and "--no-such-flag" not in missing.stdout.split("\n", 1)[1]


@pytest.mark.slow
def test_the_resident_reference_is_given_the_tiered_runs_vae_tiling_and_matches_it(tmp_path: Path) -> None:
    """At 128² the demo VAE's tiles (64²) change the pixels: a reference decoded untiled differs by up to 135 of 255
    (measured); with the tiered run's `--vae-tiling on` it is the same image, bit for bit."""
    out = tmp_path / "r.json"
    _cpu_preset("tiny-ref", tmp_path / "demo", out)
    entry = json.loads(out.read_text())["presets"][0]
    assert entry["run_doc"]["policy"]["vae_tiling"] == "on"
    assert entry["resident"]["matched_from"] == "run_doc.policy"
    assert entry["resident"]["matched_flags"][:2] == ["--vae-tiling", "on"]
    assert entry["resident"]["policy"]["mode"] == "resident" and entry["resident"]["policy"]["vae_tiling"] == "on"
    assert entry["resident"]["returncode"] == 0 and len(entry["resident"]["steps_s"]) == 2
    assert entry["resident_diff"]["identical"] is True and entry["resident_diff"]["max_abs_diff"] == 0
    assert entry["ratios"]["identical_to_resident"] is True and entry["ratios"]["step_over_resident"] > 0


@pytest.mark.slow
def test_the_tiny_a14b_preset_writes_two_fp8_experts_and_times_the_switch_step(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    _cpu_preset("tiny-a14b", tmp_path / "a14b", out)
    entry = json.loads(out.read_text())["presets"][0]
    assert entry["run"]["returncode"] == 0 and entry["plan_doc"]["forecast"]["stream_dtype"] == "float8_e4m3fn"
    r = entry["ratios"]
    assert r["switch_step"] == 7 and r["switch_from"] == "transformer" and r["switch_to"] == "transformer_2"
    assert len(r["steps_s"]) == 9 and r["switch_step_s"] == r["steps_s"][6]
    assert r["switch_step_over_others"] > 0 and r["switch_step_over_new_expert"] > 0
    assert any("(request end)" in ln for ln in entry["run"]["progress"])


@pytest.mark.slow
def test_the_tiny_preset_runs_the_whole_harness_on_the_cpu_under_a_tiny_host_limit(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = _cpu_preset("tiny", tmp_path / "demo", out)
    report = json.loads(out.read_text())
    entry = report["presets"][0]
    assert entry["host_limit"]["held"] == 4 * MiB and entry["host_limit"]["alive_after"] is True
    for step in ("plan", "run", "plan_after"):
        assert entry[step]["returncode"] == 0, entry[step].get("error")
        assert entry[f"cache_before_{step}"]["cached_bytes"] == 0  # dropped, and checked
    assert entry["run"]["peak_rss"] > 50 * MiB  # torch alone is more
    assert entry["run_doc"]["schema"].startswith("omni-console.run-report/")
    assert entry["rates"]["disk_seq_bytes_per_s"] > 0 and entry["rates"]["buffered_bytes"] > 0
    assert entry["ratios"]["peak_rss_over_host"] == round(entry["run"]["peak_rss"] / entry["host_bytes"], 4)
    # the disk tier's rates: the engine's own reader timed by the harness, and what the plan's probe cached
    assert entry["rates"]["engine_reader"]["nbytes"] == entry["checkpoint_bytes"]  # under --rate-gb: all of it
    assert "/cache/tier_rates/" in entry["engine_tier_rates"]["path"]  # the children's own cache dir
    assert entry["ratios"]["engine_probe_disk_rate"] == entry["engine_tier_rates"]["disk_bytes_per_s"] > 0
    assert entry["ratios"]["engine_disk_over_seq"] is not None and entry["ratios"]["engine_probe_over_seq"] is not None
    assert report["environment"]["device"] == "cpu"
    assert (tmp_path / "demo" / "model_index.json").exists()
    assert "tiny" in done.stdout.splitlines()[-2]  # the table's row
