"""Further diffusers families through the engine against plain `DiffusionPipeline.from_pretrained(dir)`:
SD3.5, PixArt-Alpha, Bria, CogView4, Lumina-Next, Latte, LTX condition, SkyReels-V2, Wan VACE, aMUSEd,
HunyuanDiT and SanaVideo (Kandinsky 3, whose UNet class is not streamed, is checked for its plan note;
Allegro, which plain diffusers cannot decode, for its refusal).

Each is bit-identical to the plain pipeline under the five policies the other family tests use, its DiT's
blocks are found and streamed, and after each request's first step the ring never misses a block (no
synchronous fetch): Latte interleaves its spatial and temporal block lists block by block, which the
streamer follows once the first forward has shown it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_families_loading import stand_in_for_ftfy
from tiny_families_more import LATTE_FRAMES, MORE_GENERATION, build_tiny_more_family

from omni_console.engine.engine import Engine
from omni_console.engine.errors import ConfigError
from omni_console.engine.events import StepTiming
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.running.call_options import check_call
from omni_console.engine.running.request_checks import check_request
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.events import LogEvent
from omni_console.offload.policy import build_policy

PROMPT = "a red fox running in the snow"
FAMILIES = ("sd35", "pixart_alpha", "bria", "cogview4", "lumina", "latte", "ltx_condition", "skyreels_v2", "wan_vace",
            "amused", "hunyuan_dit", "sana_video")
FTFY_MODULES = ("diffusers.pipelines.skyreels_v2.pipeline_skyreels_v2", "diffusers.pipelines.wan.pipeline_wan_vace")


@pytest.fixture(scope="module")
def more_dir(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("more-families")
    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = build_tiny_more_family(family, root / family)
        return built[family]

    return get


@pytest.fixture(autouse=True)
def without_ftfy(monkeypatch: pytest.MonkeyPatch) -> None:
    """SkyReels-V2 and Wan VACE clean prompts with `ftfy` (plain diffusers fails alike without it)."""
    stand_in_for_ftfy(monkeypatch, *FTFY_MODULES)


def family_request(family: str) -> GenerateRequest:
    gen = dict(MORE_GENERATION[family])
    frames = gen.pop("num_frames", None) or gen.pop("video_length", None) or gen.pop("frames", None)
    return GenerateRequest(prompt=PROMPT, steps=gen.pop("num_inference_steps"), height=gen.pop("height"),
                           width=gen.pop("width"), seed=7, guidance=3.0, frames=frames, negative_prompt="blurry",
                           max_sequence_length=gen.pop("max_sequence_length", None), output_type="np", extra=gen)


def plain_output(path: Path, request: GenerateRequest) -> np.ndarray:
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(**request.call_kwargs(pipe))
    return np.asarray(out.frames[0] if hasattr(out, "frames") else out.images)


@pytest.mark.slow  # five loads and requests per family
@pytest.mark.parametrize("family", FAMILIES)
def test_family_is_bit_identical_to_from_pretrained(family: str, more_dir):
    path = more_dir(family)
    request = family_request(family)
    engine = Engine(path, device="cpu")
    check_request(engine.model, request)
    check_call(engine.model, request)
    (dit,) = engine.model.dits
    assert dit.num_blocks >= 2 and dit.block_lists  # found, so streamed
    expected = plain_output(path, request)
    assert float(expected.std()) > 0
    sub = engine.bus.subscribe()
    layers = dit.num_blocks
    vae = next(c.name for c in engine.model.components if c.role == "vae")  # aMUSEd's is `vqvae`
    policies = [build_policy({}, 0), build_policy({"default": False}, 1), build_policy({vae: False}, layers),
                build_policy({}, 1, placement="spread"), build_policy({}, 0, mode="resident")]
    try:
        for policy in policies:
            engine.load(policy)
            result = engine.generate(request)
            engine.unload()
            got = np.stack(result.frames) if result.is_video else np.asarray(result.image)[None]
            assert got.size == expected.size and np.array_equal(got.reshape(expected.shape), expected), policy
    finally:
        engine.close()
    events = sub.drain()
    late = [(s.step, s.sync_fetches) for s in events if isinstance(s, StepTiming) and s.step > 1 and s.sync_fetches]
    assert late == []
    interleaved = [e for e in events if isinstance(e, LogEvent) and "interleaves its block lists" in e.message]
    assert bool(interleaved) == (family == "latte")


def test_latte_renders_one_frame_or_its_tables_length(more_dir):
    model = discover_model(more_dir("latte"))
    for frames in (1, LATTE_FRAMES):
        check_call(model, GenerateRequest(prompt=PROMPT, frames=frames))
    with pytest.raises(ConfigError) as refused:
        check_call(model, GenerateRequest(prompt=PROMPT, frames=3), {"frames": "--frames"})
    assert str(refused.value) == (f"--frames 3: LattePipeline renders 1 or {LATTE_FRAMES} frames (its transformer's "
                                  f"temporal position table holds video_length = {LATTE_FRAMES} frames)")


@pytest.mark.slow  # two plain pipeline calls
def test_latte_frame_counts_against_plain_diffusers(more_dir):
    """What plain diffusers does with the counts the rule refuses (fails) and takes (renders them)."""
    from diffusers import DiffusionPipeline

    path = more_dir("latte")
    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    gen = {**MORE_GENERATION["latte"], "num_inference_steps": 1}
    for frames, renders in ((1, True), (3, False), (LATTE_FRAMES, True)):
        try:
            out = pipe(prompt=PROMPT, output_type="np", generator=torch.Generator().manual_seed(0),
                       **{**gen, "video_length": frames})
            shape = np.asarray(out.frames[0]).shape[0]
        except RuntimeError:
            shape = None
        assert (shape == frames) == renders, (frames, shape)


def test_a_denoiser_that_is_not_streamed_says_so(more_dir):
    """Kandinsky 3's UNet is of a class no role rule streams: the plan says it stays whole on the device
    instead of showing it resident without a word; a DiT whose weights hold no block list says the same."""
    from omni_console.engine.model_dir.discovery import unstreamed_denoiser_notes
    from omni_console.engine.planning.plan import make_plan

    model = discover_model(more_dir("kandinsky3"))
    unet = model.component("unet")
    assert unet.role == "other" and not unet.block_lists
    assert model.notes == ("unet (Kandinsky3UNet): the pipeline's denoiser, of a class DLO does not stream: it stays "
                           "on the device whole",)
    assert {c.info.name: c.residency for c in make_plan(model, build_policy({}, 0)).components}["unet"] == "resident"
    assert unstreamed_denoiser_notes("transformer", "dit", "diffusers", "FooTransformer2DModel", ()) == [
        "transformer (FooTransformer2DModel): no block list of two or more repeated blocks in its weights, so "
        "nothing of it is streamed: it stays on the device whole"]
    assert unstreamed_denoiser_notes("controlnet", "other", "diffusers", "ControlNetModel", ()) == []


def test_allegro_is_refused_before_load_as_plain_diffusers_fails(more_dir, tmp_path, monkeypatch, capsys):
    """Allegro's VAE decodes only with tiling, which from_pretrained leaves off: one line, exit 2, nothing loaded."""
    from diffusers import DiffusionPipeline

    from omni_console.console.cli import main

    path = more_dir("allegro")
    capsys.readouterr()  # the build's progress bars
    loads: list[str] = []
    monkeypatch.setattr(Engine, "load", lambda self, *a, **k: loads.append("load"))
    code = main(["run", "--model", str(path), "--prompt", PROMPT, "--steps", "1", "--height", "16", "--width", "16",
                 "--frames", "8", "--max-sequence-length", "16", "--output", str(tmp_path / "v.mp4")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and loads == [] and len(err) == 1
    assert err[0].endswith("vae (AutoencoderKLAllegro): decodes only with tiling, which from_pretrained leaves off, "
                           "so AllegroPipeline fails at its VAE decode (plain diffusers too); not supported here")
    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    with pytest.raises(NotImplementedError, match="Decoding without tiling"):
        pipe(**family_request("allegro").call_kwargs(pipe))


@pytest.mark.slow  # one plain pipeline call per frame count and size
def test_sana_video_frames_and_sizes_as_plain_diffusers_renders_them(more_dir):
    """SanaVideo names its frame count `frames` (taken by --frames); it renders 4k+1 frames (its Wan VAE's
    temporal factor) and needs sides of a multiple of 32 (its check_inputs): accepted exactly where plain
    diffusers renders as asked."""
    from diffusers import DiffusionPipeline

    path = more_dir("sana_video")
    model = discover_model(path)
    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    gen = {**MORE_GENERATION["sana_video"], "num_inference_steps": 1}

    def accepted(**fields) -> bool:
        try:
            check_request(model, GenerateRequest(prompt=PROMPT, max_sequence_length=16, **fields))
            check_call(model, GenerateRequest(prompt=PROMPT, max_sequence_length=16, **fields))
        except ConfigError:
            return False
        return True

    def rendered(**overrides) -> tuple[int, ...] | None:
        try:
            out = pipe(prompt=PROMPT, output_type="np", generator=torch.Generator().manual_seed(0),
                       **{**gen, **overrides})
        except (RuntimeError, ValueError):
            return None
        return tuple(np.asarray(out.frames[0]).shape[:3])

    for frames in (1, 4, 5, 6, 9):
        assert accepted(frames=frames) == (rendered(frames=frames)[0] == frames), frames
    for side in (32, 48, 64):
        shape = rendered(height=side, width=side)
        assert accepted(height=side, width=side) == (shape == (gen["frames"], side, side)), (side, shape)
