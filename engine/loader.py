"""Load a discovered model's components from local safetensors files and build its pipeline.

Safety: only classes that the `diffusers` or `transformers` packages themselves define are built
(no custom pipeline or remote code), weights come only from safetensors (`use_safetensors=True`,
and discovery already refused pickle-only folders), and nothing touches the network
(`local_files_only=True`, plus the offline environment set by `engine.offline`).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

import torch

from ..offload.errors import ConfigError
from .discovery import ComponentInfo, ModelInfo
from .weights import ModelDirError

ALLOWED_LIBRARIES = ("diffusers", "transformers")

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class LoadCancelled(Exception):
    """The operator cancelled a load; everything placed so far is released."""


def _class_for(library: str | None, class_name: str | None, where: str) -> type:
    if library not in ALLOWED_LIBRARIES:
        raise ModelDirError(f"{where}: library {library!r} is not allowed (only {', '.join(ALLOWED_LIBRARIES)} "
                            "classes are built; custom or remote code is never run)")
    module = importlib.import_module(library)
    cls = getattr(module, class_name or "", None)
    if not isinstance(cls, type):
        raise ModelDirError(f"{where}: {library} has no class {class_name!r} (custom code is never run)")
    return cls


def pipeline_class(model: ModelInfo) -> type:
    import diffusers

    cls = _class_for("diffusers", model.pipeline_class, str(model.path / "model_index.json"))
    if not issubclass(cls, diffusers.DiffusionPipeline):
        raise ModelDirError(f"{model.path}: {model.pipeline_class} is not a diffusers pipeline")
    return cls


def load_dtype(info: ComponentInfo) -> torch.dtype | None:
    """Load each model in the dtype its checkpoint holds most bytes in (like `torch_dtype="auto"`)."""
    for name in info.dtypes:
        if name in _TORCH_DTYPES:
            return _TORCH_DTYPES[name]
    return None


def load_component(info: ComponentInfo) -> Any:
    """Build one component from its folder (weights on the host)."""
    cls = _class_for(info.library, info.class_name, str(info.folder))
    kwargs: dict[str, Any] = {"local_files_only": True}
    if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
        kwargs["use_safetensors"] = True
        dtype = load_dtype(info)
        if dtype is not None:
            kwargs["torch_dtype"] = dtype
        if info.variant:
            kwargs["variant"] = info.variant
    try:
        component = cls.from_pretrained(str(info.folder), **kwargs)
    except (OSError, ValueError) as exc:
        raise ModelDirError(f"{info.folder}: {info.class_name}.from_pretrained failed: {_first_line(exc)}") from exc
    if isinstance(component, torch.nn.Module):
        component.eval()
        component.requires_grad_(False)
    return component


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def quiet_libraries() -> None:
    """The engine reports progress as events; the libraries' own bars and notices go silent."""
    import diffusers
    import transformers

    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def load_pipeline(model: ModelInfo, *, progress: Callable[[str, int, int], None] | None = None,
                  cancel: threading.Event | None = None) -> Any:
    """Load every component (reporting bytes per component) and construct the pipeline on the host."""
    cls = pipeline_class(model)
    quiet_libraries()
    components: dict[str, Any] = {}
    for info in model.components:
        if cancel is not None and cancel.is_set():
            raise LoadCancelled("load cancelled")
        if progress:
            progress(info.name, 0, info.nbytes)
        components[info.name] = load_component(info)
        if progress:
            progress(info.name, info.nbytes, info.nbytes)
    try:
        pipe = cls(**components)
    except TypeError as exc:
        raise ConfigError(f"{model.path}: {model.pipeline_class} cannot be built from its components: {exc}") from exc
    pipe.set_progress_bar_config(disable=True)
    return pipe
