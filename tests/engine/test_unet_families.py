"""SD1.5 and SDXL UNets stream unit by unit like DiT blocks: each down/mid/up block's children (resnets,
attentions, down/up samplers) in the order that block's forward calls them.

The oracle is the plain diffusers pipeline (`from_pretrained`, no offload, same seed); on a CPU every
policy must give the same pixels bit for bit, through the whole engine (discover, load, place,
generate). The unit order is checked against the calls a real diffusers forward makes. SD1.5 is saved
without a safety checker (`[null, null]` components).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from tiny_families_unet import UNET_GENERATION, build_tiny_sd15, build_tiny_sdxl

from omni_console.engine.engine import Engine
from omni_console.engine.events import StepTiming
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.errors import PolicyError
from omni_console.offload.events import LogEvent, StagingEvent
from omni_console.offload.policy import build_policy

PROMPT = "a lighthouse on a cliff at dusk"
SEED = 11
UNET_HEADS = ("down_blocks", "mid_block", "up_blocks")
ALL = -1  # every unit resident

# (components, resident units, mode, placement, slots): all streamed, some resident (leading, spread, a
# deeper ring), every unit resident, and no offload at all
POLICIES = [
    ({}, 0, "dlo", "leading", 2),
    ({"default": False}, 2, "dlo", "leading", 2),
    ({"vae": False}, 5, "dlo", "spread", 3),
    ({}, ALL, "dlo", "leading", 2),
    (None, 0, "resident", "leading", 2),
]


@pytest.fixture(scope="module")
def sdxl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_sdxl(tmp_path_factory.mktemp("models") / "sdxl")


@pytest.fixture(scope="module")
def sd15_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_sd15(tmp_path_factory.mktemp("models") / "sd15")


def _request(family: str) -> GenerateRequest:
    gen = UNET_GENERATION[family]
    return GenerateRequest(prompt=PROMPT, steps=gen["num_inference_steps"], height=gen["height"],
                           width=gen["width"], seed=SEED, guidance=6.0, output_type="np")


def _plain_pipeline(path: Path):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _call(pipe, req: GenerateRequest) -> np.ndarray:
    return pipe(prompt=req.prompt, num_inference_steps=req.steps, height=req.height, width=req.width,
                guidance_scale=req.guidance, output_type="np",
                generator=torch.Generator("cpu").manual_seed(req.seed)).images[0]


def _unit_bytes_from_files(path: Path) -> dict[str, int]:
    """Bytes per UNet unit (`down_blocks.1.attentions.0`, `mid_block.resnets.0`), summed from the file's tensors."""
    sizes: dict[str, int] = {}
    with safe_open(str(path / "unet" / "diffusion_pytorch_model.safetensors"), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            parts = key.split(".")
            if parts[0] not in UNET_HEADS:
                continue
            unit = ".".join(parts[:3] if parts[0] == "mid_block" else parts[:4])
            tensor = f.get_tensor(key)
            sizes[unit] = sizes.get(unit, 0) + tensor.numel() * tensor.element_size()
    return sizes


def _planned_units(path: Path) -> list[str]:
    unet = discover_model(path).component("unet")
    return [f"{b.attr}.{item}" for b in unet.block_lists for item in b.items]


@pytest.mark.parametrize("builder", ["sd15", "sdxl"])
def test_the_unet_is_its_own_role_with_its_units_from_the_files(request, builder):
    path = request.getfixturevalue(f"{builder}_dir")
    model = discover_model(path)
    unet = model.component("unet")
    assert unet.role == "unet" and model.denoisers == [unet] and model.dits == []
    heads = [b.attr.split(".")[0] for b in unet.block_lists]
    assert heads == sorted(heads, key=UNET_HEADS.index)  # down, mid, up: not __init__'s down, up, mid
    assert all(b.items and len(b.items) == b.count for b in unet.block_lists)  # every block split into children
    from_files = _unit_bytes_from_files(path)
    planned = {f"{b.attr}.{item}": n for b in unet.block_lists for item, n in zip(b.items, b.block_bytes, strict=True)}
    assert planned == from_files  # every block tensor in exactly one unit
    assert unet.non_block_bytes == unet.nbytes - sum(from_files.values()) > 0
    assert model.num_dit_blocks == len(from_files)
    whole_blocks: dict[str, int] = {}
    for unit, n in from_files.items():
        block = unit.rsplit(".", 2)[0]
        whole_blocks[block] = whole_blocks.get(block, 0) + n
    assert max(from_files.values()) < max(whole_blocks.values()) / 2  # the ring's slot shrinks: the point


@pytest.mark.parametrize("builder", ["sd15", "sdxl"])
def test_unit_order_is_the_order_a_real_forward_calls_them(request, builder):
    """Pre-hooks on every planned unit of the plain diffusers UNet record one denoise step's forward."""
    path = request.getfixturevalue(f"{builder}_dir")
    planned = _planned_units(path)
    pipe = _plain_pipeline(path)
    calls: list[str] = []
    for unit in planned:
        pipe.unet.get_submodule(unit).register_forward_pre_hook(lambda *_, unit=unit: calls.append(unit))
    _call(pipe, replace(_request(builder), steps=1))
    assert calls == planned  # one forward (both guidance halves in one batch): each unit once, in plan order


@pytest.mark.slow
@pytest.mark.parametrize("family", ["sd15", "sdxl"])
def test_bit_identical_to_plain_diffusers_under_every_policy(request, family):
    path = request.getfixturevalue(f"{family}_dir")
    req = _request(family)
    expected = _call(_plain_pipeline(path), req)
    assert expected.shape == (64, 64, 3) and float(expected.std()) > 0
    engine = Engine(path, device="cpu")
    try:
        for comps, layers, mode, placement, slots in POLICIES:
            policy = build_policy(comps, engine.model.num_dit_blocks if layers == ALL else layers, mode, placement,
                                  slots)
            engine.load(policy)
            streamer = engine.placement.streamer if engine.placement else None
            streamed = streamer.num_streamed if streamer is not None else 0
            units = engine.model.num_dit_blocks
            assert streamed == (0 if mode == "resident" else units - (units if layers == ALL else layers)), policy
            result = engine.generate(req)
            engine.unload()
            assert np.array_equal(result.image, expected), policy
    finally:
        engine.close()


def _unet_staging(events: list) -> tuple[list[list[StagingEvent]], list[StagingEvent]]:
    """The UNet block copies per denoise step (split at each StepTiming) and those before the first step."""
    steps: list[list[StagingEvent]] = [[]]
    for event in events:
        if isinstance(event, StepTiming):
            steps.append([])
        elif isinstance(event, StagingEvent) and event.target.startswith("unet."):
            steps[-1].append(event)
    return steps[1:-1], steps[0]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["sd15", "sdxl"])
def test_units_stream_every_step_without_a_synchronous_fetch(request, family):
    engine = Engine(request.getfixturevalue(f"{family}_dir"), device="cpu")
    sub = engine.bus.subscribe()
    try:
        engine.load(build_policy({}, 1, "dlo", "spread", 2))
        planned = [f"{b.dit}.{b.attr}.{b.index}" for b in engine.plan.blocks if b.streamed]
        assert len(planned) == engine.model.num_dit_blocks - 1 > 7  # units, not the 7 whole blocks
        # a UNet's ring is the forecast's k largest units' bytes as one buffer (offload/byte_ring.py)
        streamer = engine.placement.streamer if engine.placement else None
        assert engine.plan.residency.byte_ring and streamer is not None
        forecast = engine.plan.forecast
        assert streamer.num_slots == forecast.streaming_slots == 2
        ring_bytes = streamer.slot_bytes
        assert ring_bytes == streamer.ring_capacity(2) >= 2 * forecast.largest_streamed_block_bytes
        engine.generate(replace(_request(family), steps=3))
        events = sub.drain()
    finally:
        engine.close()
    ring = f"a ring of {ring_bytes:,} bytes (2 largest units"
    assert [e for e in events if isinstance(e, LogEvent) and ring in e.message]  # the load says so
    steps = [e for e in events if isinstance(e, StepTiming)]
    assert len(steps) >= 3  # SD1.5's PNDM runs one more (its first PLMS step twice)
    per_step, _ = _unet_staging(events)
    assert len(per_step) == len(steps) - 1  # the copies made during steps 2.. (the last step's trail is the next's)
    for copies in per_step:
        assert sorted(e.target for e in copies) == sorted(planned)  # every streamed block, once per step
        assert not [e for e in copies if e.sync], "a block was fetched synchronously after the first step"
    streamed_bytes = sum(b.nbytes for b in engine.plan.blocks if b.streamed)
    for step in steps[1:]:
        assert step.h2d_bytes >= streamed_bytes  # every streamed block crossed once (regions are aligned)


def test_policy_map_and_resident_blocks_are_checked_against_the_unet(sdxl_dir: Path):
    model = discover_model(sdxl_dir)
    with pytest.raises(PolicyError, match="unet is a UNet, streamed block by block like a DiT"):
        make_plan(model, build_policy({"unet": False}))
    n = len(_unit_bytes_from_files(sdxl_dir))
    with pytest.raises(PolicyError, match=rf"between 0 and {n} \(the model's UNet blocks\)"):
        make_plan(model, build_policy({}, n + 1))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sdxl_on_cuda_matches_plain_diffusers_and_streams_ahead(sdxl_dir: Path):
    """On a GPU the copies are asynchronous: the output is still bit-identical to plain diffusers on the same
    device (float32 weights copied exactly), and after the first step no block is fetched synchronously."""
    req = replace(_request("sdxl"), steps=3)
    expected = _call(_plain_pipeline(sdxl_dir).to("cuda"), req)
    engine = Engine(sdxl_dir, device="cuda")
    sub = engine.bus.subscribe()
    try:
        for comps, layers, mode, placement, slots in POLICIES:
            engine.load(build_policy(comps, engine.model.num_dit_blocks if layers == ALL else layers, mode,
                                     placement, slots))
            sub.drain()
            result = engine.generate(req)
            per_step, _ = _unet_staging(sub.drain())
            engine.unload()
            assert np.array_equal(result.image, expected), (comps, layers, mode, placement, slots)
            assert not [e for copies in per_step for e in copies if e.sync], (comps, layers, mode, placement, slots)
    finally:
        engine.close()


def test_too_many_unet_blocks_are_called_unet_blocks(sd15_dir: Path, monkeypatch, capsys):
    """The block-count refusal names the blocks as the plan does: a UNet's are never called "DiT blocks"."""
    from omni_console.console.cli import main
    from omni_console.engine.model_dir import discovery

    blocks = discover_model(sd15_dir).num_dit_blocks
    monkeypatch.setattr(discovery, "MAX_DIT_BLOCKS", blocks - 1)
    assert main(["plan", "--model", str(sd15_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f": {blocks} UNet blocks, more than the {blocks - 1}" in err, err
    assert "DiT" not in err
