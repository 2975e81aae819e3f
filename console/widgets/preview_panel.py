"""The preview panel of the live screen: the running request's newest step preview, then its output.

Hidden until there is something to show (a step preview, a "no preview" note, an output), so a screen
without requests looks as before. Step previews are the engine's small latents turned into RGB here
(`latent_rgb`); the router hands only the newest one on (older ones are dropped when the UI is behind).
An output preview is decoded off the UI thread (`output_frames`, in a thread worker) and drawn when read:
in half-block cells, or where `--preview auto` found a pixel protocol (Sixel, Kitty's) by textual-image's
widget for it (a new widget per output: replacing the image of one does not redraw under those protocols).
Step previews stay half-block cells (they change every step).
`i` (the live screen's key) turns previews off and on; while off nothing is converted or decoded.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.widget import Widget

from ...engine import events
from ...engine.api import plain
from ..latent_rgb import latent_to_rgb
from ..output_frames import OutputFrames, read_output, strip_and_middle
from ..preview_mode import HALFBLOCK, SIXEL, TGP
from .halfblock import HalfBlockImage

PREVIEW_OFF = "previews off (v turns them on)"


class PreviewPanel(Widget):
    """Newest step preview or the last output, in half-block cells."""

    DEFAULT_CSS = """
    PreviewPanel { height: 10; border: round $primary; padding: 0 1; }
    """

    def __init__(self, *, enabled: bool = True, protocol: str = HALFBLOCK, id: str | None = None) -> None:
        super().__init__(id=id)
        self.enabled, self.protocol = enabled, protocol
        self.pixels: Widget | None = None  # the pixel-protocol image of the last output (auto mode only)
        self.body: Any = Text("")
        self.step_previews = 0  # drawn this request (what the tests read back)
        self.output: OutputFrames | None = None
        self.output_path: Path | None = None
        self.output_requested_at: float | None = None  # time.monotonic() when the output was handed over
        self.output_delays: list[float] = []  # handed over → drawn, seconds, per output (the benchmark reads them)
        self.step_delays: list[float] = []  # a step preview's publication (its event's `t`) → drawn, seconds
        self.display = False  # until there is something to show

    def render(self) -> Any:
        return self.body

    def _show(self, title: str, body: Any) -> None:
        if self.pixels is not None:
            self.pixels.remove()
            self.pixels = None
        self.border_title = title
        self.body = body
        self.display = True
        self.refresh(layout=True)

    def show_step(self, event: events.StepPreview) -> None:
        """A step's latent (or the request's "no preview" note)."""
        if not self.enabled:
            return
        if event.rgb is not None:  # a --preview-decoder's picture
            self.step_previews += 1
            self.step_delays.append(time.monotonic() - event.t)
            title = f"step {event.step}/{event.total_steps} · {plain(event.latent_format)}"
            self._show(title, HalfBlockImage(event.rgb))
            return
        if event.latent is None:
            self._show(f"request {event.request_id} · step preview", Text(plain(event.note), style="dim"))
            return
        rgb = latent_to_rgb(event.latent, event.factors, event.bias)
        self.step_previews += 1
        self.step_delays.append(time.monotonic() - event.t)
        self._show(f"step {event.step}/{event.total_steps} · {event.latent_format} factors", HalfBlockImage(rgb))

    def show_output(self, path: Path) -> None:
        """A request's output file was written: read it on a thread, then draw it."""
        if not self.enabled:
            return
        self.output_path = Path(path)
        if self.output_path.suffix.lower() in (".wav", ".flac"):  # an audio-only pipeline's result: no picture
            self._show("output", Text(plain(f"audio: {self.output_path.name} (nothing to draw)"), style="dim"))
            return
        self.output_requested_at = time.monotonic()
        self.run_worker(lambda: read_output(Path(path)), thread=True, group="output-preview", exclusive=True,
                        name="output-preview")

    def on_worker_state_changed(self, event: Any) -> None:
        worker = event.worker
        if worker.name != "output-preview" or not worker.is_finished:
            return
        if worker.error is not None:
            self._show("output preview", Text(plain(f"cannot show {self.output_path}: {worker.error}"), style="dim"))
            return
        frames = worker.result
        if isinstance(frames, OutputFrames) and self.enabled:
            self.show_frames(frames)

    def show_frames(self, frames: OutputFrames) -> None:
        """Draw a read output: the image, or a video's middle frame above its strip."""
        self.output = frames
        if self.output_requested_at is not None:
            self.output_delays.append(time.monotonic() - self.output_requested_at)
            self.output_requested_at = None
        what = f"{frames.frame_count} frames: middle and strip" if frames.is_video else "image"
        picture = strip_and_middle(frames)
        pixel_widget = pixel_image_class(self.protocol)
        if pixel_widget is None:
            self._show(f"output · {plain(frames.path.name)} · {what}", HalfBlockImage(picture))
            return
        self._show(f"output · {plain(frames.path.name)} · {what}", Text(""))
        self.pixels = pixel_widget(picture)
        self.mount(self.pixels)

    def toggle(self) -> bool:
        """`i`: previews off (the panel says so) or on again (the next step or output shows); returns on/off."""
        self.enabled = not self.enabled
        if not self.enabled:
            self._show("preview", Text(PREVIEW_OFF, style="dim"))
        else:
            self._show("preview", Text("previews on: the next step or output shows here", style="dim"))
        return self.enabled


def pixel_image_class(protocol: str) -> Any:
    """textual-image's widget for a pixel protocol (SIXEL, TGP), or None for half-block cells."""
    if protocol not in (SIXEL, TGP):
        return None
    from textual_image.widget import SixelImage, TGPImage

    return SixelImage if protocol == SIXEL else TGPImage
