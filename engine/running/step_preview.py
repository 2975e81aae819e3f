"""Step previews: at each denoise step's end, a small copy of the latent goes to the console.

Off the request's critical path: on CUDA the latent is read on a side stream (which waits for the
compute stream, and the latent is recorded on it so its memory is not reused early), reduced there to
the middle frame at most `PREVIEW_SIDE` latent pixels a side, and copied into pinned host memory
without blocking; a daemon thread waits for that copy and publishes the `StepPreview`. A step whose
copy has not been published when the next one is captured is replaced by it (only the newest counts).
On a CPU the small copy is made at once. The latent is only read: outputs are unchanged (a test holds
them bit-identical with previews on and off).

The console turns the latent into RGB with the format's factors (`latent_format`); a pipeline with
none gets one `StepPreview` with `note` saying so, and nothing is copied. With a `--preview-decoder`
(`preview_decoder`) the latent, reduced to DECODER_SIDE a side, is decoded on the same side stream and
the picture (uint8) is what is copied and published.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import torch
import torch.nn.functional as F

from ...offload.events import EventBus
from ..events import StepPreview
from .latent_format import LatentFormat, latent_format_of, no_preview_reason, vae_channels
from .preview_decoder import DECODER_SIDE, PreviewDecoder

PREVIEW_SIDE = 64
"""Latent pixels on the preview's long side at most (the console shows it in fewer cells than that)."""


def _grid(tokens: int, height: int | None, width: int | None) -> tuple[int, int] | None:
    """(rows, columns) of a packed token sequence, from the request's aspect (square when unknown)."""
    aspect = (height / width) if height and width else 1.0
    rows = max(1, round(math.sqrt(tokens * aspect)))
    for candidate in sorted(range(1, tokens + 1), key=lambda r: abs(r - rows))[:64]:
        if tokens % candidate == 0:
            return candidate, tokens // candidate
    return None


def latent_image(latents: torch.Tensor, channels: int, *, height: int | None = None, width: int | None = None,
                 spatial_ratio: int | None = None) -> torch.Tensor | None:
    """The first item's latent as (channels, h, w) (a video: its middle frame), or None where its layout is
    not one diffusers uses: (B, C, H, W), (B, C, F, H, W), (B, F, C, H, W) (CogVideoX), tokens packed 2x2
    (B, N, 4C) (Flux, Qwen-Image) or one per latent pixel (B, F·H·W, C) (LTX)."""
    x = latents.detach()
    if x.dim() == 4 and x.shape[1] == channels:
        return x[0]
    if x.dim() == 5 and x.shape[1] == channels:
        return x[0, :, x.shape[2] // 2]
    if x.dim() == 5 and x.shape[2] == channels:
        return x[0, x.shape[1] // 2]
    if x.dim() != 3:
        return None
    tokens, depth = x.shape[1], x.shape[2]
    if depth == 4 * channels:
        grid = _grid(tokens, height, width)
        if grid is None:
            return None
        rows, cols = grid
        return x[0].reshape(rows, cols, channels, 2, 2).permute(2, 0, 3, 1, 4).reshape(channels, rows * 2, cols * 2)
    if depth == channels and height and width and spatial_ratio:
        rows, cols = height // spatial_ratio, width // spatial_ratio
        if rows < 1 or cols < 1 or tokens % (rows * cols):
            return None
        frames = tokens // (rows * cols)
        return x[0].reshape(frames, rows, cols, channels)[frames // 2].permute(2, 0, 1)
    return None


def shrink(image: torch.Tensor, side: int = PREVIEW_SIDE) -> torch.Tensor:
    """Average-pooled to at most `side` pixels on the long side, as float32."""
    image = image.float()
    factor = math.ceil(max(image.shape[-2:]) / side)
    if factor > 1:
        image = F.avg_pool2d(image.unsqueeze(0), factor, ceil_mode=True).squeeze(0)
    return image


class StepPreviewer:
    """Captures each step's latent for one request and publishes it as a `StepPreview`."""

    def __init__(self, bus: EventBus, request_id: int, total_steps: int, device: torch.device,
                 fmt: LatentFormat | None, *, note: str = "", height: int | None = None,
                 width: int | None = None, spatial_ratio: int | None = None,
                 decoder: PreviewDecoder | None = None) -> None:
        self.bus, self.request_id, self.total_steps, self.device = bus, request_id, total_steps, device
        self.fmt, self.note, self.decoder = fmt, note, decoder
        self.height, self.width, self.spatial_ratio = height, width, spatial_ratio
        self.published = 0
        self._said_none = False
        self._pending: tuple[int, Any, torch.Tensor] | None = None
        self._wake = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def capture(self, step: int, latents: Any) -> None:
        """Step `step` (1-based) ended with `latents`: hand its preview on (without waiting for the device)."""
        if (self.fmt is None and self.decoder is None) or self.note or not isinstance(latents, torch.Tensor):
            self._say_none(step, self.note or "no preview")
            return
        if self._stream is None:
            small = self._small(latents)
            if small is None:
                self._say_none(step, f"no preview: latents of shape {tuple(latents.shape)} not understood")
                return
            self._publish(step, small.clone().numpy())
            return
        self._capture_cuda(step, latents)

    def _small(self, latents: torch.Tensor) -> torch.Tensor | None:
        """What is copied to the host: the latent reduced (factors), or the decoder's picture (uint8)."""
        channels = self.decoder.channels if self.decoder is not None else self.fmt.channels  # type: ignore[union-attr]
        image = latent_image(latents, channels, height=self.height, width=self.width,
                             spatial_ratio=self.spatial_ratio)
        if image is None:
            return None
        if self.decoder is not None:
            return self.decoder.decode(shrink(image, DECODER_SIDE))
        return shrink(image)

    def _capture_cuda(self, step: int, latents: torch.Tensor) -> None:
        stream = self._stream
        assert stream is not None
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            small = self._small(latents)
            if small is None:
                self._say_none(step, f"no preview: latents of shape {tuple(latents.shape)} not understood")
                return
            host = torch.empty(small.shape, dtype=small.dtype, pin_memory=True)
            host.copy_(small, non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
        latents.record_stream(stream)  # its memory is not reused before the side stream has read it
        with self._wake:
            self._pending = (step, done, host)  # an unpublished older step is dropped: the newest counts
            self._wake.notify()
        if self._thread is None:
            self._thread = threading.Thread(target=self._publish_loop, name="step-preview", daemon=True)
            self._thread.start()

    def _publish_loop(self) -> None:
        while True:
            with self._wake:
                while self._pending is None and not self._closed:
                    self._wake.wait()
                if self._pending is None:
                    return
                step, done, host = self._pending
                self._pending = None
            done.synchronize()  # this thread waits for the copy; the compute stream never does
            self._publish(step, host.numpy().copy())

    def _publish(self, step: int, array: Any) -> None:
        if self.decoder is not None:
            self.bus.publish(StepPreview(request_id=self.request_id, step=step, total_steps=self.total_steps,
                                         rgb=array, latent_format=self.decoder.path.name))
        else:
            assert self.fmt is not None
            self.bus.publish(StepPreview(request_id=self.request_id, step=step, total_steps=self.total_steps,
                                         latent=array, factors=self.fmt.factors, bias=self.fmt.bias,
                                         latent_format=self.fmt.name))
        self.published += 1

    def _say_none(self, step: int, note: str) -> None:
        if not self._said_none:  # once per request
            self._said_none = True
            self.bus.publish(StepPreview(request_id=self.request_id, step=step, total_steps=self.total_steps,
                                         latent=None, note=note))

    def close(self) -> None:
        """The request ended: the last capture is published, then the thread ends."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=5.0)


def step_previewer(pipe: Any, bus: EventBus, request_id: int, total_steps: int, device: torch.device,
                   kwargs: dict[str, Any], decoder: PreviewDecoder | None = None) -> StepPreviewer:
    """A previewer for this request on this pipeline (its latent format decided by its VAE, or `decoder`)."""
    fmt = latent_format_of(pipe)
    note = "" if fmt else no_preview_reason(pipe)
    if decoder is not None:
        channels = vae_channels(getattr(pipe, "vae", None))
        note = "" if channels == decoder.channels else (
            f"no preview: {decoder.path.name} decodes {decoder.channels} latent channels, this model's VAE has "
            f"{channels or '?'}")
    height, width = kwargs.get("height"), kwargs.get("width")
    sample, scale = getattr(pipe, "default_sample_size", None), getattr(pipe, "vae_scale_factor", None)
    if height is None and isinstance(sample, int) and isinstance(scale, int):
        height = width = sample * scale
    ratio = getattr(pipe, "vae_spatial_compression_ratio", None)
    return StepPreviewer(bus, request_id, total_steps, device, fmt, note=note, decoder=decoder,
                         height=height if isinstance(height, int) else None,
                         width=width if isinstance(width, int) else None,
                         spatial_ratio=ratio if isinstance(ratio, int) else None)
