"""Load a discovered model's components from local safetensors files and build its pipeline.

Safety: only classes that the `diffusers` or `transformers` packages themselves define are built
(no custom pipeline or remote code: `engine.trusted_classes`, and `trust_remote_code=False` on every
class that takes it, so no library ever asks on stdin whether to run the directory's code), weights
come only from safetensors (`use_safetensors=True`, and discovery already refused pickle-only
folders), and nothing touches the network (`local_files_only=True`, plus the offline environment set
by `engine.offline`). Discovery checked the same rules first; they are checked again here so that a
`ComponentInfo` built by other means cannot bypass them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import torch

from ..offload.deferred_weights import DeferredWeights
from ..offload.errors import ConfigError
from ..offload.pinned import HostArena
from .arena_load import load_into_arena, supports_arena_load
from .direct_load import build_deferred
from .discovery import ComponentInfo, ModelInfo
from .trusted_classes import accepts_trust_remote_code, component_class, holds_weights
from .trusted_classes import pipeline_class as _trusted_pipeline_class
from .weights import ModelDirError

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class LoadCancelled(Exception):
    """The operator cancelled a load; everything placed so far is released."""


def pipeline_class(model: ModelInfo) -> type:
    return _trusted_pipeline_class(model.pipeline_class, str(model.path / "model_index.json"))


def load_dtype(info: ComponentInfo) -> torch.dtype | None:
    """Load each model in the dtype its checkpoint holds most bytes in (like `torch_dtype="auto"`)."""
    for name in info.dtypes:
        if name in _TORCH_DTYPES:
            return _TORCH_DTYPES[name]
    return None


def load_component(info: ComponentInfo) -> Any:
    """Build one component from its folder (weights on the host)."""
    cls = component_class(info.library, info.class_name, str(info.folder))
    kwargs: dict[str, Any] = {"local_files_only": True}
    if accepts_trust_remote_code(info.library, cls):
        kwargs["trust_remote_code"] = False  # never run the directory's code, never prompt on stdin
    if holds_weights(cls):  # a module or an Auto* model class: safetensors only, never a pickle
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
                  cancel: threading.Event | None = None, weights: DeferredWeights | None = None,
                  log: Callable[[str], None] | None = None, aux_in_place: bool = False,
                  host_arenas: dict[str, HostArena] | None = None, registrar: Executor | None = None,
                  timings: dict[str, float] | None = None) -> Any:
    """Load every component (reporting bytes per component) and construct the pipeline on the host.

    With `weights`, each DiT that `engine.direct_load` can build exactly is built with its weights
    still in their files (registered in `weights`): placement reads them straight into place. The
    others, and every DiT it cannot build, are read by `from_pretrained` (`log` says why).
    `aux_in_place` (CUDA only: see `engine.arena_load`) does the same for encoders and VAEs: a
    diffusers one is built like a DiT, a transformers one over an arena read in parallel and
    page-locked (kept in `host_arenas` by component name, for placement to use and release); with a
    `registrar`, that page-locking runs on it while the next components load (wait for it before
    placement). `timings` gets each component's build seconds."""
    cls = pipeline_class(model)
    quiet_libraries()
    components: dict[str, Any] = {}
    for info in model.components:
        if cancel is not None and cancel.is_set():
            raise LoadCancelled("load cancelled")
        if progress:
            progress(info.name, 0, info.nbytes)
        component, why = None, ""
        started = time.perf_counter()
        if weights is not None and (info.role == "dit" or aux_in_place):
            component, why = build_deferred(info, load_dtype(info), weights)
            if component is None and aux_in_place and host_arenas is not None and supports_arena_load(info) is None:
                component, arena = load_into_arena(info, load_dtype(info), weights.threads, pin=registrar is None)
                host_arenas[info.name] = arena
                if registrar is not None:
                    registrar.submit(arena.pin)
            if component is None and log is not None and info.files:  # tokenizers, schedulers: nothing to say
                log(f"{info.name}: read by from_pretrained, not straight into place: {why}")
        components[info.name] = component if component is not None else load_component(info)
        if timings is not None:
            timings[info.name] = time.perf_counter() - started
        if progress:
            progress(info.name, info.nbytes, info.nbytes)
    try:
        pipe = cls(**components)
    except TypeError as exc:
        raise ConfigError(f"{model.path}: {model.pipeline_class} cannot be built from its components: {exc}") from exc
    pipe.set_progress_bar_config(disable=True)
    return pipe
