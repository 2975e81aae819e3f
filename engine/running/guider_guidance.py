"""`--guidance` for pipelines that guide through a guider component, not a `guidance_scale` argument.

HunyuanVideo 1.5 (T2V, I2V) and Motif Video take their classifier-free guidance from a `guider`
component (a diffusers `BaseGuidance`: a config, no weights), and HunyuanImage from `guider` and
`ocr_guider`; their `__call__` has no `guidance_scale`. diffusers' documented way to change the scale
is to replace the guider by a copy with the new scale: `pipe.guider = pipe.guider.new(guidance_scale=…)`
(`BaseGuidance.new`). `guided` does exactly that for the request's length, then puts the loaded
guiders back, so the next request starts from the model's own guider again.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

from ..model_dir.discovery import ModelInfo
from ..model_dir.trusted_classes import component_class


def _takes_scale(cls: type) -> bool:
    from diffusers.guiders import BaseGuidance

    return isinstance(cls, type) and issubclass(cls, BaseGuidance) \
        and "guidance_scale" in inspect.signature(cls.__init__).parameters


def scale_guiders(model: ModelInfo) -> tuple[str, ...]:
    """The model's guider components whose class takes a `guidance_scale` (classes already verified by
    discovery; a component left out of the model is not one)."""
    names = []
    for component in model.components:
        if component.library != "diffusers" or component.class_name is None or "guid" not in component.name:
            continue
        try:
            cls = component_class(component.library, component.class_name, f"{component.name}")
        except Exception:  # not a loadable class: discovery has its own line for it
            continue
        if _takes_scale(cls):
            names.append(component.name)
    return tuple(names)


def guidance_through_guider(model: ModelInfo, signature: Mapping[str, Any]) -> bool:
    """True when `--guidance` sets the guiders' scale: the call takes no `guidance_scale`, a guider does."""
    return "guidance_scale" not in signature and bool(scale_guiders(model))


def _pipe_guiders(pipe: Any) -> dict[str, Any]:
    from diffusers.guiders import BaseGuidance

    components = getattr(pipe, "components", None) or {}
    return {name: value for name, value in components.items()
            if isinstance(value, BaseGuidance) and _takes_scale(type(value))}


@contextlib.contextmanager
def guided(pipe: Any, guidance: float | None) -> Iterator[None]:
    """The pipe's guiders at `guidance` for the block (None, or a call that takes `guidance_scale`: as
    loaded), restored after it, whatever happens inside."""
    accepted = inspect.signature(pipe.__call__).parameters
    guiders = {} if guidance is None or "guidance_scale" in accepted else _pipe_guiders(pipe)
    for name, guider in guiders.items():
        setattr(pipe, name, guider.new(guidance_scale=guidance))
    try:
        yield
    finally:
        for name, guider in guiders.items():
            setattr(pipe, name, guider)


def pipe_takes_guider_guidance(pipe: Any) -> bool:
    """The loaded pipe's form of `guidance_through_guider` (for mapping the request onto the call)."""
    return "guidance_scale" not in inspect.signature(pipe.__call__).parameters and bool(_pipe_guiders(pipe))


def guidance_used(pipe: Any, kwargs: Mapping[str, Any]) -> float | None:
    """The guidance scale the call runs with: its `guidance_scale` argument or that argument's default, else
    its guider's (inside `guided`: the request's); None where it has neither (for the report)."""
    accepted = inspect.signature(pipe.__call__).parameters
    if "guidance_scale" in accepted:
        value = kwargs.get("guidance_scale", accepted["guidance_scale"].default)
    else:
        guider = getattr(pipe, "guider", None)
        value = getattr(guider, "guidance_scale", None) if guider is not None and _pipe_guiders(pipe) else None
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else None
