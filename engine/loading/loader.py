"""Load a discovered model's components from local safetensors files and build its pipeline.

Safety: only classes that the `diffusers` or `transformers` packages themselves define are built
(no custom pipeline or remote code: `engine.model_dir.trusted_classes`, and `trust_remote_code=False` on every
class that takes it, so no library ever asks on stdin whether to run the directory's code), weights
come only from safetensors (`use_safetensors=True`, and discovery already refused pickle-only
folders), and nothing touches the network (`local_files_only=True`, plus the offline environment set
by `engine.offline`). Discovery checked the same rules first; they are checked again here so that a
`ComponentInfo` built by other means cannot bypass them.
"""

from __future__ import annotations

import copy
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors import SafetensorError

from ...offload.deferred_weights import DeferredWeights
from ...offload.pinned import HostArena
from ..errors import ConfigError
from ..model_dir.discovery import ComponentInfo, ModelInfo
from ..model_dir.pipeline_values import absent_components, init_values
from ..model_dir.roles import DENOISER_ROLES
from ..model_dir.trusted_classes import accepts_trust_remote_code, component_class, holds_weights
from ..model_dir.trusted_classes import pipeline_class as _trusted_pipeline_class
from ..model_dir.weights import ModelDirError, find_weights
from .arena_load import load_into_arena, supports_arena_load
from .construction_lock import MODEL_CONSTRUCTION
from .direct_load import build_deferred, build_deferred_in_arena

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class LoadCancelled(Exception):
    """The operator cancelled a load; everything placed so far is released."""


def pipeline_class(model: ModelInfo) -> type:
    return _trusted_pipeline_class(model.pipeline_class, str(model.path / "model_index.json"))


def pipeline_init_values(model: ModelInfo, cls: type) -> dict[str, Any]:
    """What `from_pretrained` passes `cls` besides the components: the saved pipeline values its `__init__`
    takes, and None for each optional component the directory left out. Raises before anything is read."""
    where = str(model.path / "model_index.json")
    present = {info.name for info in model.components}
    return {**absent_components(cls, present, where), **init_values(cls, copy.deepcopy(model.pipeline_values), where)}


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
        # the library's sharded loader reads whatever the index names now: check the names again
        find_weights(info.folder, info.variant)
    weighted = "use_safetensors" in kwargs
    if weighted:
        kwargs["output_loading_info"] = True  # which tensors the library initialised itself (`_check_units_held`)
    try:
        component = cls.from_pretrained(str(info.folder), **kwargs)
    except (OSError, ValueError, SafetensorError) as exc:  # SafetensorError: e.g. a file cut short since discovery
        raise ModelDirError(f"{info.folder}: {info.class_name}.from_pretrained failed: {_reason(info, exc)}") from exc
    if weighted:
        component, loading_info = component
        _check_units_held(info, component, loading_info)
    if isinstance(component, torch.nn.Module):
        # eval() as from_pretrained already left it; requires_grad is left as it is too: switching it off
        # changed which CPU kernel some Linear layers took (Mochi's VAE decoded 3.6e-7 away from diffusers)
        component.eval()
    return component


def build_unused(info: ComponentInfo) -> Any:
    """A component the pipeline never calls, built from its config.json on the meta device: no weight read or
    allocated, and a call into it fails instead of computing on missing weights."""
    cls = component_class(info.library, info.class_name, str(info.folder))
    config = cls.load_config(str(info.folder), local_files_only=True)
    with MODEL_CONSTRUCTION, torch.device("meta"):
        return cls.from_config(config).eval()


_UNIT = re.compile(r"^(.*?\.\d+)\.")  # a list entry's prefix: `encoder.layers.2`


def _check_units_held(info: ComponentInfo, component: Any, loading_info: dict) -> None:
    """Refuse a component whose config declares whole list entries (layers, blocks) its weights do not hold: the
    library would fill them with random values and the output would be silently wrong. A single tensor the
    library initialises (an unused BERT pooler) is how diffusers runs it too, and stays allowed."""
    missing = set(loading_info.get("missing_keys") or ())
    if not missing or not isinstance(component, torch.nn.Module):
        return
    units: dict[str, list[str]] = {}
    for name in component.state_dict():
        if match := _UNIT.match(name):
            units.setdefault(match.group(1), []).append(name)
    absent = [unit for unit, names in units.items() if all(n in missing for n in names)]
    if absent:
        raise ModelDirError(f"{info.folder}: its config declares {len(absent)} list entries its weights do not hold "
                            f"(e.g. {absent[0][:120]}): the config's count and the weights "
                            "disagree (they would run with random values)")


MAX_REASON = 300  # a library's message can quote a whole config or list every converter it has


def first_line(exc: BaseException) -> str:
    """An exception as the one line an operator is shown (cut at `MAX_REASON` characters)."""
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= MAX_REASON else line[: MAX_REASON - 1] + "…"


def _reason(info: ComponentInfo, exc: BaseException) -> str:
    """What went wrong, in words true for this folder. transformers, given a `tokenizer.model` that is not a
    SentencePiece model and no `tokenizer.json`, tries it as a tiktoken file last and reports only that
    ("`tiktoken` is required to read a `tiktoken` file"), whatever the file is."""
    line = first_line(exc)
    folder = info.folder
    if "tiktoken" in line.lower() and not (folder / "tokenizer.json").is_file():
        missing = [name for name in ("sentencepiece", "tiktoken") if not _installed(name)]
        state = f" ({', '.join(missing)} not installed)" if missing else ""
        model = "tokenizer.model" if (folder / "tokenizer.model").is_file() else "its vocabulary files"
        return (f"no tokenizer.json, and {model} could be read neither as a SentencePiece model nor as a tiktoken "
                f"file{state}")
    return line


def _installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def quiet_libraries() -> None:
    """The engine reports progress as events; the libraries' own bars and notices go silent."""
    import diffusers
    import transformers

    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


@dataclass
class LoadingPipeline:
    """A pipeline whose components are being built: the DiTs are (`dits`); the others may still be
    building on a worker thread. `finish` waits for them and constructs the pipeline; `abandon`
    stops the worker at its next component (a failed or cancelled load)."""

    model: ModelInfo
    cls: type
    built: dict[str, Any]
    dits: dict[str, Any]
    stop: threading.Event
    init_values: dict[str, Any] = field(default_factory=dict)  # pipeline values and None components
    others: Future | None = None
    pinning: list[Future] = field(default_factory=list)  # aux arenas being page-locked on the registrar
    others_done_at: float | None = None  # perf_counter when the last component was built (its bytes read)

    def finish(self) -> Any:
        """Every component built and its arena page-locked, then the pipeline (on the host)."""
        if self.others is not None:
            self.others.result()
        for future in self.pinning:
            future.result()
        components = {info.name: self.built[info.name] for info in self.model.components}
        try:
            pipe = self.cls(**components, **self.init_values)
        except TypeError as exc:
            raise ConfigError(f"{self.model.path}: {self.model.pipeline_class} cannot be built from its components: "
                              f"{exc}") from exc
        pipe.register_to_config(_name_or_path=str(self.model.path))  # as from_pretrained leaves it
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def abandon(self) -> None:
        """Stop building (the worker finishes the component it is on; the caller's pool joins it)."""
        self.stop.set()


def start_loading(model: ModelInfo, *, progress: Callable[[str, int, int], None] | None = None,
                  cancel: threading.Event | None = None, weights: DeferredWeights | None = None,
                  log: Callable[[str], None] | None = None, aux_in_place: bool = False,
                  host_arenas: dict[str, HostArena] | None = None, registrar: Executor | None = None,
                  timings: dict[str, float] | None = None, others_on: Executor | None = None,
                  dit_in_arena: bool = True, huge_pages: bool = True,
                  after_build: Callable[[ComponentInfo, Any], None] | None = None,
                  plain: frozenset[str] = frozenset(),
                  from_files: Callable[[ComponentInfo], Any] | None = None) -> LoadingPipeline:
    """Build every component on the host (reporting bytes per component); returns once the DiTs are.

    With `weights`, each DiT that `engine.loading.direct_load` can build exactly is built with its weights
    still in their files (registered in `weights`): placement reads them straight into place. The
    others, and every DiT it cannot build, are read by `from_pretrained` (`log` says why).
    `aux_in_place` (CUDA only: see `engine.loading.arena_load`) reads encoders and VAEs in parallel too: a
    diffusers one is built like a DiT and read at once, a transformers one over an arena read in
    parallel and page-locked (kept in `host_arenas` by component name, for placement to use and
    release); with a `registrar`, that page-locking runs on it while the next components load.
    With `others_on`, the components other than DiTs are built there once the DiTs are, so that
    their reads overlap the placement's block reads (the caller places the DiTs, then calls
    `finish`). The DiTs are built first and alone: their construction maps about a thousand
    tensors, and each mapping waits behind the page faults of reads running at the same time.
    Without it, everything is built here, in the model's order.
    `dit_in_arena` (`EngineOptions.dit_in_arena`, with `aux_in_place`): a DiT's weights are views into
    one arena rather than empty tensors of their own; `huge_pages`: the arenas may use huge pages
    (`EngineOptions.use_huge_pages`). `timings` gets each component's build seconds. `after_build(info, component)`
    runs on each component as soon as it is built (a file-tier component gives its bytes back there:
    engine/loading/file_sources.py); the components named in `plain` are built by `from_pretrained`, never into an
    arena."""
    cls = pipeline_class(model)
    quiet_libraries()
    stop = threading.Event()
    loading = LoadingPipeline(model, cls, {}, {}, stop, pipeline_init_values(model, cls))
    options = _BuildOptions(progress, cancel, stop, weights, log, aux_in_place, host_arenas, registrar, timings,
                            loading.pinning, dit_in_arena, huge_pages, after_build, plain, from_files)
    if others_on is None:
        for info in model.components:
            loading.built[info.name] = _build(info, options)
    else:
        # the largest first; their reads share the bandwidth with the blocks' reads that placement starts
        others = sorted((info for info in model.components if info.role not in DENOISER_ROLES),
                        key=lambda i: -i.nbytes)

        def build_others() -> None:
            for info in others:
                loading.built[info.name] = _build(info, options, own_reader=True)
            loading.others_done_at = time.perf_counter()

        # the DiTs first, alone: starting the others' reads during their ~0.1 s build made loads slower
        # (measured on one H200: 1.14x the read floor against 1.04x)
        for info in model.components:
            if info.role in DENOISER_ROLES:
                loading.built[info.name] = _build(info, options)
        loading.others = others_on.submit(build_others)
    loading.dits = {info.name: loading.built[info.name] for info in model.denoisers}
    return loading


@dataclass(frozen=True)
class _BuildOptions:
    progress: Callable[[str, int, int], None] | None
    cancel: threading.Event | None
    stop: threading.Event
    weights: DeferredWeights | None
    log: Callable[[str], None] | None
    aux_in_place: bool
    host_arenas: dict[str, HostArena] | None
    registrar: Executor | None
    timings: dict[str, float] | None
    pinning: list[Future]
    dit_in_arena: bool = True
    huge_pages: bool = True
    after_build: Callable[[ComponentInfo, Any], None] | None = None
    plain: frozenset[str] = frozenset()
    from_files: Callable[[ComponentInfo], Any] | None = None


def _build(info: ComponentInfo, o: _BuildOptions, own_reader: bool = False) -> Any:
    """One component, on the host. `own_reader`: read a deferred component's weights now with a reader
    of its own (a worker thread must not share the DiTs' reader, which placement drains)."""
    if (o.cancel is not None and o.cancel.is_set()) or o.stop.is_set():
        raise LoadCancelled("load cancelled")
    if o.progress:
        o.progress(info.name, 0, info.nbytes)
    component, why = None, ""
    started = time.perf_counter()
    if info.unused:  # never called (engine/model_dir/unused.py): its config only, on the meta device
        component = build_unused(info)
    elif o.weights is not None and (info.role in DENOISER_ROLES or o.aux_in_place) and info.name not in o.plain:
        reader = o.weights.sibling() if own_reader else o.weights
        # an encoder or VAE read beside the DiT's blocks: into an arena, its staged master as it is
        staged_from_arena = own_reader and info.role not in DENOISER_ROLES
        in_arena = (o.aux_in_place and o.host_arenas is not None and o.registrar is not None
                    and (staged_from_arena or (info.role in DENOISER_ROLES and o.dit_in_arena)))
        arena: HostArena | None = None
        try:
            if in_arena:
                component, why, arena = build_deferred_in_arena(info, load_dtype(info), reader, o.huge_pages)
            else:
                component, why = build_deferred(info, load_dtype(info), reader)
            if component is not None and own_reader:
                reader.materialize_module(component)
        except BaseException:
            if arena is not None:
                arena.close()
            raise
        finally:
            if own_reader:
                reader.close()
        if arena is not None and staged_from_arena:
            assert o.host_arenas is not None and o.registrar is not None  # `in_arena` required them
            o.host_arenas[info.name] = arena
            o.pinning.append(o.registrar.submit(arena.pin))
        # a DiT's arena object goes now; the views of its weights that are read there keep the memory
        if component is None and o.aux_in_place and o.host_arenas is not None and supports_arena_load(info) is None:
            component, arena, pinning = load_into_arena(info, load_dtype(info), o.weights.sibling(),
                                                        pin=o.registrar is None, registrar=o.registrar,
                                                        huge_pages=o.huge_pages)
            o.host_arenas[info.name] = arena
            if pinning is not None:
                o.pinning.append(pinning)
        if component is None and o.log is not None and info.files:  # tokenizers, schedulers: nothing to say
            o.log(f"{info.name}: read by from_pretrained, not straight into place: {why}")
    if component is None and o.from_files is not None and info.name in o.plain:
        component = o.from_files(info)
    if component is None:
        with MODEL_CONSTRUCTION:
            component = load_component(info)
    if o.after_build is not None:
        o.after_build(info, component)
    if o.timings is not None:
        o.timings[info.name] = time.perf_counter() - started
    if o.progress:
        o.progress(info.name, info.nbytes, info.nbytes)
    return component
