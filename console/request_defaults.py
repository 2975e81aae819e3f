"""The request `run` makes when a flag is left out: the pipeline's defaults, or the demo model's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..engine.api import GenerateRequest, RequestForecast
from ..offload.units import format_seconds

if TYPE_CHECKING:
    from ..engine import events
    from ..engine.api import ModelInfo


def run_prompt_and_steps(pipeline: str, prompt: str | None, steps: int | None,
                         params: dict[str, Any]) -> tuple[str, int | None]:
    """`run`'s prompt and step count for this pipeline: `--prompt` refused where the pipeline takes none (DDPM,
    DiT get none: `runner.GenerateRequest.call_kwargs`), the default prompt where left out; a `sigmas` or
    `timesteps` list sets the count where the pipeline takes one (LTX-2 DFR takes none)."""
    from ..engine.api import checks
    from ..engine.errors import ConfigError
    from .args import DEFAULT_RUN_PROMPT

    signature = checks.call_signature(pipeline)
    if prompt is not None and "prompt" not in signature:
        raise ConfigError(f"--prompt: {pipeline} takes no prompt (it is not text-conditioned)")
    if "num_inference_steps" in signature:
        steps = checks.schedule_steps(steps, params)
    return (DEFAULT_RUN_PROMPT if prompt is None else prompt), steps


class HasModel(Protocol):
    """An engine handle, or the console (which keeps the model it opened): all a default request needs."""

    @property
    def model(self) -> ModelInfo: ...


def default_request(engine: HasModel, *, prompt: str, steps: int | None = None, height: int | None = None,
                    width: int | None = None, seed: int = 0, guidance: float | None = None,
                    frames: int | None = None, negative_prompt: str | None = None,
                    max_sequence_length: int | None = None, image: Path | None = None,
                    params: dict[str, Any] | None = None) -> GenerateRequest:
    """A request; for the demo model, unset fields take the demo's working defaults (64 px, 2 steps).
    Fields left None are not sent: the pipeline's own default applies."""
    from ..engine.api import models

    extra: dict[str, Any] = {}
    if models.is_demo_model(engine.model.path):
        d = models.DEMO_GENERATION
        steps = steps if steps is not None else int(d["num_inference_steps"])
        height = height if height is not None else int(d["height"])
        width = width if width is not None else int(d["width"])
        guidance = guidance if guidance is not None else float(d["guidance_scale"])
        extra["max_sequence_length"] = d["max_sequence_length"]
    return GenerateRequest(prompt=prompt, steps=steps, height=height, width=width, seed=seed, guidance=guidance,
                           frames=frames, negative_prompt=negative_prompt, max_sequence_length=max_sequence_length,
                           image=image, params=dict(params or {}), extra=extra)


CPU_STEPS = 4
CPU_SIDE = 256
CPU_FRAMES = 9
"""A CPU's first request: a few steps at 256 px (and about 9 frames) finish in minutes, where a video
pipeline's own defaults (LTX: 704x512, 161 frames, 50 steps) take hours; the operator can raise them."""


def small_request(engine: HasModel, prompt: str, planned: events.PlanReady | None = None) -> GenerateRequest:
    """The dialog's first request on a CPU: the pipeline's defaults (from the engine's `PlanReady`, when a
    pipeline is loaded), capped to a small size."""
    from ..engine.api import checks

    request = default_request(engine, prompt=prompt)
    steps = request.steps if request.steps is not None else (planned.steps if planned else None) or None
    height = request.height or (planned.height if planned else None)
    width = request.width or (planned.width if planned else None)
    rule = checks.frames_rule(engine.model)
    frames = request.frames
    if rule is not None and frames is None:
        frames = 1 + rule.step * -(-(CPU_FRAMES - 1) // rule.step)  # the smallest count it renders exactly ≥ 9
    return replace(request, steps=min(steps, CPU_STEPS) if steps else CPU_STEPS,
                   height=min(height, CPU_SIDE) if height else CPU_SIDE,
                   width=min(width, CPU_SIDE) if width else CPU_SIDE, frames=frames)


def forecast_line(forecast: RequestForecast | None, steps: int | None) -> str:
    """The dialog's line: how long the denoise loop of this request will take, or that it is not known."""
    if forecast is None or forecast.step_s is None or not steps:
        return ("forecast: unknown — no request of this model and size has run on this device yet "
                "(this one measures it)")
    return (f"forecast: {steps} steps × {format_seconds(forecast.step_s)} = {format_seconds(steps * forecast.step_s)}"
            f" denoising ({forecast.step_label})")


FORECASTING_LINE = "forecast: forecasting… (the engine thread reads the profile)"
"""The dialog's line until the engine thread's forecast of the request as filled in arrives."""
