"""Issue 23 items 1 and 7: every file a shard index names is a `.safetensors` file we checked (a library
picks `torch.load` for any other suffix), and a name no file system can hold is one line, not a traceback."""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from no_pickle_guard import no_unpickling  # noqa: F401  (fixture)

from omni_console.console.cli import main
from omni_console.engine.engine import Engine, EngineState
from omni_console.offload.policy import build_policy

pytestmark = pytest.mark.usefixtures("no_unpickling")  # any pickle parse fails the test


def copy_model(src: Path, tmp_path: Path) -> Path:
    root = tmp_path / "model"
    shutil.copytree(src, root)
    return root


def shard(root: Path, component: str, weights: str, shard_name: str, index_name: str,
          content: bytes | None = None) -> None:
    """Turn a component's single file into a one-shard index naming `shard_name` (safetensors bytes
    under that name unless `content` is given)."""
    folder = root / component
    single = folder / weights
    names = list(json.loads(single.read_bytes()[8:8 + int.from_bytes(single.read_bytes()[:8], "little")]))
    (folder / shard_name).write_bytes(single.read_bytes() if content is None else content)
    single.unlink()
    tensor_names = [n for n in names if n != "__metadata__"]
    (folder / index_name).write_text(json.dumps({"metadata": {}, "weight_map": {n: shard_name for n in tensor_names}}))


def plan_refused(root: Path, capsys, *fragments: str) -> str:
    assert main(["plan", "--model", str(root)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured.err
    assert captured.err.startswith("omni-console: error: ")
    for fragment in fragments:
        assert fragment in captured.err, captured.err
    return captured.err


@pytest.mark.parametrize("content", ["safetensors", "pickle"])
@pytest.mark.parametrize("component,weights,index,shard_name", [
    ("text_encoder", "model.safetensors", "model.safetensors.index.json", "model-00001-of-00001.bin"),
    ("transformer", "diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors.index.json",
     "diffusion_pytorch_model-00001-of-00001.pt"),
    ("vae", "diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors.index.json", "shard.data"),
])
def test_index_naming_a_non_safetensors_shard_is_refused_before_anything_loads(
        content, component, weights, index, shard_name, demo_model_dir, tmp_path, capsys):
    root = copy_model(demo_model_dir, tmp_path)
    shard(root, component, weights, shard_name, index,
          content=pickle.dumps({"x": 1}) if content == "pickle" else None)
    plan_refused(root, capsys, f"{component}/{index}", repr(shard_name), "not a .safetensors file")
    out = tmp_path / "o.png"
    assert main(["run", "--model", str(root), "--device", "cpu", "--steps", "1", "--output", str(out)]) == 2
    assert "not a .safetensors file" in capsys.readouterr().err and not out.exists()


def test_an_unread_variant_index_naming_a_pickle_is_refused_too(demo_model_dir, tmp_path, capsys):
    """Another variant's index is not what we read, but `--variant` or a library could read it."""
    root = copy_model(demo_model_dir, tmp_path)
    folder = root / "text_encoder"
    shutil.copy(folder / "model.safetensors", folder / "model-00001-of-00001.fp16.bin")
    (folder / "model.safetensors.index.fp16.json").write_text(
        json.dumps({"weight_map": {"text_model.final_layer_norm.weight": "model-00001-of-00001.fp16.bin"}}))
    plan_refused(root, capsys, "model.safetensors.index.fp16.json", "not a .safetensors file")


def test_a_safetensors_shard_index_still_loads_without_any_pickle(demo_model_dir, tmp_path):
    root = copy_model(demo_model_dir, tmp_path)
    shard(root, "text_encoder", "model.safetensors", "model-00001-of-00001.safetensors", "model.safetensors.index.json")
    (root / "text_encoder" / "pytorch_model.bin").write_bytes(pickle.dumps({"x": 1}))  # beside it: never read
    engine = Engine(root, device="cpu")
    try:
        engine.load(build_policy(None, 0))
        assert engine.state == EngineState.READY, engine.failure
    finally:
        engine.close()


def test_an_index_rewritten_after_discovery_is_checked_again_at_load(demo_model_dir, tmp_path):
    """The library reads the index as it is at load time: its names are checked again then."""
    root = copy_model(demo_model_dir, tmp_path)
    shard(root, "text_encoder", "model.safetensors", "model-00001-of-00001.safetensors", "model.safetensors.index.json")
    engine = Engine(root, device="cpu")
    try:
        folder = root / "text_encoder"
        (folder / "model-00001-of-00001.safetensors").rename(folder / "model-00001-of-00001.bin")
        index = folder / "model.safetensors.index.json"
        index.write_text(index.read_text().replace(".safetensors\"", ".bin\""))
        with pytest.raises(Exception, match="not a .safetensors file"):
            engine.load(build_policy(None, 0))
        assert engine.state == EngineState.FAILED
    finally:
        engine.close()


# ------------------------------------------------------------------ item 7: names past NAME_MAX

def test_a_component_name_longer_than_a_file_name_is_one_short_line(demo_model_dir, tmp_path, capsys):
    root = copy_model(demo_model_dir, tmp_path)
    index = json.loads((root / "model_index.json").read_text())
    index["v" * 1_000_000] = index.pop("vae")
    (root / "model_index.json").write_text(json.dumps(index))
    line = plan_refused(root, capsys, "component name", "bytes long (a file name has at most 255)")
    assert len(line) < 400


@pytest.mark.parametrize("name", ["s" * 300 + ".safetensors", "sub/" + "é" * 200 + ".safetensors"])
def test_a_weight_map_name_longer_than_a_file_name_is_one_short_line(name, demo_model_dir, tmp_path, capsys):
    root = copy_model(demo_model_dir, tmp_path)
    shard(root, "vae", "diffusion_pytorch_model.safetensors", "x.safetensors",
          "diffusion_pytorch_model.safetensors.index.json")
    index = root / "vae" / "diffusion_pytorch_model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"] = {k: name for k in doc["weight_map"]}
    index.write_text(json.dumps(doc))
    line = plan_refused(root, capsys, "file name", "bytes long (a file name has at most 255)")
    assert len(line) < 400


# ------------------------------------------------------------------ item 6: a file that shrinks while it loads

SHRINK_WHILE_MAPPED = """
import sys
from pathlib import Path
import transformers.modeling_utils as tm
from omni_console.console.cli import main

opened = tm.safe_open

def open_then_shrink(path, *args, **kwargs):
    handle = opened(path, *args, **kwargs)  # mapped; then someone cuts the file short
    if "text_encoder" in str(path):
        Path(path).open("r+b").truncate(4096)
    return handle

tm.safe_open = open_then_shrink
sys.argv = ["omni-console", *sys.argv[1:]]
sys.exit(main())
"""


@pytest.mark.slow
def test_a_mapped_file_cut_short_during_the_load_is_one_line_not_sigbus(demo_model_dir, tmp_path):
    """The libraries map safetensors files (as the plain pipeline does); one that shrinks meanwhile raises
    SIGBUS on the next read, which Python cannot catch: a native handler says one line and exits 1."""
    import subprocess
    import sys

    root = copy_model(demo_model_dir, tmp_path)
    proc = subprocess.run([sys.executable, "-c", SHRINK_WHILE_MAPPED, "run", "--model", str(root), "--device", "cpu",
                           "--output", str(tmp_path / "o.png")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    lines = [line for line in proc.stderr.splitlines() if "fail" in line or "rror" in line]
    assert lines == ["omni-console: error: a model file shrank while it was read (bus error: is something "
                     "rewriting the model directory?)"], proc.stderr[-2000:]
    assert not (tmp_path / "o.png").exists()


def test_an_encoder_truncated_as_it_loads_is_one_line_and_exit_1(demo_model_dir, tmp_path, capsys, monkeypatch):
    from omni_console.engine.loading import loader

    root = copy_model(demo_model_dir, tmp_path)
    original = loader.load_component

    def truncate_then_load(info):
        if info.name == "text_encoder":  # after discovery checked it, as the library opens it
            weights = info.folder / "model.safetensors"
            with weights.open("r+b") as f:
                f.truncate(weights.stat().st_size // 2)
        return original(info)

    monkeypatch.setattr(loader, "load_component", truncate_then_load)
    out = tmp_path / "o.png"
    assert main(["run", "--model", str(root), "--device", "cpu", "--output", str(out)]) == 1
    err = capsys.readouterr().err
    failing = [line for line in err.splitlines() if "fail" in line or "rror" in line]
    assert len(failing) == 1 and failing[0].startswith("omni-console: load failed: "), err
    assert "text_encoder" in failing[0] and not out.exists()


def test_bus_errors_on_several_threads_at_once_print_the_one_line_once():
    """The load reads on several threads, so several can fault together: still one line, exit 1."""
    code = (
        "import signal, threading, time\n"
        "from omni_console.engine.loading.bus_error import install_bus_error_line\n"
        "assert install_bus_error_line()\n"
        "go = threading.Barrier(4)\n"
        "def fault():\n"
        "    go.wait()\n"
        "    signal.pthread_kill(threading.get_ident(), signal.SIGBUS)\n"
        "    time.sleep(10)\n"
        "threads = [threading.Thread(target=fault) for _ in range(4)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.count("a model file shrank while it was read") == 1, proc.stderr
