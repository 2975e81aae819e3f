"""Video and image writers: every container read back with PyAV / Pillow, and nothing ever replaced unasked."""

from __future__ import annotations

import os
import stat
from fractions import Fraction
from typing import NamedTuple

import av
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from omni_console.engine.errors import ConfigError
from omni_console.engine.running import outputs, video_encoders
from omni_console.engine.running.output_notes import write_notes
from omni_console.engine.running.outputs import check_output, sequence_paths, write_result

WIDTH, HEIGHT = 64, 48


def make_frames(count: int, width: int = WIDTH, height: int = HEIGHT) -> list[Image.Image]:
    """Frames that differ from each other: a brightness ramp over time and a bar that moves down."""
    frames = []
    for i in range(count):
        array = np.zeros((height, width, 3), np.uint8)
        array[..., 0] = 20 + 200 * i // max(1, count - 1)
        array[..., 2] = np.linspace(0, 255, width, dtype=np.uint8)[None, :]
        array[(i * 5) % height: (i * 5) % height + 4, :, 1] = 255
        frames.append(Image.fromarray(array))
    return frames


class Decoded(NamedTuple):
    frames: list[np.ndarray]
    rate: Fraction
    size: tuple[int, int]
    codec: str


def decode_mp4(path) -> Decoded:
    """The frames and the stream's rate, size and codec, each read while the container is open (PyAV 18.1.1
    refuses a closed container's stream attributes)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        return Decoded(frames, stream.average_rate, (stream.width, stream.height), stream.codec_context.name)


def animation_frames(path) -> tuple[list[np.ndarray], list[int], dict]:
    with Image.open(path) as image:
        arrays, durations = [], []
        for index in range(image.n_frames):
            image.seek(index)
            image.load()
            arrays.append(np.asarray(image.convert("RGB")))
            durations.append(image.info["duration"])
        return arrays, durations, dict(image.info)


@pytest.mark.parametrize("count", [5, 9])
@pytest.mark.parametrize("fps", [8.0, 16.0])
def test_mp4_has_every_frame_size_and_rate(tmp_path, count, fps):
    frames = make_frames(count)
    target = check_output(tmp_path / "clip.mp4", video=True, frames=count)
    assert write_result(frames, target, fps=fps) == [tmp_path / "clip.mp4"]
    decoded, rate, size, codec = decode_mp4(tmp_path / "clip.mp4")
    assert len(decoded) == count
    assert size == (WIDTH, HEIGHT)
    assert float(rate) == fps
    assert codec == ("h264" if video_encoders.mp4_codec() == "libx264" else "mpeg4")
    # frames in order: the red ramp rises frame by frame (lossy codec: compare means, not pixels)
    reds = [frame[..., 0].mean() for frame in decoded]
    expected = [np.asarray(f)[..., 0].mean() for f in frames]
    assert np.allclose(reds, expected, atol=6)


def test_mp4_at_an_ntsc_rate(tmp_path):
    target = check_output(tmp_path / "ntsc.mp4", video=True)
    write_result(make_frames(5), target, fps=24000 / 1001)
    rate = decode_mp4(tmp_path / "ntsc.mp4").rate
    assert abs(float(rate) - 24000 / 1001) < 1e-3


def test_mp4_falls_back_to_mpeg4_without_h264(tmp_path, monkeypatch):
    monkeypatch.setattr(video_encoders, "MP4_CODECS", ("no-such-encoder", "mpeg4"))
    video_encoders.mp4_codec.cache_clear()
    try:
        target = check_output(tmp_path / "fallback.mp4", video=True)
        write_result(make_frames(5), target, fps=10)
        decoded, rate, _, codec = decode_mp4(tmp_path / "fallback.mp4")
    finally:
        video_encoders.mp4_codec.cache_clear()
    assert codec == "mpeg4" and len(decoded) == 5 and float(rate) == 10


@pytest.mark.parametrize("suffix", [".gif", ".webp"])
@pytest.mark.parametrize("count", [5, 9])
def test_animations_have_every_frame_and_their_durations(tmp_path, suffix, count):
    fps, tick = 16.0, (10 if suffix == ".gif" else 1)
    frames = make_frames(count)
    path = tmp_path / f"anim{suffix}"
    assert write_result(frames, check_output(path, video=True, frames=count), fps=fps) == [path]
    arrays, durations, info = animation_frames(path)
    assert len(arrays) == count and all(a.shape == (HEIGHT, WIDTH, 3) for a in arrays)
    assert info.get("loop") == 0  # loops forever
    assert all(abs(d - 1000 / fps) <= tick for d in durations)
    assert abs(sum(durations) - count * 1000 / fps) <= tick
    reds = [a[..., 0].mean() for a in arrays]
    assert np.allclose(reds, [np.asarray(f)[..., 0].mean() for f in frames], atol=8)


@pytest.mark.parametrize("count", [5, 9, 12])
def test_png_sequence_names_count_and_exact_pixels(tmp_path, count):
    frames = make_frames(count)
    target = check_output(tmp_path / "seq.png", video=True, frames=count)
    written = write_result(frames, target, fps=None)
    assert [p.name for p in written] == [f"seq-{i:04d}.png" for i in range(1, count + 1)]
    listed = sorted(p.name for p in tmp_path.iterdir())
    assert listed == [".seq.png.omni-frames.json", *(p.name for p in written)]  # the manifest; no seq.png, no temp
    for frame, path in zip(frames, written, strict=True):
        assert np.array_equal(np.asarray(Image.open(path)), np.asarray(frame))


def test_sequence_digits_follow_the_frame_count(tmp_path):
    names = [p.name for p in sequence_paths(tmp_path / "v.png", 10001)]
    assert names[0] == "v-00001.png" and names[-1] == "v-10001.png" and len(names) == 10001
    assert sequence_paths(tmp_path / "v.png", 1) == [tmp_path / "v.png"]


@pytest.mark.parametrize("suffix", [".png", ".gif", ".webp", ".mp4"])
def test_one_frame_is_one_file(tmp_path, suffix):
    path = tmp_path / f"one{suffix}"
    written = write_result(make_frames(1), check_output(path, video=True, frames=1), fps=8)
    assert written == [path] and os.listdir(tmp_path) == [path.name]
    if suffix == ".mp4":
        assert len(decode_mp4(path)[0]) == 1
    else:
        assert Image.open(path).size == (WIDTH, HEIGHT) and getattr(Image.open(path), "n_frames", 1) == 1


def test_float_frames_as_diffusers_np_output(tmp_path):
    array = np.linspace(0, 1, HEIGHT * WIDTH * 3, dtype=np.float32).reshape(HEIGHT, WIDTH, 3)
    written = write_result([array, array[::-1]], check_output(tmp_path / "f.png", video=True, frames=2), fps=None)
    assert np.array_equal(np.asarray(Image.open(written[0])), (array * 255).round().astype(np.uint8))


def test_mp4_pads_odd_sizes_and_says_so(tmp_path):
    frames = make_frames(5, width=63, height=47)
    target = check_output(tmp_path / "odd.mp4", video=True)
    notes = write_notes(frames, target, fps=8)
    assert any("63x47 padded to 64x48" in note for note in notes)
    write_result(frames, target, fps=8)
    decoded, _, size, _ = decode_mp4(tmp_path / "odd.mp4")
    assert size == (64, 48) and len(decoded) == 5
    first = decoded[0].astype(int)
    # nothing cropped: the generated pixels are there, the extra column/row repeats the edge
    assert np.abs(first[:47, :63] - np.asarray(frames[0]).astype(int)).mean() < 6
    assert np.abs(first[:, 63] - first[:, 62]).mean() < 6 and np.abs(first[47] - first[46]).mean() < 6


@pytest.mark.parametrize("suffix", [".gif", ".webp", ".png"])
def test_other_containers_keep_odd_sizes(tmp_path, suffix):
    frames = make_frames(3, width=63, height=47)
    target = check_output(tmp_path / f"odd{suffix}", video=True, frames=3)
    assert write_notes(frames, target, fps=8) == []
    for path in write_result(frames, target, fps=8):
        assert Image.open(path).size == (63, 47)


def test_no_rate_given_uses_the_default_and_says_so(tmp_path):
    target = check_output(tmp_path / "x.mp4", video=True)
    assert any("16 fps" in note for note in write_notes(make_frames(2), target, fps=None))
    write_result(make_frames(2), target, fps=None)
    assert float(decode_mp4(tmp_path / "x.mp4").rate) == outputs.DEFAULT_FPS


@pytest.mark.parametrize("fps", [0.0, -3.0, float("nan"), float("inf")])
@pytest.mark.parametrize("suffix", [".mp4", ".gif"])
def test_bad_rate_writes_nothing(tmp_path, fps, suffix):
    with pytest.raises(ValueError, match="frame rate"):
        write_result(make_frames(2), check_output(tmp_path / f"r{suffix}", video=True), fps=fps)
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- checks before load


def test_mp4_for_a_still_image_model_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"\.mp4 is for videos and this model makes still images"):
        check_output(tmp_path / "x.mp4", video=False)


@pytest.mark.parametrize("name", ["x.mp3", "x.txt", "x.avi", "noext"])
def test_unknown_suffix_is_refused_with_the_choices(tmp_path, name):
    with pytest.raises(ConfigError) as info:
        check_output(tmp_path / name, video=True)
    assert ".mp4" in str(info.value) and "\n" not in str(info.value)


def test_mp4_without_pyav_is_refused_before_load(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "av", None)  # import av raises ImportError
    video_encoders.mp4_codec.cache_clear()
    try:
        with pytest.raises(ConfigError, match="needs PyAV"):
            check_output(tmp_path / "x.mp4", video=True)
    finally:
        video_encoders.mp4_codec.cache_clear()


@pytest.mark.parametrize("suffix", [".mp4", ".gif", ".webp", ".png"])
def test_existing_file_is_refused_and_kept(tmp_path, suffix):
    path = tmp_path / f"old{suffix}"
    path.write_bytes(b"keep me")
    with pytest.raises(ConfigError, match="exists; pass --overwrite"):
        check_output(path, video=True, frames=1)
    assert path.read_bytes() == b"keep me"


def test_any_existing_sequence_name_is_refused(tmp_path):
    (tmp_path / "seq-0004.png").write_bytes(b"keep me")
    with pytest.raises(ConfigError, match=r"seq-0004\.png exists \(the 5 frames go to seq-0001\.png … seq-0005\.png\)"):
        check_output(tmp_path / "seq.png", video=True, frames=5)
    check_output(tmp_path / "seq.png", video=True, frames=3)  # 0001..0003: nothing in the way
    check_output(tmp_path / "seq.png", video=False)  # a still image goes to seq.png only
    assert (tmp_path / "seq-0004.png").read_bytes() == b"keep me"


def test_unknown_frame_count_refuses_any_numbered_file(tmp_path):
    (tmp_path / "seq-x.png").write_bytes(b"")  # not a sequence name
    (tmp_path / "seq-12.jpg").write_bytes(b"")  # another suffix
    check_output(tmp_path / "seq.png", video=True)
    (tmp_path / "seq-00042.png").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"seq-00042\.png exists"):
        check_output(tmp_path / "seq.png", video=True)
    (tmp_path / "seq.png").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"seq\.png' exists"):
        check_output(tmp_path / "seq.png", video=True)


def test_a_directory_among_the_sequence_names_is_refused_even_with_overwrite(tmp_path):
    (tmp_path / "seq-0002.png").mkdir()
    with pytest.raises(ConfigError, match="is a directory"):
        check_output(tmp_path / "seq.png", video=True, frames=3, overwrite=True)


# ---------------------------------------------------------------- at write time


@pytest.mark.parametrize("suffix", [".mp4", ".gif", ".webp"])
def test_a_file_that_appears_meanwhile_is_not_replaced(tmp_path, suffix):
    path = tmp_path / f"late{suffix}"
    target = check_output(path, video=True, frames=5)
    path.write_bytes(b"someone else's")
    with pytest.raises(ConfigError, match="appeared while generating"):
        write_result(make_frames(5), target, fps=8)
    assert path.read_bytes() == b"someone else's" and os.listdir(tmp_path) == [path.name]


def test_a_sequence_stops_at_a_file_that_appears_and_removes_only_its_own(tmp_path):
    target = check_output(tmp_path / "seq.png", video=True, frames=5)
    (tmp_path / "seq-0003.png").write_bytes(b"someone else's")
    with pytest.raises(ConfigError, match="appeared while generating"):
        write_result(make_frames(5), target, fps=None)
    assert os.listdir(tmp_path) == ["seq-0003.png"]
    assert (tmp_path / "seq-0003.png").read_bytes() == b"someone else's"


@pytest.mark.parametrize("suffix", [".mp4", ".gif", ".webp", ".png"])
def test_overwrite_replaces_and_keeps_permission_bits(tmp_path, suffix):
    names = [f"old{suffix}"] if suffix != ".png" else [f"old-{i:04d}.png" for i in range(1, 6)]
    for name in names:
        (tmp_path / name).write_bytes(b"old")
        os.chmod(tmp_path / name, 0o640)
    target = check_output(tmp_path / f"old{suffix}", video=True, frames=5, overwrite=True)
    written = write_result(make_frames(5), target, fps=8)
    listed = sorted(n for n in os.listdir(tmp_path) if n != ".old.png.omni-frames.json")  # a sequence's manifest
    assert sorted(p.name for p in written) == sorted(names) == listed  # no temp files left
    for path in written:
        assert path.read_bytes() != b"old" and stat.S_IMODE(path.stat().st_mode) == 0o640
    if suffix == ".mp4":
        assert len(decode_mp4(written[0])[0]) == 5
    elif suffix != ".png":
        assert Image.open(written[0]).n_frames == 5


def test_overwrite_with_fewer_frames_removes_the_older_runs_extra_frames_only(tmp_path):
    write_result(make_frames(7), check_output(tmp_path / "s.png", video=True, frames=7), fps=None)
    others = ["s-01.png", "s-0009.jpg", "s-notes.png", "t-0005.png", "s.png"]  # not frames of this sequence
    for name in others:
        (tmp_path / name).write_bytes(b"user")
    (tmp_path / "s-0006.png").unlink()
    (tmp_path / "s-0006.png").mkdir()  # not a regular file: left alone
    written = write_result(make_frames(3), check_output(tmp_path / "s.png", video=True, frames=3, overwrite=True),
                           fps=None)
    assert [p.name for p in written] == ["s-0001.png", "s-0002.png", "s-0003.png"]
    assert sorted(os.listdir(tmp_path)) == sorted([*others, "s-0001.png", "s-0002.png", "s-0003.png", "s-0006.png",
                                                   ".s.png.omni-frames.json"])
    assert all((tmp_path / name).read_bytes() == b"user" for name in others)


def test_without_overwrite_nothing_is_removed(tmp_path):
    write_result(make_frames(3), check_output(tmp_path / "a.png", video=True, frames=3), fps=None)
    (tmp_path / "a-0009.png").write_bytes(b"user")
    write_result(make_frames(2), check_output(tmp_path / "b.png", video=True, frames=2), fps=None)
    assert (tmp_path / "a-0009.png").read_bytes() == b"user" and len(os.listdir(tmp_path)) == 8  # 2 manifests


# ---------------------------------------------------------------- frame timing


@settings(max_examples=150, deadline=None)
@given(count=st.integers(1, 400), fps=st.floats(1.0, 60.0), tick=st.sampled_from([1, 10]))
def test_frame_durations_keep_the_total_play_time(count, fps, tick):
    durations = video_encoders.frame_durations_ms(count, fps, tick)
    assert len(durations) == count and all(d % tick == 0 and d >= tick for d in durations)
    ideal = 1000 / fps
    assert all(abs(d - ideal) <= tick for d in durations)
    assert abs(sum(durations) - count * ideal) <= tick / 2
