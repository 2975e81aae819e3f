"""Read a transformers component's checkpoint into one page-locked arena and build it over those bytes.

transformers builds the model from a `state_dict` of tensors that view the arena (its own loader,
key conversions and dtype rules run unchanged; tensors in the load dtype are used in place, not
copied). The arena is read in parallel (`offload.deferred_weights`) and page-locked once, so a
staged encoder's master is the arena itself: no `from_pretrained` read, no packing copy.

Used on CUDA by default: on a CPU the stager keeps each weight at the address the plain pipeline gives
it (`offload.address_phase`); asked for there, each tensor sits at its file's address phase.
"""

from __future__ import annotations

from concurrent.futures import Executor, Future, wait
from typing import Any

import torch

from ...offload.address_phase import phase_of
from ...offload.deferred_weights import DeferredWeights
from ...offload.pinned import HostArena, arena_views
from ..model_dir.discovery import ComponentInfo
from ..model_dir.trusted_classes import component_class
from .construction_lock import MODEL_CONSTRUCTION
from .direct_load import add_sources, component_locations


def supports_arena_load(info: ComponentInfo) -> str | None:
    """None when `info` is a transformers model class that can be built from an arena."""
    if info.library != "transformers" or not info.files:
        return "not a transformers model with safetensors files"
    if info.quant_method is not None:  # its quantizer runs inside transformers' own from_pretrained
        return f"quantized ('{info.quant_method}')"
    import transformers

    cls = component_class(info.library, info.class_name, str(info.folder))
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        return f"{info.class_name} is not a transformers model class"
    if "from_pretrained" in vars(cls):  # diffusers' prx T5GemmaEncoder builds from its config's `encoder` part
        return f"{info.class_name} loads through its own from_pretrained"
    return None


def build_over_state(cls: Any, info: ComponentInfo, state: dict[str, torch.Tensor],
                     dtype: torch.dtype | None) -> Any:
    """A transformers component built by its own `from_pretrained` over tensors already in place (`state`: views of
    an arena or of its mapped files), its config read from the component's folder, no remote code."""
    config = cls.config_class.from_pretrained(str(info.folder), local_files_only=True)
    kwargs: dict[str, Any] = {"config": config, "state_dict": state, "local_files_only": True,
                              "trust_remote_code": False}
    if dtype is not None:
        kwargs["dtype"] = dtype
    with MODEL_CONSTRUCTION:
        return cls.from_pretrained(None, **kwargs)


def load_into_arena(info: ComponentInfo, dtype: torch.dtype | None, weights: DeferredWeights, pin: bool,
                    registrar: Executor | None = None, huge_pages: bool = True
                    ) -> tuple[Any, HostArena, Future[bool] | None]:
    """The component, built by transformers over a freshly read arena; `weights` (an empty reader,
    closed here) reads it. With `pin` the arena is page-locked here; with a `registrar`, there, as soon
    as its bytes are in (returned: the future of that), while transformers builds the model: building
    a large encoder takes about as long as page-locking it, and a page-locking started only after it
    would hold up the registrations of the DiT blocks read meanwhile (the driver serialises them).
    `huge_pages`: `LoadOptions.use_huge_pages`."""
    cls = component_class(info.library, info.class_name, str(info.folder))
    stored = component_locations(info)
    phases = [phase_of(found.offset, found.dtype.itemsize) if weights.keep_phase else None  # a CPU device
              for found in stored.values()]
    arena, views = arena_views([(found.shape, found.dtype) for found in stored.values()], phases, huge_pages)
    pinning: Future[bool] | None = None
    try:
        state = dict(zip(stored, views, strict=True))
        add_sources(weights, ((state[key], found) for key, found in stored.items()))
        weights.materialize(state.values())
        if pin:
            arena.pin()
        elif registrar is not None:
            pinning = registrar.submit(arena.pin)
        model = build_over_state(cls, info, state, dtype)
    except BaseException:
        if pinning is not None:
            wait([pinning])  # never close an arena a registration is still working on
        arena.close()
        raise
    finally:
        weights.close()
    model.config.name_or_path = str(info.folder)
    model.eval()  # requires_grad left as transformers leaves it: exactness (see loader.load_component)
    return model, arena, pinning

