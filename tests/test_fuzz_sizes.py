"""Fuzz: every size-like config field of a tiny pipeline (the Flux demo, and an SD 1.5 UNet) set to a hostile
number or list length, then `plan` in this process and `run` in a child under an address-space cap.

The fields are not listed by hand: every integer (or list of integers) in every component's `*config.json`
is a candidate, so a field added by a new diffusers release is fuzzed too. Whatever the value, the operator
gets exit 0 with the file written, or one `omni-console: ` line (exit 1 or 2, exit 2 before anything
loads), in bounded time, never a traceback; the child's `RLIMIT_AS` means a regression that allocates
without bound fails the test instead of taking the machine down.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz_inputs import _check_outcome, _run_in_process

CHILD_MEMORY = 6 << 30  # the demo runs in well under 2 GiB
CHILD_TIMEOUT_S = 240.0
HOSTILE_INTS = st.one_of(st.sampled_from([0, -1, 2**17 + 1, 10**6, 10**8, 10**9, 2**31, 2**63, 5 * 10**8,
                                          int("9" * 4000), int(1e30)]),
                         st.integers(min_value=-(2**70), max_value=2**70))


def size_fields(root: Path) -> list[tuple[str, str]]:
    """(config file relative to root, key) for every integer or list of integers at a config's top level or
    one level down (`rope_scaling.factor` as `rope_scaling/factor`)."""
    fields = []
    for path in sorted(root.glob("*/*config.json")):
        doc = json.loads(path.read_text())
        rel = path.relative_to(root).as_posix()
        for key, value in doc.items():
            if isinstance(value, dict):
                fields += [(rel, f"{key}/{sub}") for sub, inner in value.items() if _sized(inner)]
            elif _sized(value):
                fields.append((rel, key))
    return fields


def _sized(value: object) -> bool:
    ints = value if isinstance(value, list) else [value]
    return bool(ints) and all(isinstance(v, int) and not isinstance(v, bool) for v in ints)


@st.composite
def size_edit(draw, fields: list[tuple[str, str]]):
    rel, key = draw(st.sampled_from(fields))
    value = draw(HOSTILE_INTS)
    shape = draw(st.sampled_from(["scalar", "one item", "long list"]))
    return rel, key, value, shape


def _apply(root: Path, rel: str, key: str, value: int, shape: str) -> None:
    path = root / rel
    doc = json.loads(path.read_text())
    parent, _, leaf = key.rpartition("/")
    holder = doc[parent] if parent else doc
    old = holder[leaf]
    if isinstance(old, list) and shape == "one item":
        holder[leaf] = [value, *old[1:]]
    elif isinstance(old, list) and shape == "long list":
        holder[leaf] = [old[0] if old else 1] * 100_000
    else:
        holder[leaf] = value
    path.unlink()  # the copy shares inodes with the fixture: write a new file
    path.write_text(json.dumps(doc))


def _copy(src: Path, parent: Path) -> Path:
    root = Path(tempfile.mkdtemp(dir=parent)) / "model"
    shutil.copytree(src, root, copy_function=os.link)
    return root


@pytest.fixture(scope="module")
def sd15_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_families_unet import build_tiny_sd15

    return build_tiny_sd15(tmp_path_factory.mktemp("models") / "sd15")


def _models(request: pytest.FixtureRequest, name: str) -> Path:
    return request.getfixturevalue({"demo": "demo_model_dir", "sd15": "sd15_dir"}[name])


@pytest.mark.slow
@pytest.mark.parametrize("model", ["demo", "sd15"])
@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_plan_on_a_hostile_size_is_one_line(model, data, request, tmp_path: Path, monkeypatch):
    source = _models(request, model)
    rel, key, value, shape = data.draw(size_edit(size_fields(source)))
    root = _copy(source, tmp_path)
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(root.parent / "cache"))
    try:
        _apply(root, rel, key, value, shape)
        code, out, err, seconds = _run_in_process(["plan", "--model", str(root), "--device", "cpu",
                                                   "--height", "32", "--width", "32"])
        _check_outcome(code, out, err, seconds)
        assert code in (0, 2), err
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["demo", "sd15"])
@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_run_on_a_hostile_size_is_bounded_and_one_true_line(model, data, request, tmp_path: Path):
    source = _models(request, model)
    rel, key, value, shape = data.draw(size_edit(size_fields(source)))
    root = _copy(source, tmp_path)
    out = root.parent / "out.png"
    env = {**os.environ, "OMNI_CONSOLE_CACHE_DIR": str(root.parent / "cache")}
    try:
        _apply(root, rel, key, value, shape)
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "omni_console.console.cli", "run", "--model", str(root),
                               "--headless", "--device", "cpu", "--steps", "1", "--height", "32", "--width", "32",
                               "--output", str(out)], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                              env=env, preexec_fn=_cap)
        seconds = time.monotonic() - start
        note = f"{rel}:{key}={str(value)[:30]} ({shape}) -> {done.returncode} in {seconds:.0f} s: {done.stderr[-400:]}"
        assert "Traceback" not in done.stderr, note
        assert done.returncode in (0, 1, 2), note
        if done.returncode == 0:
            assert out.is_file(), note
        else:
            assert not out.exists(), note
            last = done.stderr.strip().splitlines()[-1]
            assert last.startswith("omni-console: "), note
            if done.returncode == 2:
                assert done.stderr.count("\n") == 1, note
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)
