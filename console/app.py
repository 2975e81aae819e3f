"""The omni-console Textual app: plan → load → live, around one in-process engine.

Threads: the engine runs on `EngineWorker`'s thread and telemetry on the sampler's; both only
publish onto the engine's event bus. The app drains its bus subscription on a Textual timer and
applies every event on its own thread, so the UI never blocks on the GPU and no sample or
staging event is coalesced away (drops are counted and shown). Commands go down as worker
futures whose completion comes back as a `CommandDone` message.

A full gen-2 garbage collection over a loaded pipeline plus the UI takes 0.1–0.3 s and holds the
GIL, stalling the engine mid-step; after a load the app therefore `gc.freeze()`s what exists (the
model, the UI) and `gc.unfreeze()`s before unload so the released model can be collected.

Quit never waits for the engine: a step of a big video model can run for minutes inside one
kernel. `q` cancels, queues the release behind the command in flight (`EngineWorker.request_shutdown`),
gives it QUIT_RELEASE_WAIT_S to finish and exits; the engine thread is a daemon that is never
joined, and `app_main.run_app` ends the process at once (after the terminal is restored) when it
is still busy. SIGTERM and SIGHUP take the same path (`quit_on_signal`).

Everything the app depends on can be injected (engine, worker, telemetry sources or sampler,
bandwidth, output directory) so pilot tests run deterministically on CPU without sleeps.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import time
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.message import Message
from textual.notifications import Notify
from textual.screen import Screen
from textual.timer import Timer

from ..engine.engine import Engine
from ..engine.export import vllm_serve_command
from ..engine.loader import LoadCancelled
from ..engine.plan import Plan
from ..engine.runner import GenerateRequest
from ..engine.worker import EngineWorker
from ..offload.errors import ConfigError, PolicyError
from ..offload.events import (
    CacheDecision,
    EngineStateChanged,
    ErrorEvent,
    Event,
    LoadProgress,
    LogEvent,
    OomRetry,
    RequestFinished,
    RequestPhases,
    RequestStarted,
    StagingEvent,
    StepTiming,
    TelemetryEvent,
)
from ..offload.policy import OffloadPolicy
from ..offload.telemetry import DEFAULT_HZ, Source, TelemetrySampler, TelemetrySnapshot, default_sources
from ..offload.units import format_bytes, format_seconds
from ..themes import CSS_PATH, DEFAULT_THEME, THEMES, register_themes
from . import policy_edits, request_outcome
from .bandwidth import ObservedBandwidth, measure_h2d_bandwidth
from .commands import console_commands
from .device_info import read_device_info
from .event_text import loading_line
from .generate_form import RequestForm, expected_frames
from .headless import default_request
from .outputs import save_result
from .residency import residency_rows
from .screens import GenerateDialog, HelpScreen, LiveScreen, PlanScreen
from .screens.help import Section, binding_rows
from .toasts import toasts_replaced_by
from .widgets import HISTORY_SAMPLES, FilterBar
from .widgets.plan_forecast import LinkInfo

DEFAULT_PROMPT = "a lighthouse on a cliff at dusk"
DRAIN_INTERVAL_S = 0.1
"""How often the bus is drained; each drain updates each widget at most once."""
DRAIN_MAX_EVENTS = 5000
LIGHT_UI_S = 0.25
"""The request's progress bar and line redraw at most this often."""
HEAVY_UI_S = 0.5
HEAVY_UI_BUSY_S = 1.0
"""Staging log, memory panels, step table and residency redraw at most this often (idle / while a
request runs); no sample, step or event is skipped, they are applied in groups."""
DEFAULT_OUT_DIR = Path("omni-console-out")
QUIT_RELEASE_WAIT_S = 0.8
"""q waits at most this long for the engine's release before the app exits (it continues on the
engine thread; a process that exits first leaves the memory to the OS)."""
SAMPLER_STOP_S = 0.3

COPY_NOTICE = ("sent to the terminal's clipboard (OSC 52: the terminal may or may not accept it; "
               "tmux and ssh often drop it) — to select by hand:")
NAVIGATION_ROWS = [
    ("tab / shift+tab", "focus the next / previous panel (its title is shown reversed)"),
    ("pgup / pgdn, home / end", "scroll the focused panel (or the screen around it)"),
]
PLAN_TABLE_ROWS = [("↑ / ↓", "move the selection in the component table (as j / k)")]

Phase = Literal["plan", "loading", "live", "unloading", "quitting"]
LOG_EVENTS = (StagingEvent, CacheDecision, OomRetry, LogEvent, ErrorEvent)


@dataclass
class _Batch:
    """What one drain collected, applied to each widget once."""

    log: list[Event] = field(default_factory=list)
    steps: list[StepTiming] = field(default_factory=list)
    progress: dict[str, LoadProgress] = field(default_factory=dict)
    load_lines: list[str] = field(default_factory=list)
    generation: str | None = None
    telemetry: bool = False


class CommandDone(Message):
    """A worker future finished (posted from the engine thread; handled on the UI thread)."""

    def __init__(self, kind: str, future: Future, output: Path | None = None, save_error: str | None = None) -> None:
        super().__init__()
        self.kind = kind
        self.future = future
        self.output = output
        self.save_error = save_error


def theme_or_error(name: str | None) -> str:
    """The theme to start with; an unknown name is a ConfigError listing the valid ones."""
    if name is None:
        return DEFAULT_THEME
    if name not in THEMES:
        raise ConfigError(f"unknown theme {name!r}; valid themes: {', '.join(sorted(THEMES))}")
    return name


class OmniConsoleApp(App[int]):
    """The operator console. `run()` returns 0 after a clean quit."""

    CSS_PATH = CSS_PATH
    TITLE = "omni-console"
    BINDINGS = [
        Binding("q", "quit", "quit", id="app.quit", tooltip="quit: cancel, release memory, stop threads"),
        Binding("ctrl+q", "quit", "quit", show=False, priority=True, id="app.quit_ctrl",
                tooltip="quit (also from text fields)"),
        Binding("t", "cycle_theme", "theme", id="app.theme", show=False, tooltip="next theme"),
        Binding("question_mark,f1", "help", "help", id="app.help", tooltip="this list of keys"),
    ]

    def __init__(
        self,
        engine: Engine,
        policy: OffloadPolicy,
        *,
        sampler: TelemetrySampler | None = None,
        sources: Sequence[Source] | None = None,
        telemetry_hz: float = DEFAULT_HZ,
        start_telemetry: bool | None = None,
        theme: str | None = None,
        bandwidth: float | None = None,
        out_dir: Path | str | None = None,
        worker: EngineWorker | None = None,
        prompt: str = DEFAULT_PROMPT,
        save_partial: bool = False,
    ) -> None:
        """Validate everything that can be wrong (theme, policy) before the app ever runs.

        Telemetry: `sampler` is used as given; else one is built from `sources` (default: the
        device's torch/NVML/host sources). The sampling thread starts when `start_telemetry`
        is True, or by default only for the real sources — injected ones are driven by the
        test (`app.sampler.sample_now(publish=True)` then `app.drain_events()`).
        `save_partial`: also save the image of a request cancelled before its last step (by default
        a half-denoised image is not saved: it is not a result).
        """
        self.initial_theme = theme_or_error(theme)
        plan = engine.make_plan(policy)  # PolicyError (a ConfigError) before anything runs
        super().__init__()
        self.engine = engine
        self.policy = policy
        self.plan: Plan = plan
        self.worker = worker or EngineWorker(engine)
        self.sub = engine.bus.subscribe()
        if sampler is None:
            real = sources is None
            srcs = list(default_sources(engine.device)) if real else list(sources or [])
            sampler = TelemetrySampler(*srcs, bus=engine.bus, hz=telemetry_hz)
            self.start_telemetry = real if start_telemetry is None else start_telemetry
        else:
            self.start_telemetry = bool(start_telemetry)
        self.sampler = sampler
        self.device_info = read_device_info(engine.device)
        self.bandwidth = bandwidth
        self.bandwidth_source = "given" if bandwidth else ""
        self.observed = ObservedBandwidth()
        self.out_dir = Path(out_dir) if out_dir is not None else DEFAULT_OUT_DIR
        self.prompt = prompt
        self.save_partial = save_partial
        self.exit_code = 0
        self.phase: Phase = "plan"
        self.generating = False
        self.busy: Future | None = None
        self.last_command: dict[str, Future] = {}
        self.snapshot: TelemetrySnapshot | None = None
        self.telemetry_history: deque[TelemetrySnapshot] = deque(maxlen=HISTORY_SAMPLES)
        self.plan_screen = PlanScreen()
        self.live_screen: LiveScreen | None = None
        self.notices: list[tuple[str, str]] = []
        self.last_output: Path | None = None
        self.last_error: str | None = None
        self.request_id: int | None = None
        """The engine's number of the request running or last run (from its RequestStarted event)."""
        self.load_seconds: float | None = None
        self._mode_stash: OffloadPolicy | None = None
        self._t0: float | None = None
        self._drain_timer: Timer | None = None
        self._heavy_at = [0.0, 0.0, 0.0]  # log, memory, steps: when each was last redrawn
        self._light_at = 0.0
        self._pending_progress: StepTiming | None = None
        self._pending_generation: str | None = None
        self._pending_snapshots: list[TelemetrySnapshot] = []
        self._pending_steps: list[StepTiming] = []
        self._pending_log: list[Event] = []
        self._link_rows: object = None
        self._closed = False
        self._released: Future[None] | None = None
        self._ui_loop: asyncio.AbstractEventLoop | None = None
        self._quit_pending = False

    # ------------------------------------------------------------------ lifecycle

    def on_mount(self) -> None:
        self._ui_loop = asyncio.get_running_loop()
        if self._quit_pending:  # a signal arrived before the event loop ran
            self.call_later(self.action_quit)
        register_themes(self, activate=self.initial_theme)
        self.sub_title = str(self.engine.model.path)
        self.push_screen(self.plan_screen)
        self._drain_timer = self.set_interval(DRAIN_INTERVAL_S, self._tick, name="drain-events")
        if self.start_telemetry:
            self.sampler.sample_now(publish=True)  # the header's free memory before the first tick
            self.sampler.start()
        if self.bandwidth is None and self.device_info.is_cuda:
            future = self.worker.call(lambda engine: measure_h2d_bandwidth(engine.device))
            future.add_done_callback(lambda f: self._post_from_worker(CommandDone("bandwidth", f)))

    def _post_from_worker(self, message: Message) -> None:
        """post_message from the engine thread; a command that ends after the app has gone is dropped."""
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody is left to tell
            self.post_message(message)

    def begin_shutdown(self) -> Future[None]:
        """Never waits for the engine: stop telemetry, cancel, queue the release (idempotent).

        Returns the release's future; it completes on the engine thread once the command in flight
        (if any) has returned and `engine.close()` has run.
        """
        if self._released is None:
            self._closed = True
            gc.unfreeze()  # the model's objects must be collectable when the engine drops them
            self.sampler.stop(timeout=SAMPLER_STOP_S)
            self.sampler.close()
            self._released = self.worker.request_shutdown()
            self.sub.close()
        return self._released

    def shutdown(self, timeout: float | None = QUIT_RELEASE_WAIT_S) -> bool:
        """`begin_shutdown()`, then wait at most `timeout` s for the release; True when it is done."""
        released = self.begin_shutdown()
        concurrent.futures.wait([released], timeout=timeout)
        return released.done()

    async def action_quit(self) -> None:
        """q / ctrl+q: cancel, release, exit — within QUIT_RELEASE_WAIT_S whatever the engine is doing.

        The release is queued on the engine thread; the UI polls it (never blocks on it) and exits
        when it is done or the wait is over. A step stuck in a kernel is not waited for.
        """
        if self.phase == "quitting":
            return
        self.phase = "quitting"
        if self._drain_timer is not None:
            self._drain_timer.stop()
        self.say("shutting down: cancelling, releasing memory…")
        released = self.begin_shutdown()
        deadline = time.monotonic() + QUIT_RELEASE_WAIT_S
        while not released.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self._stop_key_reader()
        self.exit(self.exit_code)

    def _stop_key_reader(self) -> None:
        """Stop the terminal driver's key-reading thread now that nothing reads keys.

        On the way out Textual's Linux driver joins that thread, which polls in 0.1 s selects and
        sleeps one more after its last: about 200 ms of a 300 ms quit. With its exit event already
        set the driver skips the join (Textual's own check); mouse reporting is switched off here
        instead, since the driver then skips that too.
        """
        driver = self._driver
        exit_event = getattr(driver, "exit_event", None)
        if driver is None or self.is_headless or exit_event is None or exit_event.is_set():
            return
        with contextlib.suppress(Exception):
            driver._disable_mouse_support()  # type: ignore[attr-defined]
            driver.flush()
        exit_event.set()

    def quit_on_signal(self, signum: int) -> None:
        """From a signal handler (SIGTERM, SIGHUP): quit like q, exit status 128 + signum.

        Safe in a handler: it only hands a callback to the event loop (`call_soon_threadsafe`);
        the quit itself runs on the UI thread.
        """
        self.exit_code = 128 + int(signum)
        loop = self._ui_loop
        if loop is None:
            self._quit_pending = True  # on_mount quits
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the app has already exited
            loop.call_soon_threadsafe(self._quit_from_loop)

    def _quit_from_loop(self) -> None:
        if self.is_running:
            self.call_later(self.action_quit)

    def say(self, message: str, severity: str = "information", timeout: float | None = None) -> None:
        """notify() without markup (paths and JSON contain brackets)."""
        self.notify(message, severity=severity, timeout=timeout, markup=False)  # type: ignore[arg-type]

    def notify(self, message: str, *, title: str = "", severity="information", timeout: float | None = None,
               markup: bool = True) -> None:
        """Also keep every notification in `notices` (tests and the operator's history read it)."""
        self.notices.append((str(message), str(severity)))
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)

    def _on_notify(self, event: Notify) -> None:
        """Coalesce toasts (repeats replace, at most two shown); Textual's own handler then adds the new one."""
        for stale in toasts_replaced_by(event.notification, list(self._notifications)):
            self._unnotify(stale, refresh=False)

    # ------------------------------------------------------------------ policy edits (plan screen)

    def _edit(self, edit: policy_edits.Edit) -> bool:
        if self.phase != "plan":
            self.say("the policy is read-only while the model is loaded or loading (u unloads)", "warning")
            return False
        if edit.refused:
            self.say(edit.message, "warning")
            return False
        try:
            plan = self.engine.make_plan(edit.policy)
        except PolicyError as exc:
            self.say(str(exc), "error")
            return False
        self.policy, self.plan = edit.policy, plan
        self.refresh_plan_views()
        self.say(edit.message, timeout=2)
        return True

    def edit_toggle(self, name: str) -> bool:
        return self._edit(policy_edits.toggle_component(self.engine.model, self.policy, name))

    def edit_clear(self, name: str) -> bool:
        return self._edit(policy_edits.clear_component(self.engine.model, self.policy, name))

    def edit_default(self) -> bool:
        return self._edit(policy_edits.toggle_default(self.policy))

    def edit_layers(self, delta: int) -> bool:
        return self._edit(policy_edits.change_resident_layers(self.engine.model, self.policy, delta))

    def edit_mode(self) -> bool:
        edit, stash = policy_edits.switch_mode(self.policy, self._mode_stash)
        if self._edit(edit):
            self._mode_stash = stash
            return True
        return False

    # ------------------------------------------------------------------ plan views

    def link_info(self) -> LinkInfo:
        """The device side of the forecast: bandwidth (measured or observed) and free memory."""
        if not self.device_info.is_cuda:
            return LinkInfo(is_cuda=False)
        bw, bw_source = self.bandwidth, self.bandwidth_source
        if bw is None and self.observed.rate is not None:
            bw, bw_source = self.observed.rate, "mean of observed staging copies"
        free, free_source = None, ""
        snap = self.snapshot
        if snap is not None and snap.free_for_us is not None:
            free, free_source = snap.free_for_us, "free for us = NVML free + torch cached"
        elif snap is not None and snap.torch.free is not None:
            free, free_source = snap.torch.free, "cudaMemGetInfo free"
        elif self.device_info.free_bytes is not None:
            free, free_source = self.device_info.free_bytes, "cudaMemGetInfo free at startup"
        return LinkInfo(True, bw, bw_source, free, free_source)

    def header_text(self) -> str:
        m, d = self.engine.model, self.device_info
        device = d.describe()
        host = d.describe_host()
        snap = self.snapshot
        if d.is_cuda and snap is not None and snap.torch.free is not None:
            device = f"{d.device} {d.name} · {format_bytes(d.total_bytes)} ({format_bytes(snap.torch.free)} free)"
        if snap is not None and snap.host.available is not None and snap.host.total is not None:
            host = f"host RAM {format_bytes(snap.host.total)} ({format_bytes(snap.host.available)} available)"
        return (f"model {m.path} · {m.pipeline_class} · {format_bytes(m.nbytes)} of weights\n"
                f"device {device} · {host}")

    def refresh_plan_views(self) -> None:
        """Re-render the plan screen (table, policy JSON, forecast, header) for the current policy."""
        link = self.link_info()
        self._link_rows = (link, self.plan.policy)
        self.plan_screen.show_plan(self.plan, link, self.header_text())
        self.plan_screen.refresh_bindings()

    def _refresh_link(self) -> None:
        """After a telemetry sample: re-render forecast and header only when what they show changed."""
        link = self.link_info()
        key = (link, self.plan.policy)
        if key == self._link_rows:
            return
        self._link_rows = key
        self.plan_screen.show_link(self.plan, link)
        self.plan_screen.header.update(self.header_text())

    # ------------------------------------------------------------------ events

    def _tick(self) -> None:
        """The drain timer: apply events; redraws follow LIGHT_UI_S / HEAVY_UI_S."""
        self.drain_events(flush=False)

    def drain_events(self, flush: bool = True) -> int:
        """Apply queued bus events on the UI thread, each widget updated once per batch.

        Every event is applied (histories get every sample, the log every line); only the
        redraws are batched, so the UI thread stays light while the engine runs. Returns how
        many events were applied.
        """
        if self._closed or not self._running:
            return 0
        events = self.sub.drain(DRAIN_MAX_EVENTS)
        live = self.live_screen
        if live is not None:
            live.staging.set_dropped(self.sub.dropped)
        if not events and not flush and not self._pending():
            return 0  # the common idle tick: touch no widget
        batch = _Batch()
        with self.batch_update():
            for event in events:
                self._apply(event, batch)
            if self.phase == "loading" and (batch.load_lines or batch.progress):
                self.plan_screen.load_events(list(batch.progress.values()), batch.load_lines)
            if live is not None:
                self._pending_log.extend(batch.log)
                self._pending_steps.extend(batch.steps)
                if batch.steps:
                    self._pending_progress = batch.steps[-1]
                if batch.generation is not None:
                    self._pending_generation = batch.generation
            self._flush_light(force=flush)
            self._flush_heavy(force=flush)
        if batch.telemetry and self.phase in ("plan", "loading") and self.screen is self.plan_screen:
            self._refresh_link()
        return len(events)

    def _pending(self) -> bool:
        return bool(self._pending_log or self._pending_steps or self._pending_snapshots
                    or self._pending_progress is not None or self._pending_generation is not None)

    def _flush_light(self, force: bool) -> None:
        """Every LIGHT_UI_S: the request's progress bar and line (two cheap widgets)."""
        live = self.live_screen
        now = time.monotonic()
        if live is None or (not force and now - self._light_at < LIGHT_UI_S):
            return
        self._light_at = now
        if self._pending_progress is not None:
            last, self._pending_progress = self._pending_progress, None
            live.gen_progress.update(total=max(last.total_steps, 1), progress=last.step)
        if self._pending_generation is not None:
            text, self._pending_generation = self._pending_generation, None
            live.set_generation(text)

    def _flush_heavy(self, force: bool) -> None:
        """Staging log, memory panels (all pending samples), step table, residency — staggered.

        These are the widgets whose redraw costs the most (a log or table growing re-lays-out the
        screen; tables have hundreds of cells). Each group is redrawn at most every HEAVY_UI_S
        (HEAVY_UI_BUSY_S during a request), and at most one group per drain tick unless forced:
        a key press then never waits behind the whole batch, only behind one group, and the UI
        thread, which shares the GIL with the engine, stays mostly idle. Nothing is dropped.
        """
        live = self.live_screen
        if live is None:
            return
        now = time.monotonic()
        interval = HEAVY_UI_BUSY_S if self.generating else HEAVY_UI_S
        groups = (self._flush_log, self._flush_memory, self._flush_steps)
        for index in sorted(range(len(groups)), key=lambda i: self._heavy_at[i]):  # most overdue first
            if not force and now - self._heavy_at[index] < interval:
                continue
            if groups[index](live) and not force:
                self._heavy_at[index] = now
                return
            self._heavy_at[index] = now
        if force:
            self.refresh_residency()

    def _flush_log(self, live: LiveScreen) -> bool:
        """The staging log; residency follows it (weights move only with a staging event)."""
        if not self._pending_log:
            return False
        events, self._pending_log = self._pending_log, []
        live.staging.add_events(events)
        self.refresh_residency()
        return True

    def _flush_memory(self, live: LiveScreen) -> bool:
        if not (live.telemetry_ready and self._pending_snapshots):
            return False
        pending, self._pending_snapshots = self._pending_snapshots, []
        live.show_snapshots(pending)
        return True

    def _flush_steps(self, live: LiveScreen) -> bool:
        if not self._pending_steps:
            return False
        steps, self._pending_steps = self._pending_steps, []
        live.add_steps(steps)
        return True

    def _line(self, event: Event) -> str | None:
        if self._t0 is None:
            self._t0 = event.t
        return loading_line(event, self._t0)

    def _apply(self, event: Event, batch: _Batch) -> None:
        if isinstance(event, TelemetryEvent):
            snapshot = event.snapshot
            if isinstance(snapshot, TelemetrySnapshot):
                self.snapshot = snapshot
                self.telemetry_history.append(snapshot)
                live = self.live_screen
                if live is not None and live.telemetry_ready:
                    self._pending_snapshots.append(snapshot)
                batch.telemetry = True
            return
        if self.phase == "loading":
            if isinstance(event, LoadProgress):
                batch.progress[event.component] = event
            line = self._line(event)
            if line is not None:
                batch.load_lines.append(line)
        if isinstance(event, LOG_EVENTS):
            if isinstance(event, StagingEvent) and self.device_info.is_cuda:
                self.observed.observe(event)
            batch.log.append(event)
        elif isinstance(event, StepTiming):
            batch.steps.append(event)
            batch.generation = (f"request {event.request_id}: step {event.step}/{event.total_steps} · "
                                f"{format_seconds(event.wall_s)} (stall {format_seconds(event.stall_s)})")
        elif isinstance(event, RequestStarted):
            self.request_id = event.request_id
            batch.generation = f"request {event.request_id}: {event.prompt!r} · started"
        elif isinstance(event, RequestPhases) and self.live_screen is not None:
            self.live_screen.show_phases(event)  # once per request: applied at once, not batched
        elif isinstance(event, RequestFinished) and not event.ok:
            batch.generation = f"request {event.request_id} failed: {event.error}"
        elif isinstance(event, EngineStateChanged):
            self._live_status()

    def refresh_residency(self) -> None:
        """Residency rows from the placement (the drain calls it every HEAVY_UI_S)."""
        live = self.live_screen
        if live is None:
            return
        rows = residency_rows(self.engine)
        if rows is not None:
            live.residency.update_rows(rows)

    def _live_status(self) -> None:
        live = self.live_screen
        if live is None:
            return
        policy = self.engine.plan.policy if self.engine.plan else self.policy
        loaded = f" · loaded in {format_seconds(self.load_seconds)}" if self.load_seconds is not None else ""
        live.set_status(f"{self.device_info.describe()} · engine {self.engine.state.value} · mode={policy.mode} · "
                        f"resident layers {policy.resident_layers}{loaded}")

    # ------------------------------------------------------------------ commands

    def _track(self, kind: str, future: Future) -> Future:
        self.busy = self.last_command[kind] = future
        future.add_done_callback(lambda f: self._post_from_worker(CommandDone(kind, f)))
        return future

    def action_load(self) -> Future | None:
        """l: load with the current policy on the worker thread; progress arrives as events."""
        if self.phase != "plan":
            self.say("already loaded or busy; u unloads first" if self.phase == "live" else f"busy ({self.phase})",
                     "warning")
            return None
        try:
            self.plan = self.engine.make_plan(self.policy)
        except PolicyError as exc:
            self.say(str(exc), "error")
            return None
        self.phase = "loading"
        self.last_error = None
        self.load_seconds = None
        self.live_screen = LiveScreen()  # fresh panels per load; it collects events until shown
        self.live_screen.show_plan(self.plan)
        self.plan_screen.load_started()
        return self._track("load", self.worker.load(self.policy))

    def action_unload(self) -> Future | None:
        """u: unload (memory released) and return to the plan screen."""
        if self.phase != "live":
            self.say("nothing loaded", "warning")
            return None
        if self.generating:
            self.say("a request is running; esc cancels it first", "warning")
            return None
        self.phase = "unloading"
        gc.unfreeze()  # the model's objects must be collectable again when the engine releases them
        self.screen.refresh_bindings()
        return self._track("unload", self.worker.unload())

    def action_cancel(self) -> None:
        """esc: stop the load (between components/blocks) or the request (at the next step end)."""
        if self.phase == "loading" or self.generating:
            self.worker.cancel()
            self.say("cancelling…", "warning")
            if self.generating and self.live_screen is not None:
                self.live_screen.set_cancelling(True)  # lasts until the request ends
        elif self.phase == "live":
            self.say("no request is running", timeout=2)

    def action_generate(self) -> None:
        """g: the generate dialog, prefilled with the model's working defaults."""
        if self.phase != "live":
            self.say("load the model first (l)", "warning")
            return
        if self.generating:
            self.say("a request is running; esc cancels it", "warning")
            return
        make_request = partial(default_request, self.engine)
        form = RequestForm.for_model(self.engine.model, make_request(prompt=self.prompt), make_request)
        self.push_screen(GenerateDialog(form), self.start_generate)

    def start_generate(self, request: GenerateRequest | None) -> Future | None:
        """Run one request on the worker; the image is saved on the worker thread when it is done."""
        if request is None or self.phase != "live" or self.generating:
            return None
        self.prompt = request.prompt
        self.generating = True
        self.request_id = None
        if self.live_screen is not None:
            self.live_screen.set_generation(f"request: {request.prompt!r} · queued", 0, request.steps or 1)
            self.live_screen.show_request_frames(expected_frames(self.engine.model, request))
        future = self.worker.generate(request)
        self.busy = self.last_command["generate"] = future
        future.add_done_callback(self._save_then_report)
        return future

    def _save_then_report(self, future: Future) -> None:
        """Runs on the engine thread (or here if already done): save the image, then report.

        Every image or video goes to a new file (`outputs.save_result`: timestamped, created exclusively);
        a request cancelled before its last step is not saved unless `save_partial`.
        """
        output: Path | None = None
        save_error: str | None = None
        if not future.cancelled() and future.exception() is None:
            result = future.result()
            if request_outcome.should_save(result, self.save_partial):
                try:
                    output = save_result(result, self.out_dir, result.request_id)
                except Exception as exc:  # a full disk must not take the console down
                    output, save_error = None, f"{type(exc).__name__}: {exc}"
        self._post_from_worker(CommandDone("generate", future, output, save_error))

    def action_copy_command(self) -> None:
        """c: the vllm serve line for the current policy, to the terminal's clipboard (OSC 52).

        Nothing reports whether the terminal accepted it (tmux, ssh and many terminals drop OSC 52),
        so the notice says how it was sent and shows the whole line to select by hand.
        """
        command = vllm_serve_command(self.plan)
        self.copy_to_clipboard(command)
        self.say(f"{COPY_NOTICE}\n{command}", timeout=15)

    def action_cycle_theme(self) -> None:
        names = list(THEMES)
        current = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(current + 1) % len(names)]
        self.say(f"theme: {self.theme}", timeout=2)

    def help_sections(self) -> list[Section]:
        """Every binding of the app, both screens and the dialogs, from their BINDINGS."""
        def rows(bindings: Iterable) -> list[tuple[str, str]]:
            return binding_rows(bindings, self.get_key_display)

        palette = (self.COMMAND_PALETTE_BINDING, "command palette: load, unload, generate, cancel, copy, theme, help")
        return [
            ("anywhere", [*rows(self.BINDINGS), palette, *NAVIGATION_ROWS]),
            ("plan screen (before load)", [*PLAN_TABLE_ROWS, *rows(PlanScreen.BINDINGS)]),
            ("live screen (after load)", rows(LiveScreen.BINDINGS)),
            ("staging log filter (after /)", [*rows(FilterBar.BINDINGS), ("enter", "keep the filter, close the bar")]),
            ("generate dialog (after g)", [*rows(GenerateDialog.BINDINGS), ("enter", "run the request")]),
            ("this help", rows(HelpScreen.BINDINGS)),
        ]

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.help_sections()))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Textual's commands without its "Keys" panel: "Help" (?) lists every key, one place for it."""
        for command in super().get_system_commands(screen):
            if command.title != "Keys":
                yield command
        yield from console_commands(self)

    # ------------------------------------------------------------------ command results

    def on_command_done(self, message: CommandDone) -> None:
        self.drain_events()  # everything the command published, before its outcome
        handler = {"load": self._load_done, "unload": self._unload_done, "generate": self._generate_done,
                   "bandwidth": self._bandwidth_done}[message.kind]
        try:
            handler(message)
        finally:
            if message.future is self.busy:
                self.busy = None
            if message.kind != "generate":  # live-screen bindings do not depend on a request running
                self.screen.refresh_bindings()

    def _load_done(self, message: CommandDone) -> None:
        if self.phase != "loading":
            return  # quitting
        exc = message.future.exception()
        if exc is None:
            report = message.future.result()
            self.phase = "live"
            self.load_seconds = report.seconds
            gc.freeze()  # the loaded model and the UI: never rescanned by the collector (module docstring)
            self.plan_screen.load_ended(None)
            live = self.live_screen
            assert live is not None
            self._live_status()
            self.push_screen(live)
            self.refresh_residency()
            pinned = f" · pinned host {format_bytes(report.pinned_bytes)}" if report.pinned_bytes else ""
            self.say(f"loaded in {format_seconds(report.seconds)}{pinned} · g generates, u unloads")
            return
        cancelled = isinstance(exc, LoadCancelled)
        reason = self.engine.failure or f"{type(exc).__name__}: {exc}"
        self.phase = "plan"
        self.live_screen = None
        self.last_error = reason
        self.plan_screen.load_ended(reason, cancelled=cancelled)
        self.refresh_plan_views()
        self.say("load cancelled; memory released" if cancelled else f"load failed: {reason}",
                 "warning" if cancelled else "error", timeout=10)

    def _unload_done(self, message: CommandDone) -> None:
        if self.phase != "unloading":
            return
        exc = message.future.exception()
        if exc is not None:
            self.phase = "live"
            self.say(f"unload failed: {type(exc).__name__}: {exc}", "error")
            return
        self.phase = "plan"
        while self.screen is not self.plan_screen and len(self.screen_stack) > 1:
            self.pop_screen()
        self.live_screen = None
        self.refresh_plan_views()
        self.say("unloaded; memory released — edit the policy and press l to load again")

    def _generate_done(self, message: CommandDone) -> None:
        self.generating = False
        if self.live_screen is not None:
            self.live_screen.set_cancelling(False)
        future = message.future
        exc = None if future.cancelled() else future.exception()
        if future.cancelled() or exc is not None:
            self.last_error = "cancelled before it started" if exc is None else f"{type(exc).__name__}: {exc}"
            if self.live_screen is not None:
                self.live_screen.show_request_frames(None)  # no phases follow a failed request
            self._show_outcome(request_outcome.failed(self.request_id, self.last_error))
            return
        result = future.result()
        if message.output is not None:
            self.last_output = message.output
        done, total = request_outcome.steps_done(result)
        self._show_outcome(request_outcome.finished(result, message.output, message.save_error), done, total)

    def _show_outcome(self, outcome: request_outcome.Outcome, done: int | None = None,
                      total: int | None = None) -> None:
        """Toast, request line and (for failures, cancellations, save errors) a line in the event log."""
        live = self.live_screen
        if live is not None:
            if outcome.log is not None:
                live.staging.add_events([outcome.log])
            live.set_generation(outcome.status, done, None if total is None else max(total, 1))
        self.say(outcome.notice, outcome.severity, timeout=10)

    def _bandwidth_done(self, message: CommandDone) -> None:
        exc = message.future.exception()
        if exc is not None or message.future.result() is None:
            self.say(f"host→device bandwidth not measured: {exc}", "warning")
            return
        self.bandwidth = float(message.future.result())
        self.bandwidth_source = "measured: 256 MiB pinned copy"
        if self.phase == "plan":
            self.refresh_plan_views()
