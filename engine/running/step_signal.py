"""Where each denoise step ends, for every diffusers pipeline, so that progress, step timings and previews never
go quiet for a family.

Most pipelines take `callback_on_step_end`. Older ones (PixArt, Kandinsky 2.x, IF, consistency models, the
audio LDMs) take only `callback(step, timestep, latents)` with `callback_steps`, and a few take neither
(LongCat-Image, HunyuanVideo 1.5, DreamLite, DDPM, DDIM): without a signal of its own, such a request showed no
step at all. What every diffusers loop does have is its progress bar (`DiffusionPipeline.progress_bar`), advanced
once per step, so that is followed where no callback exists. None of the three changes what the pipeline
computes.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ...offload.module_hooks import Hooks

StepEnd = Callable[[Any, int, Any, dict[str, Any]], dict[str, Any]]  # callback_on_step_end's signature


def attach_step_end(pipe: Any, on_step_end: StepEnd, hooks: Hooks,
                    denoised: Callable[[], bool] = lambda: True) -> dict[str, Any]:
    """The call arguments that make `pipe` report each step's end to `on_step_end`; a change to `pipe` itself (its
    progress bar followed) goes into `hooks`, whose `remove()` undoes it when the request ends. `denoised`:
    whether the denoiser ran since the last step's end; a progress bar's advance without that is another loop's
    (Marigold's batches, a tiled decode), not a step."""
    parameters = inspect.signature(pipe.__call__).parameters
    if "callback_on_step_end" in parameters:
        return {"callback_on_step_end": on_step_end}
    if "callback" in parameters:
        def legacy(step: int, timestep: Any = None, latents: Any = None, *_: Any) -> None:
            on_step_end(pipe, step, timestep, {"latents": latents} if isinstance(latents, torch.Tensor) else {})

        kwargs: dict[str, Any] = {"callback": legacy}
        if "callback_steps" in parameters:
            kwargs["callback_steps"] = 1  # every step (the default, stated)
        return kwargs
    hooks.wrap(pipe, "progress_bar", lambda original: _following(original, pipe, on_step_end, denoised))
    return {}


def _following(original: Callable[..., Any], pipe: Any, on_step_end: StepEnd,
               denoised: Callable[[], bool]) -> Callable[..., Any]:
    """`original` (the pipeline's progress bar), reporting a step at each advance after the denoiser ran:
    `update()` of a bar made with `total=`, or the end of each pass over a bar made from an iterable (`for t in
    self.progress_bar(timesteps)`). Arguments a pipeline's own `progress_bar` takes (Marigold: `desc`, `leave`)
    pass through."""
    counter = itertools.count()

    def step_done(timestep: Any) -> None:
        if denoised():
            on_step_end(pipe, next(counter), timestep, {})

    def progress_bar(*args: Any, **kwargs: Any) -> Any:
        bar = original(*args, **kwargs)
        if (args[0] if args else kwargs.get("iterable")) is not None:
            return _StepsOf(bar, step_done)
        update = bar.update

        def stepped(n: int = 1) -> Any:
            advanced = update(n)
            for _ in range(n):
                step_done(None)
            return advanced

        bar.update = stepped
        return bar

    return progress_bar


class _StepsOf:
    """A progress bar over the loop's items that reports a step when the loop comes back for the next item (or
    finishes): the step's body has run by then. Anything else is the bar's own."""

    def __init__(self, bar: Any, step_done: Callable[[Any], Any]) -> None:
        self._bar, self._step_done = bar, step_done

    def __iter__(self) -> Iterator[Any]:
        for item in self._bar:
            yield item
            self._step_done(item)

    def __len__(self) -> int:
        return len(self._bar)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bar, name)
