"""Lumina2, Flux Kontext, AuraFlow and CogVideoX (at a frame count only its real rule allows) through the
engine against plain diffusers: bit-identical under the policies the other family tests use, and each
one's block order is the order its plain pipeline really runs the blocks in.

The oracle's call is written out by hand; its block order is recorded with hooks on the plain pipeline,
not read from anything the engine computes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_families import FAMILY_GENERATION
from tiny_families_shapes import SHAPE_GENERATION, build_tiny_auraflow, build_tiny_flux_kontext, build_tiny_lumina2

from omni_console.engine.engine import Engine
from omni_console.engine.events import BlockOrderCorrected, StepTiming
from omni_console.engine.running.call_options import check_call
from omni_console.engine.running.request_checks import check_request
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.policy import build_policy

PROMPT = "a lighthouse on a cliff at dusk"
SEED = 11


@pytest.fixture(scope="session")
def lumina2_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lumina2(tmp_path_factory.mktemp("models") / "lumina2", seed=0)


@pytest.fixture(scope="session")
def flux_kontext_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_flux_kontext(tmp_path_factory.mktemp("models") / "flux-kontext", seed=0)


@pytest.fixture(scope="session")
def auraflow_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_auraflow(tmp_path_factory.mktemp("models") / "auraflow", seed=0)


def family_request(family: str) -> GenerateRequest:
    """The request each family is compared on (CogVideoX at 8 frames: 8k, not 8k+1)."""
    if family == "cogvideox":
        gen = FAMILY_GENERATION["cogvideox"]
        return GenerateRequest(prompt=PROMPT, steps=2, height=gen["height"], width=gen["width"], seed=SEED,
                               guidance=3.0, frames=8, max_sequence_length=gen["max_sequence_length"],
                               output_type="np")
    gen = SHAPE_GENERATION[family]
    params = {"max_area": gen["max_area"]} if "max_area" in gen else {}
    return GenerateRequest(prompt=PROMPT, steps=gen["num_inference_steps"], height=gen["height"],
                           width=gen["width"], seed=SEED, guidance=4.0, max_sequence_length=gen["max_sequence_length"],
                           params=params, output_type="np")


# family: (fixture, pipeline class)
FAMILIES = {
    "lumina2": ("lumina2_model_dir", "Lumina2Pipeline"),
    "flux_kontext": ("flux_kontext_model_dir", "FluxKontextPipeline"),
    "auraflow": ("auraflow_model_dir", "AuraFlowPipeline"),
    "cogvideox": ("cogvideox_model_dir", "CogVideoXPipeline"),
}


def record_order(transformer: torch.nn.Module) -> tuple[list[str], list[torch.utils.hooks.RemovableHandle]]:
    """Block lists in the order the first forward calls their blocks (hooks on every ModuleList entry)."""
    calls: list[str] = []
    handles = []
    for name, child in transformer.named_children():
        if isinstance(child, torch.nn.ModuleList):
            for block in child:
                handles.append(block.register_forward_pre_hook(lambda *_, n=name: calls.append(n)))
    return calls, handles


def lists_in_call_order(calls: list[str], blocks_per_forward: int) -> list[str]:
    first = calls[:blocks_per_forward]
    return [name for i, name in enumerate(first) if i == 0 or first[i - 1] != name]


def plain_output(path: Path, pipeline_name: str, request: GenerateRequest) -> tuple[np.ndarray, list[str]]:
    """The plain diffusers pipeline, no offload, called with the arguments written out; and its block calls."""
    import diffusers

    pipe = getattr(diffusers, pipeline_name).from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"prompt": request.prompt, "num_inference_steps": request.steps, "height": request.height,
              "width": request.width, "guidance_scale": request.guidance,
              "max_sequence_length": request.max_sequence_length, "output_type": "np",
              "generator": torch.Generator("cpu").manual_seed(request.seed), **request.params}
    if request.frames is not None:
        kwargs["num_frames"] = request.frames
    calls, handles = record_order(pipe.transformer)
    output = pipe(**kwargs)
    for handle in handles:
        handle.remove()
    pixels = output.frames[0] if request.frames is not None else output.images
    return np.asarray(pixels), calls


@pytest.mark.slow  # three loads and four pipeline calls per family: ~15 s of CPU each
@pytest.mark.parametrize("family", list(FAMILIES))
def test_bit_identical_to_plain_diffusers_in_the_order_it_runs(request, family):
    fixture, pipeline_name = FAMILIES[family]
    path: Path = request.getfixturevalue(fixture)
    req = family_request(family)
    engine = Engine(path, device="cpu")
    check_request(engine.model, req)
    check_call(engine.model, req)  # the request is one the pipeline takes as it is
    expected, calls = plain_output(path, pipeline_name, req)
    count = len(expected) if req.frames is not None else 1
    assert expected.shape == (count, req.height, req.width, 3) and float(expected.std()) > 0
    if req.frames is not None:
        assert count == req.frames  # diffusers renders the count the engine accepted
    ran = lists_in_call_order(calls, engine.model.num_dit_blocks)

    sub = engine.bus.subscribe()
    policies = (({}, 0), ({"default": False}, 1), ({"vae": False}, engine.model.num_dit_blocks))
    for components, layers in policies:
        engine.load(build_policy(components, layers))
        result = engine.generate(req)
        engine.unload()
        got = np.stack(result.frames) if req.frames is not None else np.asarray(result.image)[None]
        assert np.array_equal(got, expected), (family, components, layers)
        (dit,) = engine.model.dits
        assert [b.attr for b in dit.block_lists] == ran  # the engine's order is the one that ran
        assert [b.attr for b in engine.plan.model.dits[0].block_lists] == ran
    engine.close()
    events = sub.drain()
    corrected = [e for e in events if isinstance(e, BlockOrderCorrected)]
    steps = [e for e in events if isinstance(e, StepTiming)]
    assert all(s.sync_fetches == 0 for s in steps if s.step > 1), [(s.step, s.sync_fetches) for s in steps]
    if family == "lumina2":  # registered noise_refiner first, runs context_refiner first
        assert ran == ["context_refiner", "noise_refiner", "layers"]
        assert len(corrected) <= 1  # once seen, the next load starts in the observed order
    else:
        assert corrected == []
