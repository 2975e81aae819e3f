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
    from omni_console.engine.demo.demo_model import build_demo_model

    return build_demo_model(tmp_path_factory.mktemp("models") / "demo-flux", seed=0)


@pytest.fixture(scope="session")
def sd3_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny StableDiffusion3Pipeline (2 CLIP + T5, 3 MMDiT blocks), built once per session."""
    from tiny_families import build_tiny_sd3

    return build_tiny_sd3(tmp_path_factory.mktemp("models") / "sd3", seed=0)


@pytest.fixture(scope="session")
def pixart_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny PixArtSigmaPipeline (T5, 4 DiT blocks), built once per session."""
    from tiny_families import build_tiny_pixart_sigma

    return build_tiny_pixart_sigma(tmp_path_factory.mktemp("models") / "pixart-sigma", seed=0)


@pytest.fixture(scope="session")
def wan_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny WanPipeline (UMT5, 3 video DiT blocks, Wan VAE), built once per session.

    Loading it with diffusers 0.42 needs ``accelerate`` (see ``wan_loadable``).
    """
    from tiny_families import build_tiny_wan

    return build_tiny_wan(tmp_path_factory.mktemp("models") / "wan", seed=0)


@pytest.fixture(scope="session")
def ltx_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny LTXPipeline (T5, 3 video DiT blocks, LTX video VAE with 8x temporal compression)."""
    from tiny_families import build_tiny_ltx

    return build_tiny_ltx(tmp_path_factory.mktemp("models") / "ltx", seed=0)


@pytest.fixture(scope="session")
def ltx_i2v_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny LTXImageToVideoPipeline (image-to-video: the LTX parts, the first frame from an image)."""
    from tiny_families import build_tiny_ltx_i2v

    return build_tiny_ltx_i2v(tmp_path_factory.mktemp("models") / "ltx-i2v", seed=0)


@pytest.fixture(scope="session")
def cogvideox_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny CogVideoXPipeline (T5, 3 DiT blocks; its transformer takes text of exactly 16 tokens)."""
    from tiny_families import build_tiny_cogvideox

    return build_tiny_cogvideox(tmp_path_factory.mktemp("models") / "cogvideox", seed=0)


@pytest.fixture
def wan_loadable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let ``WanPipeline.from_pretrained`` load float32 weights when ``accelerate`` is not installed.

    diffusers 0.42 forces ``low_cpu_mem_usage=True`` (which needs accelerate) for any model that declares
    ``_keep_in_fp32_modules``, as WanTransformer3DModel does. With float32 weights that list changes
    nothing, so clearing it is a faithful load; with accelerate present this fixture does nothing.
    """
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        from diffusers import WanTransformer3DModel

        monkeypatch.setattr(WanTransformer3DModel, "_keep_in_fp32_modules", None)


@pytest.fixture(scope="session")
def loading_family_dir(tmp_path_factory: pytest.TempPathFactory):
    """family -> its tiny model directory (tests/tiny_families_loading.py), each built once per session."""
    from tiny_families_loading import build_tiny_loading_family

    root = tmp_path_factory.mktemp("loading-families")
    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = build_tiny_loading_family(family, root / family)
        return built[family]

    return get
