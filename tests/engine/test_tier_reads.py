"""Streamed blocks read from the page cache and from disk (O_DIRECT) at each use, against plain diffusers.

The tier planner is another piece of work: here the plan's tiers are set by hand (`dataclasses.replace`),
as a planner would, and the output must be bit-identical to `DiffusionPipeline.from_pretrained` under
every policy, while the host holds only the bounce ring for the file-tier blocks.
"""

from __future__ import annotations

import dataclasses
import errno
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from omni_console.console.cli import main
from omni_console.engine import engine as engine_module
from omni_console.engine.engine import Engine
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload import tier_files
from omni_console.offload.events import LogEvent, StagingEvent
from omni_console.offload.policy import build_policy
from omni_console.offload.tiers import BOUNCE_SLOTS, PAGE, HostTiers, Tier

REQUEST = GenerateRequest(prompt="a red fox in the snow", steps=2, height=64, width=64, seed=7, guidance=3.0,
                          output_type="np")
ALL_TIERS: tuple[Tier, ...] = ("pinned", "page_cache", "disk")


def every(tier: Tier) -> Callable[[int], Tier]:
    return lambda _i: tier


def mixed(i: int) -> Tier:
    return ALL_TIERS[i % 3]


def force_tiers(monkeypatch: pytest.MonkeyPatch, tier_of: Callable[[int], Tier]) -> None:
    """Every plan the engine makes gets these block tiers (the planner's decision, made by hand)."""
    make = engine_module.make_plan

    def with_tiers(model, policy, *args, **kwargs):
        plan = make(model, policy, *args, **kwargs)
        return dataclasses.replace(plan, tiers=HostTiers(blocks=tuple(tier_of(i) for i in range(len(plan.blocks)))))

    monkeypatch.setattr(engine_module, "make_plan", with_tiers)


def plain_output(path: Path, request: GenerateRequest) -> np.ndarray:
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(**request.call_kwargs(pipe))
    return np.asarray(out.images)


def engine_output(result) -> np.ndarray:
    return np.asarray(result.image)[None]


POLICIES = (lambda: build_policy({}, 0), lambda: build_policy({"default": False}, 1),
            lambda: build_policy({"vae": False}, 2, prefetch_slots=3), lambda: build_policy({}, 1, placement="spread"))


def assert_tiers_bit_identical(path: Path, request: GenerateRequest, monkeypatch: pytest.MonkeyPatch,
                               tier_of: Callable[[int], Tier]) -> list:
    expected = plain_output(path, request)
    assert float(expected.std()) > 0
    force_tiers(monkeypatch, tier_of)
    engine = Engine(path, device="cpu")
    events = engine.bus.subscribe()
    try:
        for policy in POLICIES:
            engine.load(policy())
            streamer = engine.placement.streamer
            assert streamer is not None and streamer.bounce_bytes > 0
            result = engine.generate(request, threading.Event())
            engine.unload()
            got = engine_output(result)
            assert np.array_equal(got.reshape(expected.shape), expected), policy
    finally:
        engine.close()
    return events.drain()


@pytest.mark.slow
@pytest.mark.parametrize("tier_of", [every("page_cache"), every("disk"), mixed], ids=["page_cache", "disk", "mixed"])
def test_demo_flux_from_file_tiers_is_bit_identical(demo_model_dir: Path, monkeypatch, tier_of):
    seen = assert_tiers_bit_identical(demo_model_dir, REQUEST, monkeypatch, tier_of)
    tiers = {e.tier for e in seen if isinstance(e, StagingEvent) and e.target.startswith("transformer.")}
    assert tiers == ({tier_of(0)} if tier_of is not mixed else set(ALL_TIERS))


@pytest.mark.slow
@pytest.mark.parametrize("tier_of", [every("disk"), mixed], ids=["disk", "mixed"])
def test_unet_from_file_tiers_is_bit_identical(loading_family_dir, monkeypatch, tier_of):
    from tiny_families_loading import LOADING_GENERATION

    gen = dict(LOADING_GENERATION["sd15"])
    request = GenerateRequest(prompt="a red fox", steps=gen.pop("num_inference_steps"), height=gen.pop("height"),
                              width=gen.pop("width"), seed=7, guidance=3.0, negative_prompt="blurry",
                              output_type="np", extra=gen)
    assert_tiers_bit_identical(loading_family_dir("sd15"), request, monkeypatch, tier_of)


@pytest.mark.slow
def test_file_tier_blocks_cost_only_the_bounce_ring(demo_model_dir: Path, monkeypatch):
    """Host bytes: the arena holds the pinned blocks alone; every file-tier block shares the bounce ring."""
    held = {}
    for name, tier_of in (("all pinned", every("pinned")), ("half on disk", lambda i: "disk" if i % 2 else "pinned"),
                          ("all on disk", every("disk"))):
        force_tiers(monkeypatch, tier_of)
        engine = Engine(demo_model_dir, device="cpu")
        try:
            engine.load(build_policy({}, 0))
            s = engine.placement.streamer
            arena = s.filler.arena
            held[name] = (arena.nbytes if arena is not None else 0, s.bounce_bytes, s.tier_bytes())
        finally:
            engine.close()
    pinned_arena, _, by_tier = held["all pinned"]
    assert by_tier["pinned"] > 0 and held["all pinned"][1] == 0
    half_arena, half_bounce, half_tiers = held["half on disk"]
    assert 0 < half_arena < pinned_arena and half_tiers["disk"] > 0
    none_arena, bounce, disk_tiers = held["all on disk"]
    assert none_arena == 0 and disk_tiers["disk"] == by_tier["pinned"]
    largest = max(b.nbytes for b in Engine(demo_model_dir, device="cpu").make_plan(build_policy({}, 0)).blocks)
    assert bounce == half_bounce <= BOUNCE_SLOTS * (largest + 4 * PAGE)  # not the blocks' total: the ring


@pytest.mark.slow
def test_direct_io_refused_reads_buffered_says_so_once_and_stays_exact(demo_model_dir: Path, monkeypatch):
    """Where O_DIRECT is refused (EINVAL: tmpfs on older kernels, this kernel's tmpfs accepts it) the disk
    tier reads through the page cache and says so in one line."""
    def refuse(_fd: int) -> int:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(tier_files, "open_direct", refuse)
    expected = plain_output(demo_model_dir, REQUEST)
    force_tiers(monkeypatch, every("disk"))
    engine = Engine(demo_model_dir, device="cpu")
    events = engine.bus.subscribe()
    try:
        engine.load(build_policy({}, 0))
        assert not engine.placement.streamer.filler.direct_reads
        got = engine_output(engine.generate(REQUEST, threading.Event()))
    finally:
        engine.close()
    assert np.array_equal(got.reshape(expected.shape), expected)
    said = [e.message for e in events.drain() if isinstance(e, LogEvent) and "O_DIRECT" in e.message]
    assert len(said) == 1 and "page cache" in said[0]


@pytest.mark.slow
def test_direct_reads_on_tmpfs_are_exact_either_way(demo_model_dir: Path, monkeypatch, tmp_path: Path):
    """A model on /dev/shm (tmpfs): O_DIRECT accepted or refused, the disk tier gives the same output."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    copy = Path(shutil.copytree(demo_model_dir, shm / f"omni-tier-{tmp_path.name}"))
    try:
        force_tiers(monkeypatch, every("disk"))
        outputs = []
        for path in (demo_model_dir, copy):
            engine = Engine(path, device="cpu")
            try:
                engine.load(build_policy({}, 0))
                outputs.append(engine_output(engine.generate(REQUEST, threading.Event())))
            finally:
                engine.close()
        assert np.array_equal(outputs[0], outputs[1])
    finally:
        shutil.rmtree(copy)


@pytest.mark.parametrize("change", ["shrink", "rewrite"])
def test_a_weights_file_changed_after_the_load_fails_the_run_in_one_line(demo_model_dir: Path, tmp_path: Path,
                                                                          monkeypatch, capsys, change: str):
    model = Path(shutil.copytree(demo_model_dir, tmp_path / "model"))
    weights = sorted((model / "transformer").glob("*.safetensors"))
    assert weights
    force_tiers(monkeypatch, every("page_cache"))
    load = Engine.load

    def load_then_change(self, *args, **kwargs):
        report = load(self, *args, **kwargs)
        for f in weights:
            if change == "shrink":
                with f.open("r+b") as handle:
                    handle.truncate(f.stat().st_size // 2)
            else:  # same size, other bytes
                data = bytearray(f.read_bytes())
                data[-64:] = bytes(64)
                f.write_bytes(bytes(data))
        return report

    monkeypatch.setattr(Engine, "load", load_then_change)
    out = tmp_path / "out.png"
    code = main(["run", "--headless", "--model", str(model), "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err and not out.exists()
    failed = [line for line in err.splitlines() if "changed on disk after the load" in line]
    assert len(failed) == 1 and weights[0].name in failed[0]


@pytest.mark.parametrize("live", [True, False])
def test_file_tiers_are_planned_with_or_without_live_masters(demo_model_dir: Path, monkeypatch, live: bool):
    """A live re-plan load reads the blocks whose masters are in a file tier from their files
    (tests/engine/test_live_tiers.py); two experts and several GPUs are still refused (test_ram_plan)."""
    from omni_console.engine.options import EngineOptions

    force_tiers(monkeypatch, every("disk"))
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(live_replan=live))
    try:
        assert engine.make_plan(build_policy({}, 0)).tiers.blocks[0] == "disk"
    finally:
        engine.close()
