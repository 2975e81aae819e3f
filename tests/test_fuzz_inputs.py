"""Fuzz: hostile model_index.json, component configs, shard indexes, cached profiles and CLI flags.

Each example copies the tiny demo model (hard links; a mutated file is replaced, never written
through), applies a few mutations drawn by hypothesis, and runs `omni-console plan` on it. Whatever
the input, the operator gets exit 0, or exactly one `omni-console: error:` line with exit 1 or 2;
never a traceback, never more than `TIME_BOUND_S`, never a call to `torch.load` or `pickle` (they
are disabled in this process and, through `no_pickle_main.py`, in the child runs), and never an
ESC, BEL or C1 character on stdout or stderr, wherever the data put one.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from no_pickle_main import MARK

TIME_BOUND_S = 10.0  # one plan in this process (typically 0.1 s; the 2-core test machine is shared)
CHILD_BOUND_S = 120.0  # a child also starts Python and imports torch (slow on a loaded machine)
CONTROL = {"\x1b", "\x07", *map(chr, range(0x80, 0xA0))}
SIZE = ["--height", "64", "--width", "64"]

# --- strategies ---------------------------------------------------------------------------------

nasty_chars = st.sampled_from(["\x1b]52;c;cHduZWQ=\x07", "\x1b]2;T\x07", "\x9b31m", "\u202e", "[/x]", "[bold red]",
                               "[@click=app.quit]", "../", "/", "\\", "\x00", "\n", "\t", "é", "a" * 300, ".bin",
                               ".safetensors", "transformer", "vae", "diffusers", "AutoencoderKL", "null"])
nasty_text = st.one_of(st.lists(nasty_chars, min_size=1, max_size=3).map("".join),
                       st.tuples(st.text(max_size=6), nasty_chars).map("".join), st.text(max_size=12))
numbers = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([0, 1, -1, 2**31, 10**6]),
                    st.floats(allow_nan=True, allow_infinity=True))
leaves = st.one_of(st.none(), st.booleans(), numbers, nasty_text)
json_values = st.recursive(leaves, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                           st.dictionaries(nasty_text, inner, max_size=4)),
                           max_leaves=8)

Mutation = Callable[[Path], None]


def _replace(path: Path, text: str | bytes) -> None:
    """Write a new file at `path` (unlinking first: the copy shares its inodes with the fixture)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")


def _edit_json(path: Path, edit: Callable[[dict], object]) -> None:
    doc = json.loads(path.read_text())
    result = edit(doc)
    _replace(path, json.dumps(doc if result is None else result))


@st.composite
def model_index_edits(draw) -> Mutation:
    key = draw(st.one_of(st.sampled_from(["_class_name", "transformer", "vae", "text_encoder", "scheduler",
                                          "_diffusers_version"]), nasty_text))
    value = draw(st.one_of(st.sampled_from([["diffusers", "AutoencoderKL"], ["transformers", "CLIPTextModel"],
                                            ["diffusers", "FluxTransformer2DModel"], "FluxPipeline"]),
                           st.tuples(st.sampled_from(["diffusers", "transformers", "os"]), nasty_text).map(list),
                           json_values))
    delete = draw(st.booleans())

    def edit(doc: dict) -> None:
        if delete:
            doc.pop(key, None)
        else:
            doc[key] = value
    return lambda root: _edit_json(root / "model_index.json", edit)


@st.composite
def config_edits(draw) -> Mutation:
    component, name = draw(st.sampled_from([("transformer", "config.json"), ("vae", "config.json"),
                                            ("text_encoder", "config.json"), ("scheduler", "scheduler_config.json"),
                                            ("tokenizer", "tokenizer_config.json")]))
    key = draw(st.one_of(st.sampled_from(["num_layers", "num_single_layers", "_class_name", "in_channels",
                                          "attention_head_dim", "hidden_size", "num_attention_heads",
                                          "tokenizer_class", "auto_map", "sample_size"]), nasty_text))
    value = draw(json_values)
    whole = draw(st.one_of(st.none(), json_values, st.binary(max_size=64)))

    def apply(root: Path) -> None:
        path = root / component / name
        if whole is None:
            _edit_json(path, lambda doc: doc.__setitem__(key, value))
        else:
            _replace(path, whole if isinstance(whole, bytes) else json.dumps(whole))
    return apply


@st.composite
def index_edits(draw) -> Mutation:
    component, stem = draw(st.sampled_from([("transformer", "diffusion_pytorch_model"),
                                            ("vae", "diffusion_pytorch_model"), ("text_encoder", "model")]))
    files = st.one_of(st.sampled_from([f"{stem}.safetensors", f"{stem}.bin", "x.pt", "../model_index.json",
                                       "/etc/passwd", "a" * 300 + ".safetensors",
                                       f"{stem}-00001-of-00002.safetensors"]),
                      nasty_text, json_values)
    weight_map = draw(st.dictionaries(st.one_of(st.sampled_from(["x_embedder.weight", "proj_out.bias"]), nasty_text),
                                      files, max_size=4))
    doc = draw(st.one_of(st.just({"metadata": {"total_size": 1}, "weight_map": weight_map}), json_values))
    plant_pickle = draw(st.booleans())  # a pickle under a name the index may point at

    def apply(root: Path) -> None:
        if plant_pickle:
            _replace(root / component / f"{stem}.bin", pickle.dumps({"x": 1}, protocol=2))
        _replace(root / component / f"{stem}.safetensors.index.json", json.dumps(doc))
    return apply


@st.composite
def profile_edits(draw) -> Mutation:
    field = draw(st.sampled_from(["other_s", "block_compute_s", "bandwidth_bytes_per_s", "text_extra_bytes",
                                  "forwards_per_step", "size", "model", "device", "version", "measured_at"]))
    value = draw(json_values)
    kind = draw(st.sampled_from(["field", "raw", "fifo", "symlink"]))
    raw = draw(st.binary(max_size=64))

    def apply(root: Path) -> None:
        from omni_console.engine.model_dir.discovery import discover_model
        from omni_console.engine.planning.request_profile import RequestProfile, RequestSize, profile_path

        size = RequestSize(height=64, width=64)
        model = discover_model(root)
        path = profile_path(root, model.nbytes, "cpu", size)
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):  # an earlier edit's FIFO would block this write forever
            path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "symlink":
            path.symlink_to("/dev/zero")
        elif kind == "raw":
            path.write_bytes(raw)
        else:
            blocks = sum(len(bl.block_bytes) for c in model.components for bl in c.block_lists)
            doc = json.loads(RequestProfile(model=str(root.resolve()), model_bytes=model.nbytes, device="cpu",
                                            size=size, block_compute_s=[0.01] * blocks, other_s=0.001,
                                            forwards_per_step=1, measured_at="2026").model_dump_json())
            doc[field] = value
            path.write_text(json.dumps(doc))
    return apply


mutations = st.lists(st.one_of(model_index_edits(), config_edits(), index_edits(), profile_edits()),
                     min_size=1, max_size=3)

# what a number flag may be given besides numbers: digits no parser expects, too many of them, other scripts
number_text = st.one_of(st.sampled_from(["²", "--3", "１２", "٣", "1_0", "0x10", "", "9" * 4301, "1" + "0" * 5000,
                                         "0." + "1" * 5000, "1e99999999", "-0"]),
                        st.text(alphabet=st.sampled_from("0123456789-+.eE²٠３ _"), max_size=30))
flag_numbers = st.one_of(numbers, number_text)
flag_values = {
    "--height": flag_numbers, "--width": flag_numbers, "--frames": flag_numbers,
    "--max-sequence-length": flag_numbers, "--guidance": flag_numbers, "--resident-layers": flag_numbers,
    "--prefetch-slots": flag_numbers, "--gpus": flag_numbers, "--upcast-resident": flag_numbers,
    "--vram-budget": st.one_of(nasty_text, number_text, number_text.map(lambda t: t + "GB"),
                               st.sampled_from(["24GB", "1MB", "-5GB", "nan", "1e300GB", "0"])),
    "--dlo-offload-components": st.one_of(json_values.map(json.dumps), nasty_text),
    "--device": st.one_of(nasty_text, st.sampled_from(["cpu", "cuda", "cuda:x", "cuda:99", "bogus"])),
    "--variant": nasty_text, "--placement": nasty_text, "--mode": nasty_text, "--parallel": nasty_text,
}
flags = st.lists(st.sampled_from(sorted(flag_values)).flatmap(
    lambda name: st.tuples(st.just(name), flag_values[name].map(str))), max_size=3)

# --- running ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def no_unpickling():
    calls: list[str] = []

    def forbidden(name: str):
        def refuse(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} called")
        return refuse

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "load", forbidden("torch.load"))
        mp.setattr(torch.serialization, "load", forbidden("torch.serialization.load"))
        mp.setattr(pickle, "load", forbidden("pickle.load"))
        mp.setattr(pickle, "loads", forbidden("pickle.loads"))
        mp.setattr(pickle, "Unpickler", forbidden("pickle.Unpickler"))
        yield calls


def _copy_model(src: Path, parent: Path) -> Path:
    root = Path(tempfile.mkdtemp(dir=parent)) / "model"
    shutil.copytree(src, root, copy_function=os.link)
    return root


def _check_outcome(code: object, out: str, err: str, seconds: float) -> None:
    assert seconds < TIME_BOUND_S, f"took {seconds:.1f} s"
    assert "Traceback" not in out + err
    assert not CONTROL & set(out + err), sorted({f"{ord(c):#x}" for c in CONTROL & set(out + err)})
    assert code in (0, 1, 2), (code, err)
    if code != 0:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("omni-console: "), err


def _run_in_process(argv: list[str]) -> tuple[object, str, str, float]:
    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            from omni_console.console.cli import main

            code: object = main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue(), time.monotonic() - start


@pytest.mark.slow
@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(edits=mutations, extra=flags, as_json=st.booleans())
def test_plan_on_fuzzed_inputs_is_one_true_line(edits, extra, as_json, demo_model_dir: Path, tmp_path: Path,
                                                no_unpickling, monkeypatch: pytest.MonkeyPatch):
    root = _copy_model(demo_model_dir, tmp_path)
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(root.parent / "cache"))
    try:
        for edit in edits:
            with contextlib.suppress(Exception):  # an edit the earlier one made impossible (a file gone)
                edit(root)
        argv = ["plan", "--model", str(root), "--device", "cpu", *SIZE, *[x for pair in extra for x in pair]]
        code, out, err, seconds = _run_in_process(argv + (["--json"] if as_json else []))
        _check_outcome(code, out, err, seconds)
        assert not no_unpickling
        if code == 0 and as_json and out:
            json.loads(out, parse_constant=lambda c: pytest.fail(f"plan --json wrote {c}"))
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)


@pytest.mark.slow
@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(edits=mutations)
def test_plan_in_a_child_process_never_unpickles(edits, demo_model_dir: Path, tmp_path: Path):
    """The same through a real process (true exit status, stderr as written), unpickling disabled there."""
    root = _copy_model(demo_model_dir, tmp_path)
    env = {**os.environ, "OMNI_CONSOLE_CACHE_DIR": str(root.parent / "cache")}
    try:
        for edit in edits:
            with contextlib.suppress(Exception):
                edit(root)
        start = time.monotonic()
        done = subprocess.run([sys.executable, str(Path(__file__).with_name("no_pickle_main.py")), "plan",
                               "--model", str(root), "--device", "cpu", *SIZE], capture_output=True, text=True,
                              timeout=120, env=env)
        seconds = time.monotonic() - start
        assert MARK not in done.stderr
        _check_outcome(done.returncode, done.stdout, done.stderr, seconds * TIME_BOUND_S / CHILD_BOUND_S)
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)


@pytest.mark.slow
def test_the_unpickling_guard_bites():
    """The child's guard is real: a pickle call there is reported and fails the process."""
    done = subprocess.run([sys.executable, "-c", "import no_pickle_main as m, pickle; m.forbid_unpickling(); "
                           "pickle.loads(pickle.dumps(1))"],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent)
    assert f"{MARK} pickle.loads" in done.stderr and done.returncode != 0
