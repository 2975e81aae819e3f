"""SD1.5 and SDXL UNets stream block by block (down_blocks, mid_block, up_blocks) like DiT blocks.

The oracle is the plain diffusers pipeline (`from_pretrained`, no offload, same seed); on a CPU every
policy must give the same pixels bit for bit, through the whole engine (discover, load, place,
generate). SD1.5 is saved without a safety checker (`[null, null]` components).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from tiny_families_unet import UNET_GENERATION, build_tiny_sd15, build_tiny_sdxl

from omni_console.engine.discovery import discover_model
from omni_console.engine.engine import Engine
from omni_console.engine.plan import make_plan
from omni_console.engine.runner import GenerateRequest
from omni_console.offload.errors import PolicyError
from omni_console.offload.events import StagingEvent, StepTiming
from omni_console.offload.policy import build_policy

PROMPT = "a lighthouse on a cliff at dusk"
SEED = 11
UNET_LISTS = ["down_blocks", "mid_block", "up_blocks"]

# (components, resident blocks, mode, placement, slots): all streamed, some resident (leading, spread, a
# deeper ring), every block resident, and no offload at all
POLICIES = [
    ({}, 0, "dlo", "leading", 2),
    ({"default": False}, 2, "dlo", "leading", 2),
    ({"vae": False}, 2, "dlo", "spread", 3),
    ({}, 5, "dlo", "leading", 2),
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


def _block_bytes_from_files(path: Path) -> dict[str, list[int]]:
    """Bytes per block of each UNet block list, summed from the tensors the file holds."""
    sizes: dict[str, dict[int, int]] = {attr: {} for attr in UNET_LISTS}
    with safe_open(str(path / "unet" / "diffusion_pytorch_model.safetensors"), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            head, _, rest = key.partition(".")
            if head not in sizes:
                continue
            index = 0 if head == "mid_block" else int(rest.split(".")[0])
            tensor = f.get_tensor(key)
            sizes[head][index] = sizes[head].get(index, 0) + tensor.numel() * tensor.element_size()
    return {attr: [found[i] for i in sorted(found)] for attr, found in sizes.items()}


@pytest.mark.parametrize("builder", ["sd15", "sdxl"])
def test_the_unet_is_its_own_role_with_its_blocks_in_execution_order(request, builder):
    path = request.getfixturevalue(f"{builder}_dir")
    model = discover_model(path)
    unet = model.component("unet")
    assert unet.role == "unet" and model.denoisers == [unet] and model.dits == []
    assert [b.attr for b in unet.block_lists] == UNET_LISTS  # down, mid, up: not __init__'s down, up, mid
    from_files = _block_bytes_from_files(path)
    assert {b.attr: list(b.block_bytes) for b in unet.block_lists} == from_files
    assert unet.non_block_bytes == unet.nbytes - sum(sum(v) for v in from_files.values()) > 0
    assert model.num_dit_blocks == sum(len(v) for v in from_files.values())
    sizes = [n for b in unet.block_lists for n in b.block_bytes]
    assert max(sizes) > 3 * min(sizes)  # blocks of very different sizes, as in the real checkpoints


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
            policy = build_policy(comps, layers, mode, placement, slots)
            engine.load(policy)
            streamer = engine.placement.streamer if engine.placement else None
            streamed = streamer.num_streamed if streamer is not None else 0
            assert streamed == (0 if mode == "resident" else 5 - layers), policy
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


def test_sdxl_blocks_stream_every_step_without_a_synchronous_fetch(sdxl_dir: Path):
    engine = Engine(sdxl_dir, device="cpu")
    sub = engine.bus.subscribe()
    try:
        engine.load(build_policy({}, 1, "dlo", "spread", 2))
        planned = [f"{b.dit}.{b.attr}.{b.index}" for b in engine.plan.blocks if b.streamed]
        engine.generate(replace(_request("sdxl"), steps=3))
        events = sub.drain()
    finally:
        engine.close()
    steps = [e for e in events if isinstance(e, StepTiming)]
    assert len(steps) == 3
    per_step, _ = _unet_staging(events)
    assert len(per_step) == 2  # the copies made during steps 2 and 3 (the last step's trail is the next's)
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
    with pytest.raises(PolicyError, match=r"between 0 and 5 \(the model's UNet blocks\)"):
        make_plan(model, build_policy({}, 6))


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
            engine.load(build_policy(comps, layers, mode, placement, slots))
            sub.drain()
            result = engine.generate(req)
            per_step, _ = _unet_staging(sub.drain())
            engine.unload()
            assert np.array_equal(result.image, expected), (comps, layers, mode, placement, slots)
            assert not [e for copies in per_step for e in copies if e.sync], (comps, layers, mode, placement, slots)
    finally:
        engine.close()
