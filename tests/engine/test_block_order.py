"""DiT block order and config/tensor agreement, found without building the model.

The execution order and each block list's config key are read from diffusers' source; these tests
check both against real (tiny) model instances, check that a hostile config's numbers cost nothing
(`num_layers: 1000000` is refused in bounded time and memory), and that every disagreement between
config and tensors is one line and exit 2 before anything loads.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from omni_console.console.cli import main
from omni_console.engine.model_dir.blocks import check_config_block_counts, registration_order
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.model_dir.init_layout import init_layout
from omni_console.engine.model_dir.weights import ModelDirError, TensorInfo

FAMILIES = ["demo_model_dir", "sd3_model_dir", "pixart_model_dir", "wan_model_dir"]
MB = 1024 * 1024


def dit_folder(root: Path) -> Path:
    (dit,) = discover_model(root).dits
    return dit.folder


def hostile_copy(source: Path, tmp_path: Path, **config_changes) -> Path:
    """A copy of a fixture model whose DiT config.json has `config_changes` applied (None: key removed)."""
    root = tmp_path / "model"
    shutil.copytree(source, root)
    config_path = root / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    for key, value in config_changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    config_path.write_text(json.dumps(config))
    return root


def plan_error(root: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Run `omni-console plan --model root`; assert exit 2 with exactly one error line; return it."""
    code = main(["plan", "--model", str(root)])
    captured = capsys.readouterr()
    assert code == 2, captured
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("omni-console: error: "), captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    return lines[0]


# --- the order and the counts agree with what diffusers builds ----------------------------------

@pytest.mark.parametrize("fixture", FAMILIES)
def test_source_order_and_counts_match_a_built_model(request: pytest.FixtureRequest, fixture: str):
    import diffusers

    root: Path = request.getfixturevalue(fixture)
    (dit,) = discover_model(root).dits  # every family passes the config check
    config = json.loads((dit.folder / "config.json").read_text())
    model = getattr(diffusers, dit.class_name).from_config(config)  # tiny: the test's oracle only
    children = [name for name, _ in model.named_children()]

    layout = init_layout(dit.class_name)
    assert layout is not None
    assert [a for a in layout.order if a in children] == children
    assert [b.attr for b in dit.block_lists] == [a for a in children if a in {b.attr for b in dit.block_lists}]
    counted = {c.attr: c.key for c in layout.counts}
    assert {b.attr for b in dit.block_lists} <= set(counted)  # every block list is checked
    for block_list in dit.block_lists:
        assert len(getattr(model, block_list.attr)) == config[counted[block_list.attr]] == block_list.count


def test_demo_order_is_double_then_single_blocks(demo_model_dir: Path):
    (dit,) = discover_model(demo_model_dir).dits
    assert [b.attr for b in dit.block_lists] == ["transformer_blocks", "single_transformer_blocks"]


def test_source_order_follows_setattr_loops():
    """Kandinsky 6 registers its two text-block lists with `setattr(self, f"{prefix}_...", ...)` in a loop."""
    layout = init_layout("Kandinsky6Transformer3DModel")
    if layout is None:
        pytest.skip("this diffusers has no Kandinsky6Transformer3DModel")
    lists = [a for a in layout.order if a.endswith("transformer_blocks")]
    assert lists == ["video_text_transformer_blocks", "audio_text_transformer_blocks", "visual_transformer_blocks"]


@pytest.mark.parametrize("name", ["NoSuchTransformer", "__class__", "os.system", "../../etc/passwd", "", "_x"])
def test_unknown_or_odd_class_names_fall_back(name: str):
    assert init_layout(name) is None
    assert registration_order("diffusers", name) is None
    check_config_block_counts(Path("x"), "diffusers", name, {"num_layers": "bad"}, [])  # nothing to check


def test_discovery_builds_no_module(demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch):
    import torch

    def refuse(*args, **kwargs):
        raise AssertionError("discovery built a torch module")

    monkeypatch.setattr(torch.nn.Module, "__init__", refuse)
    init_layout.cache_clear()
    (dit,) = discover_model(demo_model_dir).dits
    assert [(b.attr, b.count) for b in dit.block_lists] == [("transformer_blocks", 2), ("single_transformer_blocks", 4)]


# --- a hostile config costs nothing -------------------------------------------------------------

BOUNDED_RUN = textwrap.dedent("""
    import json, resource, sys, time
    from omni_console.engine.model_dir.discovery import discover_model
    from omni_console.engine.model_dir.weights import ModelDirError

    def peak_bytes():
        # VmHWM is this process's own peak: ru_maxrss on Linux keeps the forking parent's peak across exec
        try:
            with open("/proc/self/status") as status:
                for line in status:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss if sys.platform == "darwin" else rss * 1024

    discover_model(sys.argv[1])  # the honest model first: whatever discovery imports, imported now
    warm = peak_bytes()
    start = time.perf_counter()
    try:
        discover_model(sys.argv[2])
        outcome = "accepted"
    except ModelDirError as exc:
        outcome = str(exc)
    print(json.dumps({"outcome": outcome, "seconds": time.perf_counter() - start,
                      "warm": warm, "peak": peak_bytes()}))
""")


def test_million_layers_refused_in_bounded_time_and_memory(demo_model_dir: Path, tmp_path: Path):
    root = hostile_copy(demo_model_dir, tmp_path, num_layers=1_000_000)
    try:
        run = subprocess.run([sys.executable, "-c", BOUNDED_RUN, str(demo_model_dir), str(root)],
                             capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("discovering a config with num_layers = 1000000 ran past 120 s")
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert "num_layers = 1000000 but the weights hold 2 transformer_blocks" in result["outcome"]
    assert result["seconds"] < 5.0, result
    assert result["peak"] < 500 * MB, result  # the whole process: interpreter, torch, diffusers, discovery
    assert result["peak"] - result["warm"] < 50 * MB, result  # what the hostile numbers added


COLD_ORDER_AND_CHECK = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    start = time.perf_counter()
    from omni_console.engine.model_dir.blocks import check_config_block_counts, registration_order
    from omni_console.engine.model_dir.weights import ModelDirError, TensorInfo
    tensors = [TensorInfo(f"transformer_blocks.{i}.w", "float32", (2,), Path("w")) for i in range(2)]
    order = registration_order("diffusers", "FluxTransformer2DModel")
    try:
        check_config_block_counts(Path("t"), "diffusers", "FluxTransformer2DModel",
                                  {"num_layers": 1000000, "num_single_layers": 0}, tensors)
        outcome = "accepted"
    except ModelDirError as exc:
        outcome = str(exc)
    print(json.dumps({"order": order, "outcome": outcome, "seconds": time.perf_counter() - start,
                      "imported": [m for m in ("torch", "diffusers", "transformers") if m in sys.modules]}))
""")


def test_order_and_check_import_no_model_code():
    """Cold, in a fresh process: the order and the check read source text; torch and diffusers stay unloaded."""
    run = subprocess.run([sys.executable, "-c", COLD_ORDER_AND_CHECK], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["imported"] == []
    order = result["order"]
    assert order.index("transformer_blocks") < order.index("single_transformer_blocks")
    assert "num_layers = 1000000 but the weights hold 2 transformer_blocks" in result["outcome"]
    assert result["seconds"] < 5.0, result


def test_million_layers_in_process_is_quick(demo_model_dir: Path, tmp_path: Path):
    import time

    discover_model(demo_model_dir)  # warm imports and caches
    root = hostile_copy(demo_model_dir, tmp_path, num_layers=1_000_000)
    start = time.perf_counter()
    with pytest.raises(ModelDirError, match=r"num_layers = 1000000 .*config and tensors disagree"):
        discover_model(root)
    assert time.perf_counter() - start < 5.0


# --- every disagreement is one line, exit 2 ------------------------------------------------------

def test_plan_refuses_million_layers_with_one_line(demo_model_dir: Path, tmp_path: Path, capsys):
    line = plan_error(hostile_copy(demo_model_dir, tmp_path, num_layers=1_000_000), capsys)
    assert "transformer/config.json: num_layers = 1000000 but the weights hold 2 transformer_blocks" in line
    assert "config and tensors disagree" in line


def test_plan_refuses_fewer_layers_than_tensors(demo_model_dir: Path, tmp_path: Path, capsys):
    line = plan_error(hostile_copy(demo_model_dir, tmp_path, num_layers=1), capsys)
    assert "num_layers = 1 but the weights hold 2 transformer_blocks" in line


def test_plan_refuses_wrong_second_list_count(demo_model_dir: Path, tmp_path: Path, capsys):
    line = plan_error(hostile_copy(demo_model_dir, tmp_path, num_single_layers=5), capsys)
    assert "num_single_layers = 5 but the weights hold 4 single_transformer_blocks" in line


def test_a_count_the_config_leaves_out_is_not_checked(demo_model_dir: Path, tmp_path: Path):
    """Only what the config says is checked: without num_layers the tensors alone decide."""
    (dit,) = discover_model(hostile_copy(demo_model_dir, tmp_path, num_layers=None)).dits
    assert [(b.attr, b.count) for b in dit.block_lists] == [("transformer_blocks", 2), ("single_transformer_blocks", 4)]


@pytest.mark.parametrize("value,shown", [
    ("2", '"2"'), (2.0, "2.0"), (-1, "-1"), (-(10 ** 30), "-1000000000000000000000000000000"),
    (True, "true"), ([2], "[2]"), ({"n": 2}, '{"n": 2}'),
])
def test_plan_refuses_a_count_that_is_not_a_whole_number(demo_model_dir, tmp_path, capsys, value, shown):
    line = plan_error(hostile_copy(demo_model_dir, tmp_path, num_layers=value), capsys)
    assert f"num_layers = {shown} is not a block count (expected a whole number >= 0)" in line


def test_plan_refuses_null_count(demo_model_dir: Path, tmp_path: Path, capsys):
    root = hostile_copy(demo_model_dir, tmp_path)
    config_path = root / "transformer" / "config.json"
    config_path.write_text(config_path.read_text().replace('"num_layers": 2', '"num_layers": null'))
    assert "num_layers = null is not a block count" in plan_error(root, capsys)


def rewrite_dit_tensors(root: Path, rename) -> None:
    """Rewrite the DiT's tensors through `rename(name) -> new name or None (dropped)`."""
    (file,) = (root / "transformer").glob("*.safetensors")
    tensors = load_file(file)
    save_file({new: t for name, t in tensors.items() if (new := rename(name))}, str(file))


def test_plan_refuses_config_list_with_no_tensors(demo_model_dir: Path, tmp_path: Path, capsys):
    root = hostile_copy(demo_model_dir, tmp_path)
    rewrite_dit_tensors(root, lambda n: None if n.startswith("single_transformer_blocks.") else n)
    line = plan_error(root, capsys)
    assert "num_single_layers = 4 but the weights hold 0 single_transformer_blocks" in line


def test_plan_refuses_blocks_numbered_with_a_gap(demo_model_dir: Path, tmp_path: Path, capsys):
    root = hostile_copy(demo_model_dir, tmp_path)
    rewrite_dit_tensors(root, lambda n: n.replace("transformer_blocks.1.", "transformer_blocks.7.", 1)
                        if n.startswith("transformer_blocks.1.") else n)
    line = plan_error(root, capsys)
    assert "num_layers = 2 but the weights' transformer_blocks are not numbered 0..1" in line


def test_zero_layers_with_no_tensors_is_accepted(tmp_path: Path):
    folder = tmp_path / "transformer"
    tensors = [TensorInfo(f"single_transformer_blocks.{i}.w", "float32", (2,), folder / "w.safetensors")
               for i in range(3)]
    config = {"num_layers": 0, "num_single_layers": 3}
    assert check_config_block_counts(folder, "diffusers", "FluxTransformer2DModel", config, tensors) is None
    with pytest.raises(ModelDirError, match="num_layers = 1"):  # the same tensors refuse a count they lack
        check_config_block_counts(folder, "diffusers", "FluxTransformer2DModel", {**config, "num_layers": 1}, tensors)


# --- any JSON value: accepted only when it is the count the tensors hold -------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10 ** 40), max_value=10 ** 40)
    | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
HELD = [TensorInfo(f"{attr}.{i}.w", "float32", (2,), Path("w.safetensors"))
        for attr, n in (("transformer_blocks", 2), ("single_transformer_blocks", 4)) for i in range(n)]


@settings(max_examples=150, deadline=None)
@given(value=JSON_VALUES)
def test_any_count_value_is_accepted_only_when_it_matches(value):
    config = {"num_layers": value, "num_single_layers": 4}
    matches = isinstance(value, int) and not isinstance(value, bool) and value == 2
    try:
        check_config_block_counts(Path("t"), "diffusers", "FluxTransformer2DModel", config, HELD)
    except ModelDirError as exc:
        assert not matches
        line = str(exc)
        assert "\n" not in line and len(line) < 200 and "num_layers = " in line
    else:
        assert matches
