"""Shared fixtures: offline environment and tiny real diffusers models built once per session."""

from __future__ import annotations

import os

# huggingface_hub reads these at import time, so set them before anything imports diffusers.
# (There is no DIFFUSERS_OFFLINE: diffusers follows huggingface_hub's HF_HUB_OFFLINE.)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point OMNI_CONSOLE_CACHE_DIR at a session tmp dir so tests never touch the user's cache."""
    cache = tmp_path_factory.mktemp("omni-console-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMNI_CONSOLE_CACHE_DIR", str(cache))
        yield cache


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Flux demo pipeline (seed 0), built once per session."""
    from omni_console.engine.demo_model import build_demo_model

    return build_demo_model(tmp_path_factory.mktemp("models") / "demo-flux", seed=0)
