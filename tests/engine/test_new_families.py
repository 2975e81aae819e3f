"""Families plain diffusers runs that the engine refused (issue "Trust 3", A4), built as diffusers' own fast
tests build them and compared with plain `DiffusionPipeline.from_pretrained(dir)` + `__call__`.

Each runs bit-identical under the five policies the other family tests use (DLO with 0 resident blocks,
DLO with one and the VAE unstaged, all blocks resident, spread placement, resident mode), and with its text
encoders streamed layer by layer. The engine's
request carries only what the CLI can pass; what plain diffusers' tests add by hand (PixArt's
`use_resolution_binning=False`) the engine must choose itself.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_families_loading import stand_in_for_ftfy
from tiny_families_new import NEW_GENERATION, PLAIN_EXTRA, build_tiny_new_family

from omni_console.engine.engine import Engine
from omni_console.engine.running.call_options import check_call
from omni_console.engine.running.request_checks import check_request
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.events import LogEvent
from omni_console.offload.policy import build_policy

PROMPT = "a red fox running in the snow"


@pytest.fixture(scope="module")
def new_dir(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("new-families")
    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = build_tiny_new_family(family, root / family)
        return built[family]

    return get


@pytest.fixture(autouse=True)
def without_ftfy(monkeypatch: pytest.MonkeyPatch) -> None:
    """PRX cleans prompts with `ftfy` (plain diffusers fails alike without it)."""
    stand_in_for_ftfy(monkeypatch, "diffusers.pipelines.prx.pipeline_prx")


def family_request(family: str, pipeline_class: str, generation: dict | None = None,
                   image: Path | None = None) -> GenerateRequest:
    """The family's small request; a guidance scale and a negative prompt where the pipeline takes them
    (HunyuanVideo 1.5 takes its guidance from its guider)."""
    from omni_console.engine.running.call_options import call_signature

    signature = call_signature(pipeline_class)
    gen = dict((NEW_GENERATION if generation is None else generation)[family])
    frames = gen.pop("num_frames", None)
    return GenerateRequest(prompt=PROMPT, steps=gen.pop("num_inference_steps"), height=gen.pop("height"),
                           width=gen.pop("width"), seed=7, frames=frames,
                           guidance=3.0 if "guidance_scale" in signature else None,
                           negative_prompt="blurry" if "negative_prompt" in signature else None,
                           max_sequence_length=gen.pop("max_sequence_length", None), output_type="np", extra=gen,
                           image=image)


def registered_t5gemma() -> None:
    """diffusers' prx package sets `transformers.T5GemmaEncoder` on the `transformers` module it imported;
    transformers 5.25 may replace `sys.modules["transformers"]` while that package imports its modeling
    code, so the name can be missing on the module plain diffusers' loader looks it up in. Set it there
    as the package does (the same diffusers class)."""
    import sys

    from diffusers.pipelines import prx

    if getattr(sys.modules["transformers"], "T5GemmaEncoder", None) is None:
        sys.modules["transformers"].T5GemmaEncoder = prx.T5GemmaEncoder


def plain_output(path: Path, family: str, request: GenerateRequest,
                 plain_extra: dict | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Plain diffusers' frames (or image) and, for a pipeline that returns audio, the first item's waveform."""
    from diffusers import DiffusionPipeline

    registered_t5gemma()
    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(**request.call_kwargs(pipe), **(PLAIN_EXTRA if plain_extra is None else plain_extra).get(family, {}))
    audio = getattr(out, "audio", None)
    if hasattr(out, "frames"):  # [batch][frame], or one video's frames unbatched (SANA-WM: a 4-d array)
        frames = out.frames if np.asarray(out.frames[0]).ndim == 3 else out.frames[0]
    return (np.asarray(frames if hasattr(out, "frames") else out.images),
            None if audio is None else audio[0].float().numpy())


def policies(engine: Engine) -> list:
    """Streamed with 0 or 1 resident blocks, every block resident, spread placement, resident mode, encoders
    streamed layer by layer (with two denoisers, "every block" is what one forward runs)."""
    from omni_console.engine.planning.experts import blocks_per_forward

    vae = next(c.name for c in engine.model.components if c.role == "vae")
    every = blocks_per_forward(engine.model)
    return [build_policy({}, 0), build_policy({"default": False}, 1), build_policy({vae: False}, every),
            build_policy({}, 1, placement="spread"), build_policy({}, 0, mode="resident"),
            build_policy({}, 0, stream_encoders="on")]


def assert_bit_identical(path: Path, family: str, generation: dict | None = None,
                         plain_extra: dict | None = None, image: Path | None = None) -> list[str]:
    """Every policy's output equals plain diffusers'; returns the engine's log lines. `generation` and
    `plain_extra`: another module's family tables (this module's by default)."""
    engine = Engine(path, device="cpu")
    sub = engine.bus.subscribe()
    request = family_request(family, engine.model.pipeline_class, generation, image)
    check_request(engine.model, request)
    check_call(engine.model, request)
    denoisers = engine.model.denoisers
    assert denoisers and all(d.num_blocks >= 2 and d.block_lists for d in denoisers)  # found, so streamed
    expected, expected_audio = plain_output(path, family, request, plain_extra)
    assert float(expected.std()) > 0
    try:
        for policy in policies(engine):
            engine.load(policy)
            result = engine.generate(request)
            engine.unload()
            got = np.stack(result.frames) if result.is_video else np.asarray(result.image)[None]
            assert got.size == expected.size and np.array_equal(got.reshape(expected.shape), expected), policy
            if expected_audio is None:
                assert result.audio is None
            else:  # the waveform too, bit for bit
                assert result.audio is not None and np.array_equal(result.audio.samples, expected_audio), policy
    finally:
        engine.close()
    return [e.message for e in sub.drain() if isinstance(e, LogEvent)]


@pytest.mark.slow  # six loads and requests
def test_pixart_sigma_without_a_binning_table_runs_as_diffusers_runs_it(new_dir):
    """Transformer sample_size 8 (diffusers' fast test): no binning table, so binning is off, as there."""
    assert_bit_identical(new_dir("pixart_sigma_8"), "pixart_sigma_8")


@pytest.mark.slow  # six loads and requests
def test_prx_with_its_t5gemma_encoder_runs_as_diffusers_runs_it(new_dir):
    """PRX names `["transformers", "T5GemmaEncoder"]`, a class diffusers' prx package registers there."""
    path = new_dir("prx")
    model = Engine(path, device="cpu").model
    encoder = model.component("text_encoder")
    assert encoder.role == "encoder" and encoder.class_name == "T5GemmaEncoder"
    layers = encoder.layers  # streamable layer by layer
    assert layers is not None and layers.attr == "layers" and len(layers.block_bytes) == 3
    logs = assert_bit_identical(path, "prx")
    assert any(line.startswith("text_encoder: streamed layer by layer (3 layers") for line in logs), logs


@pytest.mark.slow  # six loads and requests
def test_hunyuan_video15_with_its_guider_runs_as_diffusers_runs_it(new_dir):
    """HunyuanVideo 1.5's `guider` (ClassifierFreeGuidance) is a diffusers class with a config and no weights."""
    path = new_dir("hunyuan_video15")
    model = Engine(path, device="cpu").model
    guider = model.component("guider")
    assert guider.role == "other" and guider.class_name == "ClassifierFreeGuidance" and not guider.files
    assert_bit_identical(path, "hunyuan_video15")


@pytest.mark.slow  # six loads and requests
def test_ltx2_with_its_own_package_classes_runs_as_diffusers_runs_it(new_dir):
    """LTX-2's connectors and vocoder are classes of diffusers' ltx2 package (`["ltx2", ...]`)."""
    path = new_dir("ltx2")
    model = Engine(path, device="cpu").model
    assert {c.name: c.library for c in model.components}["connectors"] == "ltx2"
    assert_bit_identical(path, "ltx2")  # frames and audio


def _ltx2_run(path: Path, out: Path, *extra: str) -> int:
    from omni_console.console.cli import main

    return main(["run", "--model", str(path), "--prompt", PROMPT, "--steps", "2", "--height", "32", "--width", "32",
                 "--frames", "5", "--max-sequence-length", "16", "--seed", "7", "--output", str(out), *extra])


@pytest.mark.slow  # a CLI run and a plain pipeline call
def test_ltx2_mp4_carries_its_video_and_the_pipelines_audio(new_dir, tmp_path, capsys):
    """`run` writes LTX-2's audio as the MP4's second stream: at the vocoder's rate, the pipeline's channels,
    and decoded, exactly the pipeline's samples made 16-bit as diffusers' `encode_video` makes them; the video
    at the frame rate the pipeline timed the audio by (`--param frame_rate`)."""
    from fractions import Fraction

    import av
    from diffusers import DiffusionPipeline

    path = new_dir("ltx2")
    out = tmp_path / "v.mp4"
    code = _ltx2_run(path, out, "--param", "frame_rate=12.5")
    shown = capsys.readouterr()
    assert code == 0, shown.err
    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    plain = pipe(prompt=PROMPT, num_inference_steps=2, height=32, width=32, num_frames=5, max_sequence_length=16,
                 frame_rate=12.5, generator=torch.Generator().manual_seed(7), output_type="np")
    samples = plain.audio[0].float()
    pcm = (torch.clip(samples, -1.0, 1.0) * 32767.0).to(torch.int16).numpy()  # diffusers' _write_audio
    rate = pipe.vocoder.config.output_sampling_rate
    with av.open(str(out)) as container:
        (video,), (audio,) = container.streams.video, container.streams.audio
        assert video.frames == 5 and video.average_rate == Fraction(25, 2) and audio.codec_context.name == "flac"
        assert (audio.rate, audio.codec_context.channels) == (rate, pcm.shape[0])
        decoded = np.concatenate([f.to_ndarray() for f in container.decode(audio)], axis=-1)
    assert np.array_equal(decoded.reshape(-1, pcm.shape[0]).T, pcm)  # packed s16: channels interleaved
    assert (f"note: v.mp4: with the pipeline's {pcm.shape[0]}-channel audio, {pcm.shape[1]} samples at "
            f"{rate} Hz, as 16-bit FLAC (lossless)") in shown.out


@pytest.mark.slow  # a CLI run
def test_ltx2_audio_dropped_by_a_gif_says_so(new_dir, tmp_path, capsys):
    out = tmp_path / "v.gif"
    code = _ltx2_run(new_dir("ltx2"), out)
    shown = capsys.readouterr()
    assert code == 0 and out.is_file(), shown.err
    assert "note: v.gif: the pipeline's 2-channel audio, " in shown.out
    assert "is not kept (only an .mp4 output carries it)" in shown.out


def test_pixart_binning_forced_on_without_a_table_is_refused_before_load(new_dir, tmp_path, monkeypatch, capsys):
    from omni_console.console.cli import main

    path = new_dir("pixart_sigma_8")
    capsys.readouterr()
    loads: list[str] = []
    monkeypatch.setattr(Engine, "load", lambda self, *a, **k: loads.append("load"))
    out = tmp_path / "p.png"
    code = main(["run", "--model", str(path), "--prompt", PROMPT, "--steps", "1", "--height", "8", "--width", "8",
                 "--param", "use_resolution_binning=true", "--output", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and loads == [] and len(err) == 1 and not out.exists()
    assert err[0].endswith("--param use_resolution_binning=True: PixArtSigmaPipeline's resolution binning has no "
                           "table for a transformer sample_size of 8 (it has for 32, 64, 128, 256); leave it off to "
                           "render the size asked for")


def test_pixart_run_writes_the_size_asked_for(new_dir, tmp_path, capsys):
    from PIL import Image

    from omni_console.console.cli import main

    out = tmp_path / "p.png"
    code = main(["run", "--model", str(new_dir("pixart_sigma_8")), "--prompt", PROMPT, "--steps", "1",
                 "--height", "16", "--width", "24", "--output", str(out)])
    assert code == 0, capsys.readouterr().err
    assert Image.open(out).size == (24, 16)


def test_prx_encoder_is_diffusers_own_class_and_read_by_its_own_from_pretrained(new_dir):
    """`["transformers", "T5GemmaEncoder"]` resolves to the class diffusers' prx package defines (it builds
    from the composite config's `encoder` part), so it is never built over an arena from the raw config."""
    from omni_console.engine.loading.arena_load import supports_arena_load
    from omni_console.engine.model_dir.discovery import discover_model
    from omni_console.engine.model_dir.trusted_classes import component_class

    encoder = discover_model(new_dir("prx")).component("text_encoder")
    cls = component_class("transformers", "T5GemmaEncoder", "here")
    assert cls.__module__ == "diffusers.pipelines.prx"
    assert supports_arena_load(encoder) == "T5GemmaEncoder loads through its own from_pretrained"


@pytest.mark.parametrize(("library", "name", "accepted"), [
    ("transformers", "T5GemmaEncoder", True),  # registered there by diffusers' prx package
    ("prx", "T5GemmaEncoder", True),  # the same class, named by its package
    ("transformers", "T5GemmaEncoderX", False),
    ("transformers", "PRXPipeline", False),
    ("prx", "T5GemmaConfig", False),  # prx imports it; defined elsewhere
    (["transformers"], "T5GemmaEncoder", False),  # hostile JSON: one line, never a TypeError
    ("transformers", ["T5GemmaEncoder"], False),
    ({"a": 1}, None, False),
])
def test_only_diffusers_own_registered_class_widens_transformers(library, name, accepted):
    from omni_console.engine.errors import ModelDirError
    from omni_console.engine.model_dir.trusted_classes import check_component

    try:
        ref = check_component(library, name, "model_index.json: 'text_encoder'")
    except ModelDirError:
        assert not accepted
    else:
        assert accepted and ref.kind == "weights" and ref.module == "diffusers.pipelines.prx"


def test_a_class_in_a_pipeline_package_init_is_a_valid_cache_entry():
    """The class-index cache keeps the prx answer (module `diffusers.pipelines.prx` itself) and still refuses
    a module outside that package."""
    from omni_console.engine.model_dir.class_index_cache import valid_entry

    ref = {"module": "diffusers.pipelines.prx", "kind": "weights", "is_class": True}
    assert valid_entry("package_class|prx|T5GemmaEncoder", ref)
    assert valid_entry("package_class|prx|T5GemmaEncoder", {**ref, "module": "diffusers.pipelines.prx.pipeline_prx"})
    for module in ("diffusers.pipelines.prxx", "diffusers.pipelines", "transformers.models.t5gemma"):
        assert not valid_entry("package_class|prx|T5GemmaEncoder", {**ref, "module": module})


@pytest.mark.parametrize("rate", ["5000", "0.001"])
def test_a_pipeline_frame_rate_no_writer_can_hold_is_refused_before_load(rate, new_dir, tmp_path, monkeypatch,
                                                                          capsys):
    """The video is written at `--param frame_rate` (LTX-2 times its audio by it): --fps's bounds apply."""
    path = new_dir("ltx2")
    capsys.readouterr()
    loads: list[str] = []
    monkeypatch.setattr(Engine, "load", lambda self, *a, **k: loads.append("load"))
    code = _ltx2_run(path, tmp_path / "v.mp4", "--param", f"frame_rate={rate}")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and loads == [] and len(err) == 1 and not (tmp_path / "v.mp4").exists()
    assert err[0].endswith(f"--param frame_rate={float(rate):g}: the video is written at this rate, so it must be "
                           "between 0.01 and 1000 frames per second (or give --fps)")


def test_prx_without_ftfy_is_refused_before_load_as_plain_diffusers_fails_after(new_dir, tmp_path, monkeypatch,
                                                                                capsys):
    """PRX cleans every prompt with `ftfy` (imported only when installed): without it, one line and exit 2
    before anything loads, where plain diffusers fails with a NameError after loading."""
    import diffusers.pipelines.prx.pipeline_prx as prx_module
    from diffusers import DiffusionPipeline

    from omni_console.console.cli import main

    path = new_dir("prx")
    monkeypatch.delattr(prx_module, "ftfy", raising=False)  # as on a machine without ftfy
    capsys.readouterr()
    loads: list[str] = []
    monkeypatch.setattr(Engine, "load", lambda self, *a, **k: loads.append("load"))
    out = tmp_path / "p.png"
    code = main(["run", "--model", str(path), "--prompt", PROMPT, "--steps", "1", "--height", "32", "--width", "32",
                 "--param", "use_resolution_binning=false", "--output", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and loads == [] and len(err) == 1 and not out.exists()
    assert err[0].endswith("PRXPipeline cleans every prompt with ftfy, which is not installed (pip install ftfy); "
                           "plain diffusers fails alike, after loading")
    registered_t5gemma()
    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    with pytest.raises(NameError, match="ftfy"):
        pipe(prompt=PROMPT, num_inference_steps=1, height=32, width=32, use_resolution_binning=False)


def test_only_pipelines_that_call_ftfy_unchecked_need_it():
    """Read from diffusers' own source: PRX, Wan image-to-video and SkyReels-V2 call it on every prompt; Wan,
    PixArt and Sana ask whether it is installed first."""
    import importlib.util

    from omni_console.engine.running.pipeline_needs import _unguarded_names

    def needs(module: str) -> bool:
        return "ftfy" in {g.package for g in _unguarded_names(Path(importlib.util.find_spec(module).origin))}

    for module in ("prx.pipeline_prx", "wan.pipeline_wan_i2v", "skyreels_v2.pipeline_skyreels_v2"):
        assert needs(f"diffusers.pipelines.{module}")
    for module in ("wan.pipeline_wan", "pixart_alpha.pipeline_pixart_sigma", "sana.pipeline_sana"):
        assert not needs(f"diffusers.pipelines.{module}")
