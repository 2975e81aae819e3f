"""Pipelines that make audio only (ACE-Step here; Stable Audio, AudioLDM 2 alike): their `audios` are written as
a `.wav` of exactly the pipeline's float32 samples, or a 16-bit `.flac`; any picture suffix is refused before load,
and so is an audio suffix for a model that makes pictures. The waveform is plain diffusers' under every policy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_families_audio import ACE_STEP_CALL, build_tiny_ace_step

from omni_console.engine.engine import Engine
from omni_console.engine.running.runner import GenerateRequest

PROMPT = "a dog barking"


@pytest.fixture(scope="module")
def ace_step_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_ace_step(tmp_path_factory.mktemp("audio") / "ace-step")


def _plain_audio(path: Path, steps: int, seed: int) -> np.ndarray:
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt=PROMPT, num_inference_steps=steps, guidance_scale=3.0, output_type="np",
               generator=torch.Generator().manual_seed(seed), **ACE_STEP_CALL)
    return np.asarray(out.audios[0], dtype=np.float32)


def _decoded(path: Path) -> tuple[np.ndarray, int]:
    import av

    with av.open(str(path)) as container:
        (stream,) = container.streams.audio
        chunks = [frame.to_ndarray() for frame in container.decode(audio=0)]
        channels, rate = stream.codec_context.channels, stream.rate
    packed = np.concatenate(chunks, axis=-1).reshape(-1, channels)  # packed formats: channels interleaved
    return packed.T, rate


def _run(path: Path, out: Path, *extra: str) -> int:
    from omni_console.console.cli import main

    return main(["run", "--model", str(path), "--prompt", PROMPT, "--steps", "2", "--seed", "7", "--guidance", "3",
                 "--param", "lyrics=" + ACE_STEP_CALL["lyrics"], "--param", "audio_duration=8.0",
                 "--param", "max_text_length=32", "--output", str(out), *extra])


@pytest.mark.slow  # two runs and a plain pipeline call
def test_run_writes_the_pipelines_audio_exactly_as_wav_and_16_bit_as_flac(ace_step_dir, tmp_path, capsys):
    expected = _plain_audio(ace_step_dir, 2, 7)
    assert expected.ndim == 2 and float(np.abs(expected).max()) > 0
    wav, flac = tmp_path / "a.wav", tmp_path / "a.flac"
    assert _run(ace_step_dir, wav) == 0, capsys.readouterr().err
    shown = capsys.readouterr().out
    samples, rate = _decoded(wav)
    assert rate == 4 and samples.dtype == np.float32 and np.array_equal(samples, expected)
    assert (f"note: a.wav: the pipeline's 2-channel audio, {expected.shape[1]} samples "
            f"({expected.shape[1] / 4:.2f} s) at 4 Hz, as 32-bit float PCM (the pipeline's samples exactly)") in shown
    assert _run(ace_step_dir, flac) == 0, capsys.readouterr().err
    samples, rate = _decoded(flac)
    pcm = (np.clip(expected, -1.0, 1.0) * 32767.0).astype(np.int16)
    assert rate == 4 and np.array_equal(samples, pcm)


@pytest.mark.slow  # six loads and requests, and a plain pipeline call
def test_the_waveform_is_plain_diffusers_under_every_policy(ace_step_dir):
    from test_new_families import policies

    expected = _plain_audio(ace_step_dir, 2, 7)
    request = GenerateRequest(prompt=PROMPT, steps=2, seed=7, guidance=3.0, output_type="np",
                              params=dict(ACE_STEP_CALL))
    engine = Engine(ace_step_dir, device="cpu")
    try:
        for policy in policies(engine):
            engine.load(policy)
            result = engine.generate(request)
            engine.unload()
            assert not result.frames and result.audio is not None, policy
            assert result.audio.sample_rate == 4 and np.array_equal(result.audio.samples, expected), policy
    finally:
        engine.close()


@pytest.mark.parametrize(("model", "suffix", "line"), [
    ("ace", ".png", "this model makes audio only (use .wav or .flac; not '.png')"),
    ("ace", ".mp4", "this model makes audio only (use .wav or .flac; not '.mp4')"),
    ("demo", ".wav", ".wav is for audio and this model makes images"),
])
def test_a_suffix_the_result_cannot_be_is_refused_before_load(model, suffix, line, ace_step_dir, demo_model_dir,
                                                               tmp_path, monkeypatch, capsys):
    from omni_console.console.cli import main

    loads: list[str] = []
    monkeypatch.setattr(Engine, "load", lambda self, *a, **k: loads.append("load"))
    path = ace_step_dir if model == "ace" else demo_model_dir
    out = tmp_path / f"o{suffix}"
    capsys.readouterr()
    code = main(["run", "--model", str(path), "--prompt", PROMPT, "--steps", "1", "--output", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and loads == [] and len(err) == 1 and not out.exists()
    assert err[0].endswith(f"--output '{out}': {line}"), err


def test_the_console_names_an_audio_only_result_wav_and_writes_its_exact_samples(tmp_path):
    """The console's own output names: `.wav` for a pipeline that makes audio only, `.png`/`.mp4` otherwise;
    `save_result` writes an audio-only result's samples under a new name, as it writes images."""
    from types import SimpleNamespace

    from omni_console.console.outputs import save_result
    from omni_console.console.request_commands import free_output
    from omni_console.engine.running.audio_track import AudioTrack

    assert free_output(tmp_path, "AceStepPipeline", 3).suffix == ".wav"
    assert free_output(tmp_path, "FluxPipeline", 3).suffix == ".png"
    assert free_output(tmp_path, "WanPipeline", 3).suffix == ".mp4"
    samples = np.random.default_rng(1).uniform(-1, 1, (2, 300)).astype(np.float32)
    result = SimpleNamespace(frames=[], image=None, is_video=False, audio=AudioTrack(samples, 8000))
    path = save_result(result, tmp_path, 3)
    assert path.suffix == ".wav" and path.parent == tmp_path.resolve()
    decoded, rate = _decoded(path)
    assert rate == 8000 and np.array_equal(decoded, samples)
