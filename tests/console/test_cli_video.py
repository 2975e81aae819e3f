"""`omni-console run` for video pipelines: every container from the CLI, the report's phases, and every
bad video option refused with one line and exit 2 before anything loads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import av
import numpy as np
import pytest
from cli_helpers import one_error_line
from PIL import Image

from omni_console.console.cli import main

pytestmark = pytest.mark.slow  # end to end (generates videos end to end): .ci/run runs it, `pytest -q` skips it

WAN_FAST = ["--height", "32", "--width", "32", "--steps", "2", "--max-sequence-length", "32"]
PHASES = {"text_encoding", "denoise", "vae_decode"}


def run_wan(wan_model_dir: Path, output: Path, *flags: str) -> int:
    return main(["run", "--model", str(wan_model_dir), "--output", str(output), *WAN_FAST, *flags])


def mp4_frames(path: Path) -> tuple[int, float, tuple[int, int]]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        count = sum(1 for _ in container.decode(stream))
        return count, float(stream.average_rate), (stream.width, stream.height)


def image_frames(path: Path) -> tuple[int, tuple[int, int], list[int]]:
    with Image.open(path) as image:
        durations = []
        for index in range(getattr(image, "n_frames", 1)):
            image.seek(index)
            image.load()
            durations.append(image.info.get("duration"))
        return getattr(image, "n_frames", 1), image.size, durations


def check_video_report(report: dict, frames: int, files: list[Path]) -> None:
    assert report["frames"] == frames and report["is_video"] is True
    assert report["files"] == [str(f) for f in files]
    assert set(report["phases"]) == PHASES and all(s > 0 for s in report["phases"].values())
    assert len(report["latent_shape"]) == 5  # batch, channels, latent frames, height, width
    if report["device"] == "cpu":
        assert report["vae_decode_peak_bytes"] is None
    else:
        assert report["vae_decode_peak_bytes"] > 0


# ---------------------------------------------------------------- containers


@pytest.mark.parametrize("frames", [5, 9])
def test_mp4_has_every_frame(wan_model_dir, wan_loadable, tmp_path, capsys, frames):
    out = tmp_path / "x.mp4"
    assert run_wan(wan_model_dir, out, "--frames", str(frames), "--json") == 0
    report = json.loads(capsys.readouterr().out)
    count, rate, size = mp4_frames(out)
    assert count == frames and size == (32, 32) and rate == report["fps"]
    assert report["fps_source"] == "pipeline" and report["output"] == str(out)
    check_video_report(report, frames, [out])


def test_fps_flag_sets_the_rate(wan_model_dir, wan_loadable, tmp_path, capsys):
    out = tmp_path / "slow.mp4"
    assert run_wan(wan_model_dir, out, "--frames", "5", "--fps", "8", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert mp4_frames(out)[:2] == (5, 8.0) and (report["fps"], report["fps_source"]) == (8.0, "--fps")


@pytest.mark.parametrize("suffix", [".gif", ".webp"])
def test_animations_have_every_frame(wan_model_dir, wan_loadable, tmp_path, capsys, suffix):
    out = tmp_path / f"x{suffix}"
    assert run_wan(wan_model_dir, out, "--frames", "5", "--fps", "10", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    count, size, durations = image_frames(out)
    assert count == 5 and size == (32, 32) and all(d == 100 for d in durations)
    check_video_report(report, 5, [out])


def test_png_writes_a_numbered_sequence(wan_model_dir, wan_loadable, tmp_path, capsys):
    out = tmp_path / "x.png"
    assert run_wan(wan_model_dir, out, "--frames", "5", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    names = [f"x-{i:04d}.png" for i in range(1, 6)]
    assert sorted(os.listdir(tmp_path)) == [".x.png.omni-frames.json", *names]  # the manifest; no x.png, no temp
    arrays = [np.asarray(Image.open(tmp_path / name)) for name in names]
    assert all(a.shape == (32, 32, 3) for a in arrays)
    assert len({a.tobytes() for a in arrays}) == 5  # five different frames, not one frame five times
    check_video_report(report, 5, [tmp_path / name for name in names])


def test_text_report_shows_where_the_time_went(wan_model_dir, wan_loadable, tmp_path, capsys):
    assert run_wan(wan_model_dir, tmp_path / "x.mp4", "--frames", "5") == 0
    captured = capsys.readouterr()
    for label in ("text encoding", "denoise", "VAE decode", "VAE decode peak", "frames", "5 (latents 1x",
                  "frame rate", "fps (pipeline)", f"wrote {tmp_path / 'x.mp4'}"):
        assert label in captured.out, label
    assert "request 1: 5 frames, latents 1x" in captured.err  # the progress line when the request ends


def test_image_to_video_with_a_conditioning_image(ltx_i2v_model_dir, tmp_path, capsys):
    image = tmp_path / "first.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(image)
    out = tmp_path / "i2v.mp4"
    assert main(["run", "--model", str(ltx_i2v_model_dir), "--image", str(image), "--frames", "9", "--height", "32",
                 "--width", "32", "--steps", "2", "--max-sequence-length", "16", "--output", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert mp4_frames(out)[0] == 9
    check_video_report(report, 9, [out])


def test_demo_image_run_is_unchanged(demo_model_dir, tmp_path, capsys):
    out = tmp_path / "still.png"
    assert main(["run", "--model", str(demo_model_dir), "--output", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert Image.open(out).size == (64, 64) and os.listdir(tmp_path) == ["still.png"]
    assert report["frames"] == 1 and report["is_video"] is False and report["fps"] is None
    assert report["files"] == [str(out)] and set(report["phases"]) == PHASES


# ---------------------------------------------------------------- refused before load


@pytest.mark.parametrize("flags,words", [
    (["--frames", "6"], "--frames 6: WanPipeline renders 4k+1 frames"),
    (["--frames", "0"], "--frames 0: must be at least 1"),
    (["--max-sequence-length", "0"], "--max-sequence-length 0: must be at least 1"),
    (["--param", "num_frame=3"], "--param num_frame: WanPipeline has no parameter num_frame (did you mean num_frames"),
    (["--param", "num_frames=5"], "--param num_frames: use --frames"),
    (["--param", "generator=1"], "--param generator: set by the engine itself"),
    (["--param", "attention_kwargs=3"], "--param attention_kwargs=3: WanPipeline takes dict"),
    (["--param", "no-equals-sign"], "--param 'no-equals-sign': expected KEY=VALUE"),
    (["--param", "a=1", "--param", "a=2"], "--param a: given twice"),
    (["--image", "missing.png"], "--image: WanPipeline takes no conditioning image"),
    (["--fps", "0"], "--fps 0.0: must be a positive finite number"),
    (["--fps", "nan"], "--fps nan: must be a positive finite number"),
    (["--fps", "-24"], "--fps -24.0: must be a positive finite number"),
    (["--frames", "five"], "argument --frames: 'five' is not a whole number"),
])
def test_bad_video_options_exit_2_before_load(wan_model_dir, tmp_path, capsys, loads, flags, words):
    out = tmp_path / "x.mp4"
    assert run_wan(wan_model_dir, out, *flags) == 2
    assert words in one_error_line(capsys)
    assert loads == [] and os.listdir(tmp_path) == []


@pytest.mark.parametrize("name,words", [("x.avi", "no image writer for '.avi'"),
                                        ("x.mp3", "no image writer for '.mp3'"),
                                        ("noext", "no file suffix")])
def test_bad_suffix_exit_2_before_load(wan_model_dir, tmp_path, capsys, loads, name, words):
    assert run_wan(wan_model_dir, tmp_path / name, "--frames", "5") == 2
    line = one_error_line(capsys)
    assert words in line and ".mp4" in line and loads == [] and os.listdir(tmp_path) == []


@pytest.mark.parametrize("flags,words", [
    (["--frames", "5"], "--frames: FluxPipeline takes no number of frames"),
    (["--output", "{tmp}/x.mp4"], ".mp4 is for videos and this model makes still images"),
    (["--fps", "8"], "--fps: FluxPipeline makes still images"),
])
def test_video_options_for_an_image_pipeline_exit_2(demo_model_dir, tmp_path, capsys, loads, flags, words):
    flags = [f.format(tmp=tmp_path) for f in flags]
    out = [] if "--output" in flags else ["--output", str(tmp_path / "o.png")]
    assert main(["run", "--model", str(demo_model_dir), *out, *flags]) == 2
    assert words in one_error_line(capsys)
    assert loads == [] and os.listdir(tmp_path) == []


@pytest.mark.parametrize("name,words", [("missing.png", "no such file"), ("not-an-image.png", "not an image")])
def test_bad_conditioning_image_exit_2(ltx_i2v_model_dir, tmp_path, capsys, loads, name, words):
    (tmp_path / "not-an-image.png").write_text("hello")
    assert main(["run", "--model", str(ltx_i2v_model_dir), "--image", str(tmp_path / name),
                 "--output", str(tmp_path / "x.mp4")]) == 2
    line = one_error_line(capsys)
    assert "--image" in line and words in line and loads == [] and not (tmp_path / "x.mp4").exists()


def test_an_existing_sequence_frame_is_never_replaced(wan_model_dir, tmp_path, capsys, loads):
    (tmp_path / "x-0003.png").write_bytes(b"keep me")
    assert run_wan(wan_model_dir, tmp_path / "x.png", "--frames", "5") == 2
    line = one_error_line(capsys)
    assert "x-0003.png exists (the 5 frames go to x-0001.png … x-0005.png); pass --overwrite" in line
    assert loads == [] and os.listdir(tmp_path) == ["x-0003.png"]
    assert (tmp_path / "x-0003.png").read_bytes() == b"keep me"


def test_overwrite_replaces_a_sequence(wan_model_dir, wan_loadable, tmp_path, capsys):
    (tmp_path / "x-0003.png").write_bytes(b"old")
    assert run_wan(wan_model_dir, tmp_path / "x.png", "--frames", "5", "--overwrite") == 0
    assert f"wrote 5 files: {tmp_path / 'x-0001.png'} … {tmp_path / 'x-0005.png'}" in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path)) == [".x.png.omni-frames.json", *(f"x-{i:04d}.png" for i in range(1, 6))]
    assert Image.open(tmp_path / "x-0003.png").size == (32, 32)


def test_default_frame_count_is_checked_too(wan_model_dir, tmp_path, capsys, loads):
    """Without --frames the pipeline's own default (Wan: 81) decides which names must be free."""
    (tmp_path / "x-0081.png").write_bytes(b"keep me")
    assert run_wan(wan_model_dir, tmp_path / "x.png") == 2
    assert "x-0081.png exists (the 81 frames go to x-0001.png … x-0081.png)" in one_error_line(capsys)
