"""`--overwrite` deletes only frames this tool wrote and recorded, never a file the operator made.

Each case builds a folder in tmp_path, writes through the same path `run` uses (`check_output` then
`write_result`) and asserts which files are left, byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from omni_console.engine.running import frame_manifest
from omni_console.engine.running.frame_manifest import MAX_MANIFEST_BYTES, FrameManifest, manifest_path
from omni_console.engine.running.outputs import check_output, write_result

MANIFEST = ".s.png.omni-frames.json"


def frames(count: int) -> list[Image.Image]:
    return [Image.new("RGB", (8, 8), (i * 20 % 256, 0, 0)) for i in range(count)]


def write(folder: Path, count: int, *, overwrite: bool, name: str = "s.png") -> list[Path]:
    return write_result(frames(count), check_output(folder / name, video=True, frames=count, overwrite=overwrite),
                        fps=None)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and not p.is_symlink()}


def record(path: Path, name: str | None = None) -> dict:
    data = path.read_bytes()
    return {"name": name or path.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_a_users_numbered_file_beside_a_single_image_survives_overwrite(tmp_path):
    (tmp_path / "shot.png").write_bytes(b"old image")
    for name in ("shot-0001.png", "shot-0002.png", "shot-12345.png"):
        (tmp_path / name).write_bytes(b"the user's own")
    written = write_result(frames(1), check_output(tmp_path / "shot.png", overwrite=True, video=False), fps=None)
    assert written == [tmp_path / "shot.png"] and Image.open(tmp_path / "shot.png").size == (8, 8)
    assert sorted(os.listdir(tmp_path)) == ["shot-0001.png", "shot-0002.png", "shot-12345.png", "shot.png"]
    assert all((tmp_path / n).read_bytes() == b"the user's own" for n in ("shot-0001.png", "shot-12345.png"))


def test_a_single_image_deletes_nothing_even_with_its_own_recorded_frames(tmp_path):
    write(tmp_path, 4, overwrite=False)
    before = snapshot(tmp_path)
    write_result(frames(1), check_output(tmp_path / "s.png", overwrite=True, video=False), fps=None)
    assert {k: v for k, v in snapshot(tmp_path).items() if k != "s.png"} == before


def test_a_users_frames_without_a_manifest_survive_a_shorter_sequence(tmp_path):
    for i in range(1, 8):
        (tmp_path / f"s-{i:04d}.png").write_bytes(b"user frame")
    write(tmp_path, 3, overwrite=True)  # replaces 1..3, as --overwrite asked; 4..7 are not ours
    assert all((tmp_path / f"s-{i:04d}.png").read_bytes() == b"user frame" for i in range(4, 8))
    assert all(Image.open(tmp_path / f"s-{i:04d}.png").size == (8, 8) for i in range(1, 4))


def test_the_tools_own_stale_frames_are_removed(tmp_path):
    write(tmp_path, 7, overwrite=False)
    assert (tmp_path / MANIFEST).is_file()
    write(tmp_path, 3, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == [MANIFEST, "s-0001.png", "s-0002.png", "s-0003.png"]
    names = [f["name"] for f in json.loads((tmp_path / MANIFEST).read_text())["frames"]]
    assert names == ["s-0001.png", "s-0002.png", "s-0003.png"]


def test_a_recorded_frame_the_user_changed_is_kept(tmp_path):
    write(tmp_path, 5, overwrite=False)
    (tmp_path / "s-0005.png").write_bytes(b"edited by the user")
    write(tmp_path, 3, overwrite=True)
    assert not (tmp_path / "s-0004.png").exists()
    assert (tmp_path / "s-0005.png").read_bytes() == b"edited by the user"


def test_without_overwrite_earlier_recorded_frames_stay_recorded(tmp_path):
    write(tmp_path, 5, overwrite=False)
    for i in range(1, 4):
        (tmp_path / f"s-{i:04d}.png").unlink()
    write(tmp_path, 3, overwrite=False)  # 4 and 5 stay, and stay recorded
    assert len([n for n in os.listdir(tmp_path) if n.endswith(".png")]) == 5
    write(tmp_path, 2, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == [MANIFEST, "s-0001.png", "s-0002.png"]


def _hostile(tmp_path: Path, victims: list[tuple[Path, str]], *, signed: bool = True) -> str:
    """A manifest that names `victims` (path, name written in the manifest) with their true sizes and hashes,
    signed with this user's own key (as if it had leaked) unless `signed` is False; returns its text."""
    body = {"schema": "omni-console.frames/1", "output": "s.png",
            "frames": [record(path, name) for path, name in victims]}
    if signed:
        key = frame_manifest._key(create=True)
        assert key is not None
        body["mac"] = frame_manifest.sign(FrameManifest.model_construct(
            schema_=body["schema"], output="s.png", frames=[frame_manifest.FrameRecord(**f) for f in body["frames"]]),
            key)
    text = json.dumps(body)
    (tmp_path / MANIFEST).write_text(text)
    return text


def test_a_manifest_this_tool_did_not_sign_deletes_nothing(tmp_path):
    """Named exactly as our frames, with their true sizes and hashes, but not signed by this user's key."""
    for i in range(1, 6):
        (tmp_path / f"s-{i:04d}.png").write_bytes(b"user frame %d" % i)
    _hostile(tmp_path, [(tmp_path / f"s-{i:04d}.png", None) for i in range(1, 6)], signed=False)
    write(tmp_path, 2, overwrite=True)
    assert all((tmp_path / f"s-{i:04d}.png").read_bytes() == b"user frame %d" % i for i in range(3, 6))
    write(tmp_path, 1, overwrite=True, name="s.png")  # the replaced manifest is ours now, and lists only 1..2
    assert all((tmp_path / f"s-{i:04d}.png").exists() for i in range(1, 6))


@pytest.mark.parametrize("case", ["dotdot", "absolute", "symlink", "not-a-frame", "other-suffix", "arabic-digits",
                                  "index-0", "subfolder"])
def test_a_hostile_manifest_deletes_nothing(tmp_path, case):
    out = tmp_path / "out"
    out.mkdir()
    outside = tmp_path / "x"
    outside.write_bytes(b"precious")
    if case == "dotdot":
        victims = [(outside, "../x")]
    elif case == "absolute":
        victims = [(outside, str(outside))]
    elif case == "symlink":
        (out / "s-0009.png").symlink_to(outside)
        victims = [(outside, "s-0009.png")]
    elif case == "subfolder":
        (out / "d").mkdir()
        (out / "d" / "s-0009.png").write_bytes(b"precious")
        victims = [(out / "d" / "s-0009.png", "d/s-0009.png")]
    else:
        name = {"not-a-frame": "notes.txt", "other-suffix": "s-0009.jpg", "index-0": "s-0000.png",
                "arabic-digits": "s-\u0660\u0660\u0660\u0669.png"}[case]
        (out / name).write_bytes(b"precious")
        victims = [(out / name, name)]
    text = _hostile(out, victims)
    before, outside_before = snapshot(out), outside.read_bytes()
    write(out, 2, overwrite=True)
    after = snapshot(out)
    assert {n: d for n, d in after.items() if n in before and n != MANIFEST} == \
        {n: d for n, d in before.items() if n != MANIFEST}  # nothing removed or changed
    assert outside.read_bytes() == outside_before
    assert case != "subfolder" or (out / "d" / "s-0009.png").read_bytes() == b"precious"
    if case == "symlink":  # a valid frame name in a signed manifest: ours, so replaced; the link stays
        assert (out / "s-0009.png").is_symlink()
    else:
        assert (out / MANIFEST).read_text() == text  # names no frame of ours: not ours, not replaced either


@pytest.mark.parametrize("body", [b"{", b"[]", b'{"schema": "omni-console.frames/1", "output": "s.png", "frames": [], '
                                  b'"extra": 1}', b" " * (MAX_MANIFEST_BYTES + 1), b"[" * 100_000],
                         ids=["truncated", "a-list", "unknown-key", "oversized", "deeply-nested"])
def test_a_damaged_or_oversized_manifest_deletes_nothing(tmp_path, body):
    for i in range(1, 6):
        (tmp_path / f"s-{i:04d}.png").write_bytes(b"user frame")
    (tmp_path / MANIFEST).write_bytes(body)
    write(tmp_path, 2, overwrite=True)
    assert all((tmp_path / f"s-{i:04d}.png").read_bytes() == b"user frame" for i in range(3, 6))
    assert (tmp_path / MANIFEST).read_bytes() == body


def test_a_manifest_that_is_a_symlink_is_neither_followed_nor_replaced(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    write(tmp_path, 5, overwrite=False, name="s.png")  # a real manifest elsewhere, listing real frames there
    (out / "s-0004.png").write_bytes((tmp_path / "s-0004.png").read_bytes())
    (out / MANIFEST).symlink_to(tmp_path / MANIFEST)
    write(out, 2, overwrite=True)
    assert (out / "s-0004.png").exists() and (out / MANIFEST).is_symlink()
    assert (tmp_path / "s-0005.png").exists()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.one_of(st.sampled_from(["s-0003.png", "s-0004.png", "user.png", "../s-0004.png",
                                                 "s-0004.png/", "./s-0004.png", "S-0004.png", "s-0004.PNG",
                                                 "s-0004.png\x00", "s-00004.png", "s-0004"]),
                                st.text(max_size=20)), max_size=6))
def test_fuzzed_manifests_never_delete_a_user_file(tmp_path_factory, names):
    folder = tmp_path_factory.mktemp("fuzz")
    user = {"s-0004.png": b"user 4", "s-0005.png": b"user 5", "user.png": b"user"}
    for name, data in user.items():
        (folder / name).write_bytes(data)
    body = {"schema": "omni-console.frames/1", "output": "s.png",
            "frames": [{"name": n, "size": 6, "sha256": hashlib.sha256(b"user 4").hexdigest()} for n in names]}
    manifest_path(folder / "s.png").write_text(json.dumps(body))
    write(folder, 3, overwrite=True)
    # even s-0004.png, named with its true size and hash: the manifest is not signed with this user's key
    assert all((folder / n).read_bytes() == d for n, d in user.items())


@pytest.mark.slow
def test_run_overwrite_keeps_the_users_numbered_files(demo_model_dir, tmp_path, capsys):
    """What the operator saw: `run --output shot.png --overwrite` and their shot-0001.png was gone."""
    from omni_console.console.cli import main

    (tmp_path / "shot.png").write_bytes(b"yesterday's image")
    (tmp_path / "shot-0001.png").write_bytes(b"the user's own")
    code = main(["run", "--model", str(demo_model_dir), "--output", str(tmp_path / "shot.png"), "--overwrite",
                 "--steps", "1", "--height", "64", "--width", "64"])
    assert code == 0, capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["shot-0001.png", "shot.png"]
    assert (tmp_path / "shot-0001.png").read_bytes() == b"the user's own"
    assert Image.open(tmp_path / "shot.png").size == (64, 64)
