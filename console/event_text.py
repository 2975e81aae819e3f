"""Every event's line of text: the staging log, the loading screen and `run`'s stderr progress.

One place words each event, so the live log, the loading log and the headless progress lines
cannot drift apart. Lines in the logs carry a `+seconds` stamp relative to the first event;
progress lines on stderr carry a style instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..engine import events
from ..engine.api import plain
from ..offload.units import format_bytes, format_seconds
from .compile_flags import describe_compile_phase
from .theme_colors import resolve_default

FAILURE_STYLE = "$error"
"""A failure line on stderr: the default theme's error colour (`run` has no app, hence no active theme)."""
WARNING_STYLE = "$warning"
PHASE_LABELS = {"text_encoding": "text encoding", "denoise": "denoise", "vae_decode": "VAE decode"}


def stamp(event: events.Event, t0: float) -> str:
    """`+    1.234s`: the event's time since `t0`, aligned for a log column."""
    return f"+{event.t - t0:9.3f}s"


def format_staging(event: events.StagingEvent, *, on_cpu: bool = False) -> str:
    """What one transfer really did, without the timestamp.

    An offload moves no bytes on any device (the component is re-pointed to its host master copy),
    so it is never reported as a device→host copy at 0.0 GB/s. On a CPU there is no device link:
    a "transfer" is a host copy, and a GB/s figure would read as link bandwidth.
    """
    sync = "  SYNC" if event.sync else ""
    if event.tier != "pinned":  # read from its file at this use (offload/tier_filler.py)
        sync += f"  from {event.tier.replace('_', ' ')}"
    if event.direction == "d2h" and event.nbytes == 0:
        return f"offload {event.target} (re-pointed to host master, no copy) {event.seconds * 1e3:.1f} ms{sync}"
    if on_cpu:  # not "H2D": there is no device to copy to
        return (
            f"COPY {event.target}  {format_bytes(event.nbytes)}  {event.seconds:.4f} s"
            f"  host copy (CPU: no device link){sync}"
        )
    rate = f"{event.gbps:6.1f} GB/s" if event.seconds > 0 else "     n/a GB/s"
    return (
        f"{event.direction.upper()} {event.target}  {format_bytes(event.nbytes)}"
        f"  {event.seconds:.4f} s  {rate}{sync}"
    )


def format_event(event: events.Event, t0: float = 0.0, *, on_cpu: bool = False) -> str | None:
    """One log line for an event the staging log shows; None for other event types.

    Names and messages in events come from data (component names, library errors): the line is
    `plain`, so a control character in them is shown escaped, never sent to the terminal."""
    line = _event_line(event, t0, on_cpu=on_cpu)
    return None if line is None else plain(line)


def _event_line(event: events.Event, t0: float, *, on_cpu: bool) -> str | None:
    ts = stamp(event, t0)
    if isinstance(event, events.StagingEvent):
        return f"{ts} {format_staging(event, on_cpu=on_cpu)}"
    if isinstance(event, events.BlocksSkipped):
        span = event.first if event.blocks == 1 else f"{event.first} .. {event.last}"
        return (f"{ts} SKIP {span}  {event.blocks} block{'s' if event.blocks != 1 else ''}, "
                f"{format_bytes(event.nbytes)} not copied (step cache hit)")
    if isinstance(event, events.CacheDecision):
        nums = [
            f"{name} {format_bytes(value)}"
            for name, value in (
                ("reserved", event.reserved),
                ("allocated", event.allocated),
                ("cached", event.cached),
                ("free", event.free),
                ("total", event.total),
            )
            if value is not None
        ]
        forced = " (forced)" if event.forced else ""
        context = getattr(event, "context", "")  # newer events say which boundary asked
        if context:
            forced += f" {context}"
        return f"{ts} CACHE {event.action}{forced}: {event.reason}" + (
            f"  [{', '.join(nums)}]" if nums else ""
        )
    if isinstance(event, events.OomRetry):
        msg = f": {event.message}" if event.message else ""
        size = format_bytes(event.nbytes)
        return f"{ts} OOM {event.component} {size} — cache released, attempt {event.attempt}{msg}"
    if isinstance(event, events.OomStepDown):
        phase = PHASE_LABELS.get(event.phase, event.phase)
        why = f" ({one_line(event.message)})" if event.message else ""
        return f"{ts} OOM {phase} ({event.component}) — {describe_step_down(event)}{why}"
    if isinstance(event, events.LogEvent):
        return f"{ts} {event.level.upper()} {event.message}"
    if isinstance(event, events.Replanned):
        return f"{ts} REPLAN {event.summary.removeprefix('re-plan: ')}"
    if isinstance(event, events.ExpertSwitched):
        return f"{ts} EXPERT {describe_switch(event)}"
    if isinstance(event, events.ErrorEvent):
        return f"{ts} ERROR {event.where}: {event.message}"
    if isinstance(event, events.CompilePhase):
        return f"{ts} COMPILE {describe_compile_phase(event)}"
    return None


def describe_switch(event: events.ExpertSwitched) -> str:
    """`transformer → transformer_2 at timestep 857 (boundary): copied 1.2 GB, freed 1.2 GB in 25 ms`."""
    when = f" at timestep {event.timestep:g}" if event.timestep is not None else ""
    return (f"{event.from_expert} → {event.to_expert}{when} ({event.reason}): copied "
            f"{format_bytes(event.copied_bytes + event.ring_bytes)}, freed {format_bytes(event.freed_bytes)} "
            f"in {format_seconds(event.seconds)}")


def loading_line(event: events.Event, t0: float, *, on_cpu: bool = False) -> str | None:
    """A loading-screen log line: state changes and finished components, then what `format_event` says
    (`on_cpu`: transfers are host copies, worded as such and without a rate)."""
    if isinstance(event, events.EngineStateChanged):
        return plain(f"{stamp(event, t0)} STATE {event.old} → {event.new} {event.reason}".rstrip())
    if isinstance(event, events.LoadProgress):
        if event.done_bytes < event.total_bytes:
            return None
        return plain(f"{stamp(event, t0)} LOAD {event.component} {event.phase} {format_bytes(event.total_bytes)}")
    return format_event(event, t0, on_cpu=on_cpu)


def progress_line(event: object) -> tuple[str, str] | None:
    """The stderr line (text, style) for an event worth a line, else None (its text `plain`)."""
    line = _progress_line(event)
    return None if line is None else (plain(line[0]), line[1])


def _progress_line(event: object) -> tuple[str, str] | None:
    if isinstance(event, events.EngineStateChanged):
        return f"state {event.old} → {event.new} {event.reason}".rstrip(), "dim"
    if isinstance(event, events.StepTiming):
        missed = f", {event.sync_fetches} blocks fetched synchronously" if event.sync_fetches else ""
        if event.cache_forwards:
            missed += (f", cache hit {event.cache_hits}/{event.cache_forwards}, skipped "
                       f"{format_bytes(event.skipped_bytes)}")
        return (f"step {event.step}/{event.total_steps} {format_seconds(event.wall_s)} "
                f"(stall {format_seconds(event.stall_s)}{missed})"), "dim"
    if isinstance(event, events.BlockOrderCorrected):
        return event.summary, resolve_default(WARNING_STYLE)
    if isinstance(event, events.LoadProgress) and event.done_bytes == event.total_bytes and event.total_bytes:
        return f"load {event.component} {format_bytes(event.total_bytes)} ({event.phase})", "dim"
    if isinstance(event, events.Replanned):
        return event.summary, "dim"
    if isinstance(event, events.ExpertSwitched):
        return f"expert {describe_switch(event)}", "dim"
    if isinstance(event, events.RequestPhases):
        return f"request {event.request_id}: {describe_phases(event.frames, event.latent_shape, event.phases)}", "dim"
    if isinstance(event, events.CompilePhase):
        return describe_compile_phase(event), "dim"
    if isinstance(event, events.ErrorEvent):
        return f"{event.where} failed: {one_line(event.message)}", resolve_default(FAILURE_STYLE)
    if isinstance(event, events.OomRetry):
        return (f"out of device memory loading {event.component} ({format_bytes(event.nbytes)}): "
                f"allocator cache released, retrying once"), resolve_default(FAILURE_STYLE)
    if isinstance(event, events.OomStepDown):
        return (f"out of device memory in {PHASE_LABELS.get(event.phase, event.phase)} ({event.component}): "
                f"{describe_step_down(event)}"), resolve_default(FAILURE_STYLE)
    return None


def describe_step_down(event: events.OomStepDown) -> str:
    """`cache released, stepped down: DiT 8→4 resident …, retrying the phase once`."""
    return f"cache released, stepped down: {one_line(event.action)}; retrying the phase once"


def describe_phases(frames: int, latent_shape: Sequence[int] | None, phases: dict[str, float]) -> str:
    """`5 frames, latents 1x16x2x4x4; text encoding 0.12 s, denoise 0.80 s, VAE decode 0.31 s`."""
    what = f"{frames} frame{'s' if frames != 1 else ''}" if frames else "audio"  # no frame: an audio-only result
    if latent_shape:
        what += f", latents {'x'.join(map(str, latent_shape))}"
    times = ", ".join(f"{PHASE_LABELS.get(k, k)} {format_seconds(v)}" for k, v in phases.items())
    return f"{what}; {times}" if times else what


def one_line(text: str) -> str:
    """The first line of a message (stderr progress is one line per event); where that line only names the
    error ("ImportError:", libraries' messages that start with a newline), the next line that says something
    is joined to it, so a reason is never empty."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return ""
    if lines[0].endswith(":") and len(lines) > 1:
        return f"{lines[0]} {lines[1]}"
    return lines[0]


def forecast_check_text(check: events.ForecastCheck) -> str:
    """Predicted vs measured after a request, in one line: step time, then peak."""

    def part(name: str, predicted: str | None, measured: str | None, error: float | None, source: str) -> str:
        if measured is None:
            return f"{name}: not measurable here"
        if predicted is None:
            return f"{name}: measured {measured} (no forecast yet; cached for the next request)"
        return f"{name}: forecast {predicted} vs measured {measured} ({error * 100:+.1f}%, {source})"

    step = part("step", format_seconds(check.predicted_step_s) if check.predicted_step_s is not None else None,
                format_seconds(check.measured_step_s) if check.measured_step_s is not None else None,
                check.step_error, check.step_basis or check.step_source)
    peak = part("peak", format_bytes(check.predicted_peak) if check.predicted_peak is not None else None,
                format_bytes(check.measured_peak) if check.measured_peak is not None else None,
                check.peak_error, check.peak_basis or check.peak_source)
    return f"forecast · {step} · {peak}"
