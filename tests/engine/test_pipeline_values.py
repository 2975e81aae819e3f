"""Pipeline-level values of model_index.json: plain JSON only, refused in one line (exit 2) otherwise, and
checked against the pipeline's `__init__` before any weight is read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_hostile_dirs import assert_refused, copy_model, edit_json

from omni_console.console.cli import main
from omni_console.engine.engine import Engine
from omni_console.engine.errors import ModelDirError
from omni_console.engine.events import LoadProgress
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.offload.policy import build_policy

HOSTILE = {
    "objects nested four deep": ({"a": {"b": {"c": {"d": 1}}}}, "got containers nested more than 3 deep"),
    "lists nested four deep": ([[[[1.0]]]], "got containers nested more than 3 deep"),
    "an object of many entries": ({str(i): i for i in range(1000)}, "an object of 1000 entries"),
    "an object with a huge key": ({"k" * 5000: 1}, "string of 5000 characters"),
    "a huge string": ("x" * 100_000, "string of 100000 characters"),
    "a huge list": (list(range(10_000)), "list of 10000 items"),
}


TARGETS = {"target_names": ["albedo", "material"], "material": {"sub_target_names": ["roughness", None, None]}}
"""Shaped as Marigold intrinsics' `target_properties`: objects and lists three deep."""


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_pipeline_value_is_refused_at_discovery(case: str, demo_model_dir: Path, tmp_path: Path, capsys):
    value, fragment = HOSTILE[case]
    root = copy_model(demo_model_dir, tmp_path)
    edit_json(root / "model_index.json", lambda d: d.__setitem__("boundary_ratio", value))
    assert_refused(root, capsys, "model_index.json", "'boundary_ratio'", fragment)


def test_plain_values_are_kept_and_null_components_skipped(demo_model_dir: Path, tmp_path: Path):
    root = copy_model(demo_model_dir, tmp_path)
    edit_json(root / "model_index.json", lambda d: d.update(
        some_ratio=0.5, some_flag=True, some_sizes=[[1, 2], [3, 4]], image_encoder=[None, None],
        _use_default_values=["ignored"], ignored=3, some_targets=TARGETS))
    model = discover_model(root)
    assert model.pipeline_values == {"some_ratio": 0.5, "some_flag": True, "some_sizes": [[1, 2], [3, 4]],
                                     "some_targets": TARGETS}
    assert "image_encoder" not in {c.name for c in model.components}


@pytest.fixture(scope="module")
def ti2v_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_families_loading import build_tiny_loading_family

    return build_tiny_loading_family("wan22_ti2v", tmp_path_factory.mktemp("models") / "ti2v")


def test_value_of_the_wrong_type_is_refused_before_any_weight_is_read(ti2v_dir: Path, tmp_path: Path, capsys):
    root = tmp_path / "ti2v"
    shutil.copytree(ti2v_dir, root)
    edit_json(root / "model_index.json", lambda d: d.__setitem__("expand_timesteps", "yes"))
    engine = Engine(root, device="cpu")  # discovery accepts a plain string
    sub = engine.bus.subscribe()
    with pytest.raises(ModelDirError) as info:
        engine.load(build_policy({}, 0))
    assert "'expand_timesteps' must be bool for WanPipeline, got 'yes'" in str(info.value)
    assert not [e for e in sub.drain() if isinstance(e, LoadProgress)]  # nothing was read
    engine.close()
    code = main(["run", "--model", str(root), "--device", "cpu", "--prompt", "x", "--output", str(tmp_path / "o.png")])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert code == 2 and "Traceback" not in err
    assert last.startswith("omni-console: error:") and "'expand_timesteps' must be bool" in last


def test_required_component_saved_as_null_is_refused(ti2v_dir: Path, tmp_path: Path):
    """diffusers accepts `[null, null]` only for a pipeline's optional components; so do we."""
    root = tmp_path / "ti2v"
    shutil.copytree(ti2v_dir, root)
    index = json.loads((root / "model_index.json").read_text())
    assert index["transformer_2"] == [None, None]  # optional: passed as None (the t2v fixture runs)
    edit_json(root / "model_index.json", lambda d: d.__setitem__("text_encoder", [None, None]))
    engine = Engine(root, device="cpu")
    with pytest.raises(ModelDirError, match="WanPipeline needs text_encoder, which the directory does not provide"):
        engine.load(build_policy({}, 0))
    engine.close()
