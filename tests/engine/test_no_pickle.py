"""No code path from discovery to a loaded, placed pipeline ever unpickles: every unpickling entry point
raises for the whole of discovery + load + unload, for every model family the engine supports."""

# ruff: noqa: F811  (the no_unpickling fixture is imported, then named by the tests)
from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest
import torch
from no_pickle_guard import Unpickled, no_unpickling  # noqa: F401  (fixture)

from omni_console.engine.engine import Engine, EngineState
from omni_console.offload.policy import build_policy


def test_the_patches_bite(no_unpickling, tmp_path: Path):
    """The guard is real: torch.load and pickle both raise under it."""
    with pytest.raises(Unpickled):
        torch.load(tmp_path / "x.pt")
    with pytest.raises(Unpickled):
        pickle.loads(pickle.dumps(1))
    with pytest.raises(Unpickled):
        pickle.Unpickler(None)


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["demo_model_dir", "sd3_model_dir", "pixart_model_dir", "wan_model_dir"])
def test_load_and_unload_never_unpickle(fixture, request, tmp_path: Path, no_unpickling):
    if fixture == "wan_model_dir":
        request.getfixturevalue("wan_loadable")
    root = tmp_path / "model"
    shutil.copytree(request.getfixturevalue(fixture), root)
    # pickles beside every component (and at the top) that a careless loader might pick up
    (root / "stray.pkl").write_bytes(pickle.dumps({"x": 1}))
    for component in (p for p in root.iterdir() if p.is_dir()):
        (component / "pytorch_model.bin").write_bytes(pickle.dumps({"x": 1}))
    engine = Engine(root, device="cpu")
    assert all("pickle files are never read" in n for n in engine.model.notes) and engine.model.notes
    engine.load(build_policy(None, 0))
    assert engine.state == EngineState.READY, engine.failure
    engine.unload()
    assert engine.state == EngineState.UNLOADED
    engine.close()
