"""Where a video request's time went: frames, latent size and the three phases, in two short lines.

VAE decode can take longer than every denoise step together on a short video request, and the
step panel shows denoise only, so the operator needs text encoding, denoise and VAE decode side
by side (seconds and share) to know what to tune. Both lines fit 78 columns (80x24 with padding),
so they never push the panels below out of sight. Fed by the engine's `RequestPhases` event.
"""

from __future__ import annotations

from textual.widgets import Static

from omni_console.offload.units import format_bytes

from ...engine import events
from .text_update import set_text

PHASE_LABELS = (("text_encoding", "text encoding"), ("denoise", "denoise"), ("vae_decode", "VAE decode"))
"""The phases in the order they run, with the words the operator reads."""


def format_latent(shape: tuple[int, ...] | None) -> str:
    """`1×16×2×8×8` (batch × channels × frames × height × width as the pipeline holds them)."""
    return "×".join(str(n) for n in shape) if shape else "unknown"


def short_seconds(seconds: float) -> str:
    """Three significant figures at most (`0.149 s`, `95.8 s`, `812 s`): the three phases stay on one line."""
    if seconds < 1:
        return f"{seconds:.3f} s"
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 100:
        return f"{seconds:.1f} s"
    return f"{seconds:.0f} s"


def frames_word(frames: int) -> str:
    if not frames:  # a finished request with no frame made audio only (Stable Audio, ACE-Step)
        return "audio"
    return f"{frames} frame" if frames == 1 else f"{frames} frames"


def describe_phases(event: events.RequestPhases) -> tuple[str, str]:
    """(what was made, where the time went): the two lines the live screen shows.

    Shares are of the measured phases together (what the operator can shift between them); a phase
    the engine did not measure is left out rather than shown as zero.
    """
    head = f"request {event.request_id}: {frames_word(event.frames)} · latent {format_latent(event.latent_shape)}"
    if event.vae_decode_peak_bytes is not None:
        head += f" · VAE decode peak {format_bytes(event.vae_decode_peak_bytes)}"
    measured = [(label, event.phases[key]) for key, label in PHASE_LABELS if key in event.phases]
    total = sum(seconds for _, seconds in measured)
    if not measured:
        return head, "phases not measured"
    parts = [f"{label} {short_seconds(seconds)} ({100 * seconds / total:.0f}%)" if total > 0
             else f"{label} {short_seconds(seconds)}" for label, seconds in measured]
    return head, " · ".join(parts)


def is_video(event: events.RequestPhases) -> bool:
    """A request that made more than one frame (an image request is fully told by the step panel)."""
    return event.frames > 1


class RequestPhasesLine(Static):
    """Two lines under the request line; hidden until a video request runs."""

    DEFAULT_CSS = """
    RequestPhasesLine { height: auto; max-height: 2; padding: 0 1; color: $text-muted; display: none; }
    RequestPhasesLine.-shown { display: block; }
    """

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002 - Textual's keyword
        super().__init__("", id=id, markup=False)
        self.text = ""

    def _show(self, text: str) -> None:
        self.text = text
        self.set_class(bool(text), "-shown")
        set_text(self, text)

    def show_phases(self, event: events.RequestPhases) -> None:
        """The finished request's breakdown (video requests only; an image request hides the lines)."""
        self._show("\n".join(describe_phases(event)) if is_video(event) else "")

    def show_pending(self, frames: int | None) -> None:
        """A request just started: how many frames it makes (None: not a video request → hidden)."""
        if frames is None or frames <= 1:
            self._show("")
            return
        self._show(f"request: {frames_word(frames)} · latent size and phase times when it ends")
