"""`demo-model PATH` and the cached demo never delete a file omni-console did not write.

Each refusal is checked the way an operator sees it: exit 2, one `omni-console: error:` line, no
traceback, and the folder (every entry, its bytes and mode) exactly as before, with no temp or old
folder left beside it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_console.console.cli import main
from omni_console.engine.demo.build_dir import COMPLETE_MARKER, atomic_build, manifest_mismatch
from omni_console.engine.demo.demo_model import default_demo_model_path, ensure_demo_model
from omni_console.engine.errors import ConfigError

# --- helpers -----------------------------------------------------------------------------------


def _snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (and ``root`` itself): kind, mode, and bytes or link target."""
    if not os.path.lexists(root):
        return {}
    entries: dict[str, tuple] = {}
    walked = [Path(top) / name for top, dirs, files in os.walk(root) for name in dirs + files]  # no symlinks followed
    for path in [root, *sorted(walked)]:
        st = path.lstat()
        name = str(path.relative_to(root))
        if stat.S_ISLNK(st.st_mode):
            entries[name] = ("link", os.readlink(path))
        elif stat.S_ISREG(st.st_mode):
            entries[name] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
        else:
            entries[name] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_ino)
    return entries


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("omni-console: error: ")
    return lines[0]


@pytest.fixture
def demo_copy(demo_model_dir: Path, tmp_path: Path) -> Path:
    """A complete demo build (files match its manifest) that a test may change."""
    return Path(shutil.copytree(demo_model_dir, tmp_path / "demo", symlinks=True))


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _fake_build(tmp: Path) -> None:
    (tmp / "sub").mkdir()
    (tmp / "sub" / "weights.bin").write_bytes(b"w" * 100)
    (tmp / "model_index.json").write_text("{}")


# --- the manifest ------------------------------------------------------------------------------


def test_marker_lists_every_file_with_size_and_sha256(demo_model_dir: Path) -> None:
    marker = json.loads((demo_model_dir / COMPLETE_MARKER).read_text())
    assert marker["format"] == "omni-console.build-manifest/1"
    assert marker["build"]["family"] == "flux" and marker["build"]["seed"] == 0
    on_disk = {str(p.relative_to(demo_model_dir)): p for p in demo_model_dir.rglob("*") if p.is_file()}
    del on_disk[COMPLETE_MARKER]
    assert set(marker["files"]) == set(on_disk) and len(on_disk) > 10
    for name, path in on_disk.items():
        assert marker["files"][name]["size"] == path.stat().st_size
        assert marker["files"][name]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert manifest_mismatch(demo_model_dir) is None


_json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
_entries = st.fixed_dictionaries({"size": st.integers(-1, 10), "sha256": st.text("0123456789abcdef", max_size=64)})
_hostile_paths = st.sampled_from(["../victim", "/etc/passwd", "a/../b", "", ".", "./x", "a\\b", "x/",
                                  COMPLETE_MARKER]) | st.text(max_size=12)


@settings(max_examples=150, deadline=None)
@given(files=st.dictionaries(_hostile_paths, _entries | _json_scalars, min_size=1, max_size=4),
       extra=st.dictionaries(st.text(max_size=6), _json_scalars, max_size=2))
def test_a_hostile_manifest_never_matches_and_never_raises(files: dict, extra: dict) -> None:
    """Only the marker exists, so a manifest listing any file must be reported as a mismatch."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "demo"
        root.mkdir()
        doc = {**extra, "format": "omni-console.build-manifest/1", "build": {}, "files": files}
        (root / COMPLETE_MARKER).write_text(json.dumps(doc))
        assert isinstance(manifest_mismatch(root), str)
        assert sorted(p.name for p in Path(tmp).iterdir()) == ["demo"]


# --- demo-model PATH: what is replaced ---------------------------------------------------------


def test_rebuild_over_own_build_keeps_bytes_and_mode(demo_copy: Path, capsys) -> None:
    demo_copy.chmod(0o711)
    before = _snapshot(demo_copy)
    inode = demo_copy.stat().st_ino
    assert main(["demo-model", str(demo_copy)]) == 0
    assert f"demo model written to {demo_copy}" in capsys.readouterr().out
    assert demo_copy.stat().st_ino != inode  # really rebuilt and swapped in
    def files(snapshot: dict[str, tuple]) -> dict[str, tuple]:
        return {name: entry for name, entry in snapshot.items() if entry[0] == "file"}

    assert files(_snapshot(demo_copy)) == files(before) and len(files(before)) > 10  # same seed: same bytes
    assert stat.S_IMODE(demo_copy.stat().st_mode) == 0o711
    assert _leftovers(demo_copy.parent) == []


def test_empty_folder_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "empty"
    target.mkdir()
    target.chmod(0o750)
    assert main(["demo-model", str(target)]) == 0
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    assert manifest_mismatch(target) is None
    assert _leftovers(tmp_path) == []


def _add_notes(root: Path) -> None:
    (root / "notes.txt").write_text("precious")


def _add_output_folder(root: Path) -> None:
    (root / "omni-console-out").mkdir()
    (root / "omni-console-out" / "0001.png").write_bytes(b"\x89PNG image")


def _add_empty_folder(root: Path) -> None:
    (root / "later").mkdir()


def _remove_a_file(root: Path) -> None:
    (root / "scheduler" / "scheduler_config.json").unlink()


def _grow_a_file(root: Path) -> None:
    with (root / "model_index.json").open("a") as f:
        f.write(" ")


def _change_weights_same_size(root: Path) -> None:
    _flip_a_byte(root / "transformer" / "diffusion_pytorch_model.safetensors")


def _file_becomes_symlink(root: Path) -> None:
    real = root.parent / "elsewhere.json"
    shutil.move(root / "model_index.json", real)
    (root / "model_index.json").symlink_to(real)


def _symlink_to_outside_folder(root: Path) -> None:
    outside = root.parent / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    (root / "link").symlink_to(outside, target_is_directory=True)


def _fifo(root: Path) -> None:
    os.mkfifo(root / "pipe")


def _old_format_marker(root: Path) -> None:
    (root / COMPLETE_MARKER).write_text(json.dumps({"family": "flux", "version": 1, "seed": 0}))


def _garbage_marker(root: Path) -> None:
    (root / COMPLETE_MARKER).write_text("[[[[ not json")


def _manifest_naming_a_file_outside(root: Path) -> None:
    (root.parent / "victim.txt").write_text("not yours")
    marker = json.loads((root / COMPLETE_MARKER).read_text())
    marker["files"]["../victim.txt"] = {"size": 9, "sha256": "0" * 64}
    (root / COMPLETE_MARKER).write_text(json.dumps(marker))


def _marker_is_symlink(root: Path) -> None:
    real = root.parent / "marker.json"
    shutil.move(root / COMPLETE_MARKER, real)
    (root / COMPLETE_MARKER).symlink_to(real)


REFUSALS = [
    (_add_notes, "extra file notes.txt"),
    (_add_output_folder, "extra folder omni-console-out"),
    (_add_empty_folder, "extra folder later"),
    (_remove_a_file, "missing file scheduler/scheduler_config.json"),
    (_grow_a_file, "model_index.json changed size"),
    (_change_weights_same_size, "transformer/diffusion_pytorch_model.safetensors changed content"),
    (_file_becomes_symlink, "model_index.json is a symbolic link"),
    (_symlink_to_outside_folder, "link is a symbolic link"),
    (_fifo, "pipe is not a regular file"),
    (_old_format_marker, "holds a demo model from an older omni-console whose marker lists no files"),
    (_garbage_marker, "is not a valid file manifest"),
    (_manifest_naming_a_file_outside, "is not a valid file manifest"),
    (_marker_is_symlink, f"{COMPLETE_MARKER} is a symbolic link"),
]


@pytest.mark.parametrize(("change", "reason"), REFUSALS, ids=[c.__name__.strip("_") for c, _ in REFUSALS])
def test_a_changed_build_is_never_replaced(change, reason: str, demo_copy: Path, capsys) -> None:
    change(demo_copy)
    before, beside = _snapshot(demo_copy), _snapshot(demo_copy.parent)
    assert main(["demo-model", str(demo_copy)]) == 2
    line = _one_error_line(capsys)
    assert str(demo_copy) in line and reason in line
    assert "pick another folder, or delete this one yourself" in line and "nothing was changed" in line
    assert _snapshot(demo_copy) == before and _snapshot(demo_copy.parent) == beside
    assert _leftovers(demo_copy.parent) == []


def test_a_folder_without_marker_is_never_replaced(tmp_path: Path, capsys) -> None:
    user = tmp_path / "mine"
    user.mkdir()
    _add_notes(user)
    before = _snapshot(user)
    assert main(["demo-model", str(user)]) == 2
    assert "is not an omni-console demo model" in _one_error_line(capsys)
    assert _snapshot(user) == before and _leftovers(tmp_path) == []


def test_a_symlink_to_a_build_is_not_replaced(demo_copy: Path, tmp_path: Path, capsys) -> None:
    link = tmp_path / "link"
    link.symlink_to(demo_copy, target_is_directory=True)
    before = _snapshot(demo_copy)
    assert main(["demo-model", str(link)]) == 2
    assert f"{link}: is a symbolic link" in _one_error_line(capsys)
    assert link.is_symlink() and _snapshot(demo_copy) == before


# --- demo-model PATH: bad places ---------------------------------------------------------------


def test_path_is_a_file(tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("x")
    assert main(["demo-model", str(tmp_path / "file")]) == 2
    assert f"{tmp_path / 'file'}: is a file, not a folder" in _one_error_line(capsys)
    assert (tmp_path / "file").read_text() == "x"


def test_parent_is_a_file(tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("x")
    assert main(["demo-model", str(tmp_path / "file" / "demo")]) == 2
    assert f"{tmp_path / 'file'}: is a file, not a folder" in _one_error_line(capsys)
    assert main(["demo-model", str(tmp_path / "file" / "sub" / "demo")]) == 2
    assert "is not a folder" in _one_error_line(capsys)
    assert (tmp_path / "file").read_text() == "x"


def test_parent_not_writable_simulated(tmp_path: Path, capsys, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    assert main(["demo-model", str(tmp_path / "demo")]) == 2
    line = _one_error_line(capsys)
    assert f"{tmp_path}: cannot write here (Permission denied)" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through a read-only mode")
def test_parent_not_writable_for_real(tmp_path: Path, capsys) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        assert main(["demo-model", str(parent / "demo")]) == 2
        assert "cannot write here" in _one_error_line(capsys)
    finally:
        parent.chmod(0o755)


# --- the cache ---------------------------------------------------------------------------------


def test_cache_env_pointing_at_a_file(tmp_path: Path, capsys, monkeypatch) -> None:
    (tmp_path / "cache").write_text("x")
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["plan"]) == 2
    assert f"OMNI_CONSOLE_CACHE_DIR={tmp_path / 'cache'}: is not a folder" in _one_error_line(capsys)
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache" / "sub"))
    assert main(["plan"]) == 2
    assert f"OMNI_CONSOLE_CACHE_DIR={tmp_path / 'cache' / 'sub'}: is not a folder" in _one_error_line(capsys)
    assert (tmp_path / "cache").read_text() == "x"


def test_cache_env_pointing_at_an_unwritable_folder(tmp_path: Path, capsys, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    (tmp_path / "cache").mkdir()
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    assert main(["plan"]) == 2
    line = _one_error_line(capsys)
    assert f"OMNI_CONSOLE_CACHE_DIR={tmp_path / 'cache'}: cannot write here (Permission denied)" in line
    assert "unset it" in line
    assert list((tmp_path / "cache").iterdir()) == []


def test_cache_reuses_a_matching_copy_in_a_read_only_place(demo_model_dir: Path, tmp_path: Path,
                                                            monkeypatch) -> None:
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    cached = Path(shutil.copytree(demo_model_dir, default_demo_model_path(0)))

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)  # nothing is built: a complete copy needs no write
    assert ensure_demo_model(0) == cached


def test_cache_folder_with_user_files_is_left_alone(demo_model_dir: Path, tmp_path: Path, monkeypatch,
                                                    caplog) -> None:
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    primary = Path(shutil.copytree(demo_model_dir, default_demo_model_path(0)))
    _add_output_folder(primary)
    before = _snapshot(primary)
    with caplog.at_level(logging.WARNING):
        path = ensure_demo_model(0)
    assert path == primary.with_name(primary.name + "-2") and manifest_mismatch(path) is None
    assert _snapshot(primary) == before
    assert str(primary) in caplog.text and "left as it is" in caplog.text
    caplog.clear()
    stamp = (path / "model_index.json").stat().st_mtime_ns
    assert ensure_demo_model(0) == path  # found and reused, not rebuilt, no second warning
    assert (path / "model_index.json").stat().st_mtime_ns == stamp and caplog.text == ""
    assert _leftovers(primary.parent) == []


def test_concurrent_builder_keeps_the_winners_copy(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "demo"
    winner: dict[str, dict] = {}

    def build_while_another_wins(tmp: Path) -> None:
        (tmp / "ours.bin").write_bytes(b"ours")
        atomic_build(target, _fake_build, {"who": "winner"}, replace=False)
        winner.update(json.loads((target / COMPLETE_MARKER).read_text()))

    assert atomic_build(target, build_while_another_wins, {"who": "loser"}, replace=False) == target
    assert json.loads((target / COMPLETE_MARKER).read_text()) == winner and winner["build"] == {"who": "winner"}
    assert not (target / "ours.bin").exists() and manifest_mismatch(target) is None
    assert _leftovers(target.parent) == []


def test_a_folder_that_appears_during_the_build_is_not_replaced(tmp_path: Path) -> None:
    target = tmp_path / "demo"

    def build_while_the_user_writes(tmp: Path) -> None:
        _fake_build(tmp)
        target.mkdir()
        _add_notes(target)

    with pytest.raises(ConfigError, match="not an omni-console demo model"):
        atomic_build(target, build_while_the_user_writes, {"seed": 0})
    assert [p.name for p in target.iterdir()] == ["notes.txt"] and _leftovers(tmp_path) == []


# --- signals -----------------------------------------------------------------------------------

# The child patches the build to be fast and to stall inside the temp folder (or inside the swap),
# so the signal lands exactly where the test wants it; everything else is the real CLI path.
CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    import omni_console.engine.demo.build_dir as build_dir
    import omni_console.engine.demo.demo_model as demo_model
    import omni_console.engine.loading.loader as loader
    from omni_console.console.cli import main

    where, target = sys.argv[1], sys.argv[2]
    loader.quiet_libraries = lambda: None
    demo_model.make_flux_pipeline = lambda seed: None

    def save(pipe, out, **kwargs):
        (Path(out) / "weights.bin").write_bytes(b"w" * 1000)
        if where == "build":
            (Path(out) / "ready").write_text("")
            time.sleep(120)
            sys.exit("the signal did not stop the build")

    demo_model.save_pipeline = save
    real_rename = os.rename

    def rename(src, dst):
        real_rename(src, dst)
        if where == "swap":  # a signal between moving the old folder aside and moving the new one in
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)

    build_dir.os.rename = rename
    sys.exit(main(["demo-model", target]))
""")


def _run_child(where: str, target: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, where, str(target)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code", "earlier_build"), [
    (signal.SIGTERM, 143, False),
    (signal.SIGTERM, 143, True),
    (signal.SIGINT, 130, True),
    (signal.SIGHUP, 129, False),
], ids=["sigterm-new", "sigterm-over-build", "sigint-over-build", "sighup-new"])
def test_signal_during_build_leaves_nothing_behind(signum: int, code: int, earlier_build: bool,
                                                   demo_model_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "demo"
    if earlier_build:
        shutil.copytree(demo_model_dir, target)
    before = _snapshot(target)
    child = _run_child("build", target)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".demo.tmp-*/ready")):
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the build never started"
            time.sleep(0.05)
        child.send_signal(signum)
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == code, err
    assert "Traceback" not in err
    assert _leftovers(tmp_path) == [] and _snapshot(target) == before


@pytest.mark.slow
def test_sigterm_during_the_swap_finishes_it_first(demo_model_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "demo"
    shutil.copytree(demo_model_dir, target)
    child = _run_child("swap", target)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 143, err
    assert "Traceback" not in err
    # the swap completed: the new (patched, tiny) build is in place, whole, and nothing is left beside it
    assert manifest_mismatch(target) is None and (target / "weights.bin").is_file()
    assert _leftovers(tmp_path) == []


def test_signal_handlers_are_restored_after_a_build(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    atomic_build(tmp_path / "x", _fake_build, {"seed": 0})
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_finding_the_cached_demo_trusts_unchanged_files_without_hashing(demo_model_dir: Path, tmp_path: Path,
                                                                         monkeypatch) -> None:
    """Every start finds the demo: an unchanged copy (sizes match, nothing modified after the manifest)
    is taken without re-reading its hashes; a same-size edit has a later mtime and is hashed."""
    from omni_console.engine.demo import build_dir

    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    cached = Path(shutil.copytree(demo_model_dir, default_demo_model_path(0)))  # copy2 keeps the mtimes
    real_sha = build_dir._sha256
    hashed: list[str] = []
    monkeypatch.setattr(build_dir, "_sha256", lambda path: hashed.append(str(path)) or real_sha(path))
    assert ensure_demo_model(0) == cached and hashed == []
    config = cached / "vae" / "config.json"
    text = config.read_text()
    config.write_text(text.replace('"', "'", 1) if '"' in text else text)  # same size, other bytes
    later = (cached / COMPLETE_MARKER).stat().st_mtime_ns + 10**9
    os.utime(config, ns=(later, later))
    assert manifest_mismatch(cached, trust_unchanged=True) == "vae/config.json changed content" and hashed


@pytest.mark.slow
def test_plan_of_the_cached_demo_does_not_import_torch(demo_model_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    shutil.copytree(demo_model_dir, cache / default_demo_model_path(0).name)
    code = ("import sys; from omni_console.console.cli import main; code = main(['plan']); "
            "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMNI_CONSOLE_CACHE_DIR": str(cache)})
    assert done.returncode == 0, done.stderr
    assert "FluxPipeline" in done.stdout
