"""A hostile model directory: code never runs, no pickle is read, no path leaves the directory, only
regular files are opened, and every bad input is one line (ModelDirError; `plan` exits 2)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from omni_console.console.cli import main
from omni_console.engine.model_dir.discovery import ComponentInfo, discover_model
from omni_console.engine.model_dir.weights import ModelDirError

MARKER = "REMOTE_CODE_RAN"


def evil_code(root: Path) -> str:
    """A module that, if ever imported (wherever a library copies it), leaves a marker beside the model."""
    return f"from pathlib import Path\nPath({str(root.parent / MARKER)!r}).write_text('ran')\n"


@contextmanager
def no_hang(seconds: int = 30) -> Iterator[None]:
    """Fail (instead of hanging the suite) if the body blocks, e.g. on opening a FIFO."""
    def _raise(*_):
        raise TimeoutError("blocked")

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def copy_model(src: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(src, target)
    return target


def edit_json(path: Path, change: Callable[[dict], object]) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def assert_refused(root: Path, capsys, *fragments: str) -> str:
    """Discovery raises one line with every fragment; `plan` exits 2 with that one line, no traceback."""
    with no_hang(), pytest.raises(ModelDirError) as info:
        discover_model(root)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    with no_hang():
        assert main(["plan", "--model", str(root)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured.err
    assert captured.err.startswith("omni-console: error: ") and all(f in captured.err for f in fragments)
    return message


# ----------------------------------------------------------------- 1. code from the directory never runs

def _auto_map(folder: str, file: str, nest: str | None = None):
    def make(root: Path) -> None:
        path = root / folder / file
        doc = json.loads(path.read_text()) if path.exists() else {}
        entry = {"AutoTokenizer": ["evil.EvilTokenizer", None], "AutoModel": "evil.EvilModel"}
        if nest:
            doc[nest] = {"auto_map": entry}
        else:
            doc["auto_map"] = entry
        path.write_text(json.dumps(doc))
        (root / folder / "evil.py").write_text(evil_code(root))
    return make


def _set(folder: str, file: str, key: str, value: object):
    def make(root: Path) -> None:
        path = root / folder / file
        doc = json.loads(path.read_text()) if path.exists() else {}
        doc[key] = value
        path.write_text(json.dumps(doc))
    return make


def _index(name: str, value: object):
    return lambda root: edit_json(root / "model_index.json", lambda d: d.__setitem__(name, value))


CODE_CASES = {
    "auto_map in tokenizer_config": (_auto_map("tokenizer", "tokenizer_config.json"),
                                     ["tokenizer_config.json", "'auto_map'", "never run"]),
    "auto_map nested in a dict": (_auto_map("tokenizer", "tokenizer_config.json", nest="tokenizer_config"),
                                  ["tokenizer_config.json", "'tokenizer_config.auto_map'"]),
    "auto_map in a model config": (_auto_map("text_encoder", "config.json"), ["text_encoder/config.json", "auto_map"]),
    "auto_map in generation_config": (_auto_map("text_encoder_2", "generation_config.json"),
                                      ["generation_config.json", "auto_map"]),
    "auto_map in processor_config": (_auto_map("tokenizer", "processor_config.json"),
                                     ["processor_config.json", "auto_map"]),
    "auto_map in model_index": (_index("auto_map", {"FluxPipeline": "evil.EvilPipeline"}),
                                ["model_index.json", "'auto_map'"]),
    "unknown tokenizer_class": (_set("tokenizer", "tokenizer_config.json", "tokenizer_class", "EvilTokenizer"),
                                ["tokenizer_config.json", "'tokenizer_class'", "EvilTokenizer", "not a transformers"]),
    "unknown processor_class": (_set("tokenizer", "tokenizer_config.json", "processor_class", "EvilProcessor"),
                                ["'processor_class'", "EvilProcessor"]),
    "unknown image_processor_type": (_set("tokenizer", "preprocessor_config.json", "image_processor_type", "Evil"),
                                     ["preprocessor_config.json", "'image_processor_type'"]),
    "unknown feature_extractor_type": (_set("tokenizer", "preprocessor_config.json", "feature_extractor_type", "E"),
                                       ["preprocessor_config.json", "'feature_extractor_type'"]),
    "unknown diffusers _class_name": (_set("scheduler", "scheduler_config.json", "_class_name", "EvilScheduler"),
                                      ["scheduler_config.json", "'_class_name'", "not a diffusers class"]),
    "custom _class_name reference": (_set("vae", "config.json", "_class_name", ["evil", "EvilVAE"]),
                                     ["vae/config.json", "'_class_name'"]),
    "library is a module file": (_index("vae", ["evil", "EvilVAE"]), ["model_index.json", "library 'evil'"]),
    "library not a string": (_index("vae", [5, "AutoencoderKL"]), ["model_index.json", "[library, class] strings"]),
    "class is a number": (_index("vae", ["diffusers", 7]), ["model_index.json", "[library, class] strings"]),
    "class is a list": (_index("vae", ["diffusers", ["a", "b"]]), ["model_index.json", "[library, class] strings"]),
    "class not in diffusers": (_index("vae", ["diffusers", "EvilVAE"]), ["diffusers has no class 'EvilVAE'"]),
    "dunder class name": (_index("vae", ["transformers", "__class__"]), ["transformers has no class '__class__'"]),
    "function not class": (_index("vae", ["transformers", "pipeline"]), ["transformers.pipeline is not"]),
    "nested pipeline": (_index("vae", ["diffusers", "DiffusionPipeline"]), ["nested pipelines are refused"]),
    "nested pipeline subclass": (_index("vae", ["diffusers", "FluxPipeline"]), ["FluxPipeline is a pipeline"]),
    "pipeline not diffusers": (_index("_class_name", "EvilPipeline"), ["diffusers has no class 'EvilPipeline'"]),
    "pipeline not a pipeline": (_index("_class_name", "AutoencoderKL"), ["is not a diffusers pipeline"]),
    "custom pipeline module": (_index("_class_name", ["evil", "EvilPipeline"]), ["'_class_name' must name"]),
}


@pytest.mark.parametrize("case", sorted(CODE_CASES))
def test_code_references_are_refused_at_discovery(case, demo_model_dir: Path, tmp_path: Path, capsys):
    make, fragments = CODE_CASES[case]
    root = copy_model(demo_model_dir, tmp_path)
    make(root)
    assert_refused(root, capsys, *fragments)
    assert not (tmp_path / MARKER).exists()


@pytest.fixture
def stdin_says_yes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> io.StringIO:
    """stdin answers "y" to any prompt and the answer is taken, as a careless operator would.

    Whether the code then runs is seen from the marker; whether anything asked, from stdin's position.
    Remote code, if a library ever took it, is copied into a modules cache under tmp_path.
    """
    import transformers.dynamic_module_utils as dynamic

    fake = io.StringIO("y\n")
    monkeypatch.setattr("sys.stdin", fake)
    monkeypatch.setattr("builtins.input", lambda *a: fake.readline().strip())
    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    return fake


def _remote_code_component(root: Path, name: str, kind: str) -> ComponentInfo:
    """Turn `name` into an Auto* component whose config maps to a .py file beside it."""
    folder = root / name
    (folder / "evil.py").write_text(evil_code(root))
    if kind == "AutoTokenizer":
        _set(name, "tokenizer_config.json", "tokenizer_class", "EvilTokenizer")(root)
        _set(name, "tokenizer_config.json", "auto_map", {"AutoTokenizer": ["evil.EvilTokenizer", None]})(root)
    else:
        _set(name, "config.json", "model_type", "evil")(root)
        _set(name, "config.json", "auto_map", {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"})(root)
    _index(name, ["transformers", kind])(root)
    return ComponentInfo(name=name, role="other", library="transformers", class_name=kind, folder=folder)


@pytest.mark.parametrize("name,kind", [("tokenizer", "AutoTokenizer"), ("text_encoder", "AutoModel")])
def test_remote_code_never_runs_nor_prompts(name, kind, demo_model_dir, tmp_path, capsys, stdin_says_yes):
    from omni_console.engine.loading.loader import load_component

    root = copy_model(demo_model_dir, tmp_path)
    info = _remote_code_component(root, name, kind)
    config = "tokenizer_config.json" if kind == "AutoTokenizer" else "config.json"
    assert_refused(root, capsys, f"{name}/{config}", "never run")
    # defence in depth: the loader alone, with discovery bypassed, still refuses (trust_remote_code=False)
    with no_hang(), pytest.raises(ModelDirError, match=re.escape(str(info.folder))):
        load_component(info)
    assert not (tmp_path / MARKER).exists()
    assert stdin_says_yes.tell() == 0  # nothing asked on stdin


def test_loader_passes_trust_remote_code_false(demo_model_dir: Path, monkeypatch):
    """Every transformers from_pretrained gets trust_remote_code=False; diffusers models do not need it."""
    import diffusers
    import transformers

    from omni_console.engine.loading.loader import load_component

    model = discover_model(demo_model_dir)
    seen: dict[str, object] = {}
    for name in ("tokenizer", "text_encoder", "vae"):
        info = model.component(name)
        cls = getattr(transformers if info.library == "transformers" else diffusers, info.class_name)
        original = cls.from_pretrained.__func__

        def spy(klass, path, *args, _orig=original, _name=name, **kwargs):
            seen[_name] = kwargs.get("trust_remote_code", "absent")
            return _orig(klass, path, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
        load_component(info)
    assert seen == {"tokenizer": False, "text_encoder": False, "vae": "absent"}


def test_py_file_alone_is_inert_with_a_note(demo_model_dir: Path, tmp_path: Path):
    root = copy_model(demo_model_dir, tmp_path)
    (root / "pipeline.py").write_text(evil_code(root))
    (root / "transformer" / "custom_model.py").write_text(evil_code(root))
    model = discover_model(root)
    assert "ignored pipeline.py: code in a model directory is never run" in model.notes
    assert "ignored transformer/custom_model.py: code in a model directory is never run" in model.notes
    assert not (tmp_path / MARKER).exists()


# ----------------------------------------------------------------- 2. no pickle: stray files become notes

def test_stray_pickles_are_ignored_with_notes(demo_model_dir: Path, tmp_path: Path, capsys):
    root = copy_model(demo_model_dir, tmp_path)
    (root / "training_args.bin").write_bytes(b"\x80\x04K\x01.")
    (root / "text_encoder" / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")
    (root / "tokenizer" / "vocab.pkl").write_bytes(b"\x80\x04K\x01.")
    (root / "scheduler" / "state.pt").write_bytes(b"\x80\x04K\x01.")
    (root / "vae" / "old.ckpt").write_bytes(b"\x80\x04K\x01.")
    model = discover_model(root)
    expected = [f"ignored {p}: pickle files are never read" for p in (
        "training_args.bin", "text_encoder/pytorch_model.bin", "tokenizer/vocab.pkl", "scheduler/state.pt",
        "vae/old.ckpt")]
    assert sorted(model.notes) == sorted(expected)
    assert model.component("text_encoder").files == (root / "text_encoder" / "model.safetensors",)

    assert main(["plan", "--model", str(root), "--json"]) == 0
    assert sorted(json.loads(capsys.readouterr().out)["notes"]) == sorted(expected)
    assert main(["plan", "--model", str(root)]) == 0
    out = capsys.readouterr().out
    for note in expected:
        assert f"note: {note}" in out


def test_clean_model_has_no_notes(demo_model_dir: Path, capsys):
    assert discover_model(demo_model_dir).notes == ()
    assert main(["plan", "--model", str(demo_model_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"] == []


def test_pickle_only_tokenizer_folder_is_a_note_weights_folder_is_refused(demo_model_dir, tmp_path, capsys):
    root = copy_model(demo_model_dir, tmp_path)
    (root / "tokenizer" / "tokenizer.bin").write_bytes(b"\x80\x04K\x01.")
    assert "ignored tokenizer/tokenizer.bin: pickle files are never read" in discover_model(root).notes
    (root / "vae" / "diffusion_pytorch_model.safetensors").unlink()
    (root / "vae" / "diffusion_pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")
    assert_refused(root, capsys, "vae", "weights only in pickle format")


# ----------------------------------------------------------------- 3. no path leaves the directory

@pytest.mark.parametrize("name", ["../x", "/etc", "a/b", ".", "..", "", "a\\b", "a\0b", "..\\x"])
def test_component_names_are_plain_segments(name, demo_model_dir: Path, tmp_path: Path, capsys):
    root = copy_model(demo_model_dir, tmp_path)
    _index(name, ["diffusers", "AutoencoderKL"])(root)
    message = assert_refused(root, capsys, "model_index.json", "component name")
    assert "plain folder name" in message or "empty" in message


def _shard_index(root: Path, value: object) -> None:
    folder = root / "vae"
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"encoder.conv_in.weight": value}}))


@pytest.mark.parametrize("value,fragment", [
    ("../text_encoder/model.safetensors", "not a file inside"),
    ("/etc/passwd", "not a file inside"),
    ("sub/../../x.safetensors", "not a file inside"),
    ("a\\..\\b.safetensors", "not a file inside"),
    ("", "not a file inside"),
    (["diffusion_pytorch_model.safetensors"], "expected a file name, got list"),
    (5, "expected a file name, got int"),
    (None, "expected a file name, got NoneType"),
    ({"a": 1}, "expected a file name, got dict"),
])
def test_weight_map_values_name_files_inside(value, fragment, demo_model_dir, tmp_path, capsys):
    root = copy_model(demo_model_dir, tmp_path)
    _shard_index(root, value)
    assert_refused(root, capsys, "diffusion_pytorch_model.safetensors.index.json",
                   "weight_map['encoder.conv_in.weight']", fragment)


def _outside_copy(src: Path, tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    target = outside / src.name
    if src.is_dir():
        shutil.copytree(src, target)
    else:
        shutil.copy(src, target)
    return target


def _link_out(rel: str):
    def make(root: Path, tmp_path: Path) -> None:
        path = root / rel
        target = _outside_copy(path, tmp_path)
        shutil.rmtree(path) if path.is_dir() else path.unlink()
        path.symlink_to(target)
    return make


def _link_to(rel: str, target: str):
    def make(root: Path, tmp_path: Path) -> None:
        (root / rel).unlink()
        (root / rel).symlink_to(target)
    return make


LINK_CASES = {
    "weight file": _link_out("vae/diffusion_pytorch_model.safetensors"),
    "model_index.json": _link_out("model_index.json"),
    "component folder": _link_out("text_encoder"),
    "tokenizer file": _link_out("tokenizer/vocab.json"),
    "config file": _link_out("vae/config.json"),
    "system file": _link_to("tokenizer/merges.txt", "/etc/passwd"),
    "device": _link_to("vae/diffusion_pytorch_model.safetensors", "/dev/zero"),
    "relative escape": _link_to("vae/config.json", "../../outside/config.json"),
}


@pytest.mark.parametrize("case", sorted(LINK_CASES))
def test_symlinks_out_of_the_directory_are_refused(case, demo_model_dir: Path, tmp_path: Path, capsys):
    root = copy_model(demo_model_dir, tmp_path)
    LINK_CASES[case](root, tmp_path)
    assert_refused(root, capsys, "points outside the model directory")


@pytest.mark.parametrize("key,value", [("vocab_file", "/etc/passwd"), ("merges_file", "../../outside/merges.txt"),
                                       ("tokenizer_file", "/etc/hostname")])
def test_config_file_values_pointing_outside_are_refused(key, value, demo_model_dir, tmp_path, capsys):
    """Older transformers open `vocab_file` & co. as the tokenizer config writes them."""
    root = copy_model(demo_model_dir, tmp_path)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "merges.txt").write_text("#version: 0.2\n")
    if not (root / "tokenizer" / value).exists():
        pytest.skip(f"{value} does not exist on this machine")
    _set("tokenizer", "tokenizer_config.json", key, value)(root)
    assert_refused(root, capsys, "tokenizer_config.json", f"'{key}'", "a file outside the model directory")


def test_config_file_values_that_are_stale_or_inside_are_fine(demo_model_dir: Path, tmp_path: Path):
    """A creator's absolute cache path that does not exist here, or a file of the model itself, is harmless."""
    root = copy_model(demo_model_dir, tmp_path)
    _set("tokenizer", "tokenizer_config.json", "tokenizer_file", "/home/creator/.cache/hf/tokenizer.json")(root)
    _set("tokenizer", "tokenizer_config.json", "vocab_file", "../tokenizer/vocab.json")(root)
    assert discover_model(root).component("tokenizer").class_name == "CLIPTokenizer"


def test_symlinks_inside_the_directory_are_fine(demo_model_dir: Path, tmp_path: Path):
    root = copy_model(demo_model_dir, tmp_path)
    (root / "blobs").mkdir()
    weights = root / "vae" / "diffusion_pytorch_model.safetensors"
    weights.rename(root / "blobs" / "vae-weights")
    weights.symlink_to("../blobs/vae-weights")
    (root / "tokenizer" / "vocab.json").rename(root / "blobs" / "vocab")
    (root / "tokenizer" / "vocab.json").symlink_to(root / "blobs" / "vocab")  # absolute, still inside
    model = discover_model(root)
    assert model.component("vae").nbytes == discover_model(demo_model_dir).component("vae").nbytes
    assert model.notes == ()


def test_hub_cache_snapshot_links_into_its_blob_store(demo_model_dir: Path, tmp_path: Path, capsys):
    """A model in the Hugging Face cache: every file links to ../../blobs of the same repository."""
    repo = tmp_path / "hub" / "models--org--demo"
    snapshot = repo / "snapshots" / "0123abc"
    (repo / "blobs").mkdir(parents=True)
    for i, src in enumerate(sorted(p for p in demo_model_dir.rglob("*") if p.is_file())):
        rel = src.relative_to(demo_model_dir)
        (snapshot / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, repo / "blobs" / f"blob{i}")
        (snapshot / rel).symlink_to(os.path.relpath(repo / "blobs" / f"blob{i}", (snapshot / rel).parent))
    assert discover_model(snapshot).nbytes == discover_model(demo_model_dir).nbytes
    # the blob store of one repository, not anything else in the cache
    (snapshot / "vae" / "config.json").unlink()
    other = tmp_path / "hub" / "models--org--other" / "blobs"
    other.mkdir(parents=True)
    shutil.copy(demo_model_dir / "vae" / "config.json", other / "cfg")
    (snapshot / "vae" / "config.json").symlink_to(other / "cfg")
    assert_refused(snapshot, capsys, "points outside the model directory")


# ----------------------------------------------------------------- 3b. only regular files are opened

def test_fifo_weight_file_is_refused_without_blocking(demo_model_dir: Path, tmp_path: Path, capsys):
    root = copy_model(demo_model_dir, tmp_path)
    weights = root / "vae" / "diffusion_pytorch_model.safetensors"
    weights.unlink()
    os.mkfifo(weights)
    assert_refused(root, capsys, str(weights), "is a FIFO, not a regular file")


@pytest.mark.parametrize("rel", ["model_index.json", "vae/config.json", "tokenizer/vocab.json",
                                 "scheduler/scheduler_config.json"])
def test_fifo_anywhere_read_is_refused_without_blocking(rel, demo_model_dir: Path, tmp_path: Path, capsys):
    root = copy_model(demo_model_dir, tmp_path)
    (root / rel).unlink()
    os.mkfifo(root / rel)
    assert_refused(root, capsys, rel, "is a FIFO")


def test_weight_file_that_is_a_directory_is_refused(demo_model_dir: Path, tmp_path: Path, capsys):
    root = copy_model(demo_model_dir, tmp_path)
    weights = root / "vae" / "diffusion_pytorch_model.safetensors"
    weights.unlink()
    weights.mkdir()
    assert_refused(root, capsys, str(weights), "is a directory, not a regular file")


def test_shard_that_is_a_fifo_is_refused(demo_model_dir: Path, tmp_path: Path, capsys):
    root = copy_model(demo_model_dir, tmp_path)
    os.mkfifo(root / "vae" / "shard-00001-of-00001.safetensors")
    _shard_index(root, "shard-00001-of-00001.safetensors")
    assert_refused(root, capsys, "shard-00001-of-00001.safetensors", "is a FIFO")


def test_unreadable_weight_file_says_permission_denied_chmod(demo_model_dir: Path, tmp_path: Path, capsys):
    root = copy_model(demo_model_dir, tmp_path)
    weights = root / "vae" / "diffusion_pytorch_model.safetensors"
    weights.chmod(0)
    try:
        if os.access(weights, os.R_OK):
            pytest.skip("running as a user who can read a mode-000 file (root)")
        assert_refused(root, capsys, str(weights), "permission denied")
    finally:
        weights.chmod(0o644)


def test_unreadable_weight_file_says_permission_denied(demo_model_dir, tmp_path, capsys, monkeypatch):
    """Simulated (root reads mode-000 files): opening the weight file fails with EACCES."""
    root = copy_model(demo_model_dir, tmp_path)
    weights = root / "vae" / "diffusion_pytorch_model.safetensors"
    real_open = os.open

    def guarded_open(path, *args, **kwargs):
        if Path(path) == weights:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", guarded_open)
    message = assert_refused(root, capsys, str(weights), "cannot read (permission denied)")
    assert "not found" not in message and "no such file" not in message


# ----------------------------------------------------------------- 4. hostile JSON

def _deep(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


JSON_CASES = {
    "deep model_index": ("model_index.json", '{"a": ' + _deep() + "}", "nested too deeply"),
    "deep component config": ("vae/config.json", '{"a": ' + _deep() + "}", "nested too deeply"),
    "deep tokenizer config": ("tokenizer/tokenizer_config.json", _deep(), "nested too deeply"),
    "not utf-8": ("model_index.json", b'{"_class_name": "\xff\xfe"}', "not UTF-8"),
    "not utf-8 config": ("text_encoder/config.json", b"\xc3\x28{}", "not UTF-8"),
    "not an object": ("model_index.json", "[1, 2]", "expected a JSON object, got list"),
    "config not an object": ("vae/config.json", '"text"', "expected a JSON object, got str"),
    "huge integer": ("vae/config.json", '{"a": ' + "9" * 10_000 + "}", "malformed JSON"),
    "malformed shard index": ("vae/diffusion_pytorch_model.safetensors.index.json", "{", "malformed JSON"),
    "empty weight_map": ("vae/diffusion_pytorch_model.safetensors.index.json", '{"weight_map": {}}',
                         "missing or empty 'weight_map'"),
    "deep safetensors header": ("vae/diffusion_pytorch_model.safetensors", None, "corrupt safetensors header"),
    "weight_map a list": ("vae/diffusion_pytorch_model.safetensors.index.json", '{"weight_map": [1]}',
                          "missing or empty 'weight_map'"),
}


@pytest.mark.parametrize("case", sorted(JSON_CASES))
def test_hostile_json_is_one_line(case, demo_model_dir: Path, tmp_path: Path, capsys):
    rel, content, fragment = JSON_CASES[case]
    root = copy_model(demo_model_dir, tmp_path)
    path = root / rel
    if content is None:  # a safetensors file whose header JSON is nested 100 000 deep
        header = ('{"a": ' + _deep() + "}").encode()
        content = struct.pack("<Q", len(header)) + header
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert_refused(root, capsys, rel, fragment)


def test_component_entry_not_a_pair(demo_model_dir: Path, tmp_path: Path, capsys):
    root = copy_model(demo_model_dir, tmp_path)
    _index("vae", ["diffusers", "AutoencoderKL", "extra"])(root)
    assert_refused(root, capsys, "model_index.json", "must be [library, class]")
