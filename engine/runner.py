"""Run one generation on a placed pipeline, timing every denoise step.

A step is timed from the first DiT forward of that step (a forward pre-hook) to the pipeline's
`callback_on_step_end`, with the device synchronized at both ends so the wall time is the
device's, not the host's enqueue time. The streamer's exposed stall and H2D bytes are taken at
the same boundary. Cancellation sets the pipeline's interrupt flag at the next step end.
"""

from __future__ import annotations

import inspect
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ..offload.events import EventBus, StepTiming
from ..offload.streamer import LayerwiseStreamer


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    prompt: str
    steps: int | None = None
    height: int | None = None
    width: int | None = None
    seed: int = 0
    guidance: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def call_kwargs(self, pipe: Any) -> dict[str, Any]:
        """Keyword arguments for the pipeline call (only those the pipeline accepts)."""
        accepted = inspect.signature(pipe.__call__).parameters
        kwargs: dict[str, Any] = {"prompt": self.prompt, "output_type": "pil",
                                  "generator": torch.Generator("cpu").manual_seed(self.seed), **self.extra}
        for key, value in (("num_inference_steps", self.steps), ("height", self.height), ("width", self.width),
                           ("guidance_scale", self.guidance)):
            if value is not None:
                kwargs[key] = value
        return {k: v for k, v in kwargs.items() if k in accepted}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepClock:
    """Times denoise steps between the first DiT forward and the step-end callback."""

    def __init__(self, bus: EventBus, request_id: int, total_steps: int, device: torch.device,
                 streamer: LayerwiseStreamer | None, cancel: threading.Event | None) -> None:
        self.bus, self.request_id, self.total_steps = bus, request_id, total_steps
        self.device, self.streamer, self.cancel = device, streamer, cancel
        self.started: float | None = None
        self.steps: list[StepTiming] = []

    def on_dit_forward(self, *_: Any, **__: Any) -> None:
        if self.started is None:
            _sync(self.device)
            if self.streamer is not None:
                self.streamer.take_step_stats()  # transfers before the loop belong to no step
            self.started = time.perf_counter()

    def on_step_end(self, pipe: Any, step: int, _timestep: Any, callback_kwargs: dict[str, Any]) -> dict[str, Any]:
        _sync(self.device)
        wall = time.perf_counter() - (self.started or time.perf_counter())
        stats = self.streamer.take_step_stats() if self.streamer is not None else None
        timing = StepTiming(request_id=self.request_id, step=step + 1, total_steps=self.total_steps, wall_s=wall,
                            stall_s=stats.stall_s if stats else 0.0, h2d_bytes=stats.h2d_bytes if stats else 0)
        self.steps.append(timing)
        self.bus.publish(timing)
        self.started = None
        if self.cancel is not None and self.cancel.is_set():
            pipe._interrupt = True
        return callback_kwargs


def total_steps_of(pipe: Any, request: GenerateRequest) -> int:
    if request.steps is not None:
        return request.steps
    default = inspect.signature(pipe.__call__).parameters.get("num_inference_steps")
    return int(default.default) if default is not None and isinstance(default.default, int) else 0


def run_pipeline(pipe: Any, request: GenerateRequest, *, bus: EventBus, request_id: int, device: torch.device,
                 dits: list[torch.nn.Module], streamer: LayerwiseStreamer | None,
                 cancel: threading.Event | None = None) -> tuple[Any, list[StepTiming]]:
    """Call the pipeline once; returns (first output image, step timings)."""
    clock = StepClock(bus, request_id, total_steps_of(pipe, request), device, streamer, cancel)
    kwargs = request.call_kwargs(pipe)
    if "callback_on_step_end" in inspect.signature(pipe.__call__).parameters:
        kwargs["callback_on_step_end"] = clock.on_step_end
    handles = [dit.register_forward_pre_hook(clock.on_dit_forward) for dit in dits]
    try:
        output = pipe(**kwargs)  # diffusers runs it under no_grad, exactly as the plain pipeline does
        _sync(device)
    finally:
        for handle in handles:
            handle.remove()
    images = getattr(output, "images", None)
    if images is None:
        images = getattr(output, "frames", None)
    image = images[0] if images is not None and len(images) else None
    if isinstance(image, list):  # video pipelines return frames per batch item
        image = image[0]
    return image, clock.steps
