"""The model directory: discovery, what a pipeline makes, and the embedded demo model.

One namespace of the engine's front door (`from omni_console.engine.api import models`); names load lazily.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports are this namespace's names, for type checkers)
from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_names

if TYPE_CHECKING:  # the same names as `EXPORTS` (tests/engine/test_api.py holds them equal)
    from ..demo.demo_model import DEMO_GENERATION, build_demo_model, ensure_demo_model, is_demo_model
    from ..loading.loader import pipeline_class, pipeline_init_values
    from ..model_dir.call_source import makes_still_images
    from ..model_dir.discovery import discover_model
    from ..model_dir.weights import load_json
    from ..running.call_options import makes_audio_only

EXPORTS: dict[str, tuple[str, ...]] = {
    "..model_dir.weights": ("load_json",),
    "..model_dir.discovery": ("discover_model",),
    "..model_dir.call_source": ("makes_still_images",),
    "..demo.demo_model": ("DEMO_GENERATION", "build_demo_model", "ensure_demo_model", "is_demo_model"),
    "..loading.loader": ("pipeline_class", "pipeline_init_values"),
    "..running.call_options": ("makes_audio_only",),
}
"""Each name's module (relative to this package)."""

__getattr__, __dir__, __all__ = lazy_names(__name__, __package__, EXPORTS)
