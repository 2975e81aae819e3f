"""The omni-console Textual app: plan → load → live, around one in-process engine.

Threads: the engine runs on `EngineWorker`'s thread and telemetry on the sampler's; both only
publish onto the engine's event bus. The app drains its bus subscription on a Textual timer and
hands the events to its `EventRouter` (no Textual there), which keeps the state the screens show
and decides which redraws are due; no sample or staging event is coalesced away (drops are
counted and shown). Commands go down as worker futures whose completion comes back as a
`CommandDone` message. Screens own their widgets; the app calls screen methods and sets their
reactive attributes, and screen keys reach the app as `app.`-namespaced actions or messages. The
state (phase, command in flight, request running, policy, the engine's plan and state as its events
said them) is the `ConsoleSession`'s (session.py, no Textual); the app and its command groups are glue.

A full gen-2 garbage collection over a loaded pipeline plus the UI takes 0.1–0.3 s and holds the
GIL, stalling the engine mid-step; after a load the app therefore `gc.freeze()`s what exists (the
model, the UI) and `gc.unfreeze()`s before unload so the released model can be collected.

Mount (the drain timer, telemetry, the held first frames) and quit, which never waits for the engine, are
`AppLifecycle`'s (app_lifecycle.py).

Everything the app depends on can be injected (engine, worker, telemetry sources or sampler,
bandwidth, output directory) so pilot tests run deterministically on CPU without sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from textual import events
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.message import Message
from textual.notifications import Notify
from textual.screen import Screen
from textual.timer import Timer

from ..engine.api import EngineHandle, OffloadPolicy, TelemetrySnapshot, plain_lines, planner, probes, service
from ..engine.errors import ConfigError
from ..offload.units import format_seconds
from ..themes import CSS_PATH, DEFAULT_THEME, THEMES
from .app_lifecycle import AppLifecycle
from .cache_commands import CacheCommands, cache_status
from .command_done import CommandDone
from .commands import console_commands
from .event_router import EventRouter
from .focus_title import show_focus
from .key_help import help_sections
from .load_commands import LoadCommands
from .lora_set import LoraSet
from .plan_commands import PlanCommands
from .policy_edits import PolicyEditor
from .queue_commands import QueueCommands
from .request_commands import RequestCommands
from .request_queue import QueueRows
from .request_report import RequestReporter
from .screens import CopyCommandScreen, HelpScreen, LiveScreen, NoticeLogScreen, PlanScreen
from .session import ConsoleSession
from .shutdown import EngineRelease
from .toasts import NARROW_WIDTH, drop_toast, max_visible_for, toast_text, toasts_replaced_by
from .trace_commands import TraceCommands
from .widgets import HISTORY_SAMPLES

DEFAULT_PROMPT = "a lighthouse on a cliff at dusk"
DRAIN_MAX_EVENTS = 5000
DEFAULT_OUT_DIR = Path("omni-console-out")

COPY_NOTICE = ("sent to the terminal's clipboard (OSC 52: the terminal may or may not accept it; "
               "tmux and ssh often drop it) — to select by hand:")


def _from_session(name: str) -> Any:
    """An attribute of the app that is its session's (read and set through to it)."""
    return property(lambda self: getattr(self.session, name), lambda self, value: setattr(self.session, name, value),
                    doc=f"`ConsoleSession.{name}`")


def theme_or_error(name: str | None) -> str:
    """The theme to start with; an unknown name is a ConfigError listing the valid ones (app_main says the same
    before torch is imported)."""
    if name is None:
        return DEFAULT_THEME
    if name not in THEMES:
        raise ConfigError(f"unknown theme {name!r}; valid themes: {', '.join(sorted(THEMES))}")
    return name


class OmniConsoleApp(AppLifecycle, PlanCommands, LoadCommands, RequestCommands, QueueCommands, TraceCommands,
                     CacheCommands, App[int]):
    """The operator console. `run()` returns 0 after a clean quit."""

    CSS_PATH = CSS_PATH
    TITLE = "omni-console"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (NARROW_WIDTH, "-wide")]
    DEFAULT_CSS = """
    /* a narrow terminal: one one-line toast over the title bar, not four lines over the forecast (toasts.py) */
    Screen.-narrow ToastRack { dock: top; align: left top; margin-bottom: 0; overflow-y: hidden; }
    Screen.-narrow ToastHolder { align-horizontal: left; }
    Screen.-narrow Toast { width: 100%; max-width: 100%; height: 1; margin-top: 0; padding: 0 1;
                           text-wrap: nowrap; text-overflow: ellipsis; }
    """
    BINDINGS = [
        # priority: checked when the key arrives, not after it has bubbled up from the focused panel one
        # event-loop turn per widget (seconds while a CPU request starves the UI); a focused text field still
        # gets the letter (Textual skips priority bindings for keys an Input consumes)
        Binding("q", "quit", "quit", id="app.quit", priority=True,
                tooltip="quit: cancel, release memory, stop threads"),
        Binding("ctrl+q", "quit", "quit", show=False, priority=True, id="app.quit_ctrl",
                tooltip="quit (also from text fields)"),
        Binding("t", "cycle_theme", "theme", id="app.theme", show=False, tooltip="next theme"),
        Binding("question_mark,f1", "help", "help", id="app.help", tooltip="this list of keys"),
        Binding("n", "notices", "notices", id="app.notices", show=False,
                tooltip="every notice of the session, with its time"),
    ]

    def __init__(
        self,
        engine: EngineHandle,
        policy: OffloadPolicy,
        *,
        sampler: probes.TelemetrySampler | None = None,
        sources: Sequence[probes.Source] | None = None,
        telemetry_hz: float = probes.DEFAULT_HZ,
        start_telemetry: bool | None = None,
        theme: str | None = None,
        bandwidth: float | None = None,
        out_dir: Path | str | None = None,
        worker: service.EngineWorker | None = None,
        prompt: str = DEFAULT_PROMPT,
        save_partial: bool = False,
        ram_budget: int | None = None,
        preview: str = "halfblock",
    ) -> None:
        """Validate everything that can be wrong (theme, policy) before the app ever runs.

        Telemetry: `sampler` is used as given; else one is built from `sources` (default: the
        device's torch/NVML/host sources). The sampling thread starts when `start_telemetry`
        is True, or by default only for the real sources — injected ones are driven by the
        test (`app.sampler.sample_now(publish=True)` then `app.drain_events()`).
        `save_partial`: also save the image of a request that returned before its last step (by default
        a half-denoised image is not saved: it is not a result). esc never returns one: it stops the
        request between two blocks and keeps nothing. `ram_budget`: `--ram-budget`'s bytes (the plan screen
        shows the host tiers it chooses for each policy). `preview`: `--preview`'s mode resolved for this
        terminal (console/preview_mode.py): off, halfblock, sixel or tgp.
        """
        self.preview_mode = preview
        self.initial_theme = theme_or_error(theme)
        editor = PolicyEditor(engine.model, policy)  # PolicyError before anything runs
        super().__init__()
        self.engine = engine  # handed to worker commands; the UI thread reads only the values below and events
        self.model, self.engine_device = engine.model, str(engine.device)
        self.session = ConsoleSession(editor, live_replan=engine.live_replan, engine_state=engine.state.value,
                                      prompt=prompt, bandwidth=bandwidth)
        self.worker = worker or service.EngineWorker(engine)
        self.plan_forecasts = self.engine_answers("plan")  # the plan screen's request forecast
        self.dialog_forecasts = self.engine_answers("dialog")  # the generate dialog's (a new one per dialog)
        self.ram_budget = ram_budget  # --ram-budget: the plan screen shows its tiers for the plan on screen
        self.ram_plans = self.engine_answers("ram")
        self.sub = engine.bus.subscribe()
        if sampler is None:
            real = sources is None
            srcs = list(probes.default_sources(engine.device)) if real else list(sources or [])
            sampler = probes.TelemetrySampler(*srcs, bus=engine.bus, hz=telemetry_hz)
            self.start_telemetry = real if start_telemetry is None else start_telemetry
        else:
            self.start_telemetry = bool(start_telemetry)
        self.sampler = sampler
        self.release = EngineRelease(self.worker, sampler, self.sub)
        # requests go through the engine's request service (the queue `run` uses too), on this worker; the
        # console writes each one through it on the engine thread (`_write_then_finish`) and keeps its report
        # in the cache's history (a history file that cannot be used: one note, through the event stream)
        self.reporter = RequestReporter(engine, lambda: sampler.sample_now())
        self.service = service.RequestService(engine, worker=self.worker, history=service.History(),
                                              write_in_caller=True)
        self.queue_rows = QueueRows()
        self.submitted = 0  # requests submitted: the next output name's number
        self.cancelled_request: int | None = None  # the request esc (or the queue panel) stopped: said until it ends
        self.device_info = probes.read_device_info(engine.device)  # the probe imports torch: once an app is built
        self.router = EventRouter(on_cpu=not self.device_info.is_cuda, history=HISTORY_SAMPLES)
        self.out_dir = Path(out_dir) if out_dir is not None else DEFAULT_OUT_DIR
        self.save_partial = save_partial
        self.lora_set = LoraSet(())  # --lora: the live screen's LoRA panel edits it; each request takes a copy
        self.lora_chosen_mode: str | None = None  # --lora-mode auto: the mode the plan chose
        self.plan_screen = PlanScreen()
        self.live_screen: LiveScreen | None = None
        self.notices: list[tuple[str, str]] = []
        """(message, severity) of every notice, plain (controls escaped); `n` lists them with `notice_times`."""
        self.notice_times: list[float] = []
        self._drain_timer: Timer | None = None
        self._link_shown: object = None
        self._closed = False
        self._ui_loop: asyncio.AbstractEventLoop | None = None
        self._quit_pending = False

    # the session's state, as the app's: tests and benchmarks read (and a snapshot test clears) them here
    policy = _from_session("policy")
    plan = _from_session("plan")
    phase = _from_session("phase")
    generating = _from_session("generating")
    last_command = _from_session("last_command")
    last_output = _from_session("last_output")
    last_error = _from_session("last_error")
    load_seconds = _from_session("load_seconds")

    @property
    def world(self) -> int:
        """GPUs (ranks) serving the model: a constant of the engine handle (read when a load builds its panels)."""
        return self.engine.world

    @property
    def snapshot(self) -> TelemetrySnapshot | None:
        """The newest telemetry sample."""
        return self.router.snapshot

    # ------------------------------------------------------------------ messages, notices, focus

    def _post_from_worker(self, message: Message) -> None:
        """post_message from the engine thread; a command that ends after the app has gone is dropped."""
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody is left to tell
            self.post_message(message)

    def say(self, message: str, severity: str = "information", timeout: float | None = None) -> None:
        """notify() without markup (paths and JSON contain brackets)."""
        self.notify(message, severity=severity, timeout=timeout, markup=False)  # type: ignore[arg-type]

    def notify(self, message: str, *, title: str = "", severity="information", timeout: float | None = None,
               markup: bool = True) -> None:
        """Also keep every notification in `notices` (tests and the operator's history read it)."""
        message = plain_lines(message)  # paths and errors from data: controls shown escaped
        self._keep_notice(message, str(severity))
        super().notify(toast_text(str(message), self.size.width), title=title, severity=severity, timeout=timeout,
                       markup=markup)

    def _keep_notice(self, message: str, severity: str) -> None:
        self.notices.append((plain_lines(message), severity))
        self.notice_times.append(time.time())

    def _on_notify(self, event: Notify) -> None:
        """Coalesce toasts (repeats replace, at most two shown, one on a narrow terminal); Textual's own handler
        then adds the new one."""
        for stale in toasts_replaced_by(event.notification, list(self._notifications),
                                        max_visible=max_visible_for(self.size.width)):
            self._unnotify(stale, refresh=False)
            drop_toast(self.screen, stale)  # its empty holder would push the next toast down a line

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        show_focus(event.widget, True)

    def on_descendant_blur(self, event: events.DescendantBlur) -> None:
        show_focus(event.widget, False)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Which of the app's actions the screens' keys may run now (None: shown greyed; the session decides)."""
        return self.session.allows(action, on_plan_screen=self.screen is self.plan_screen)

    # ------------------------------------------------------------------ events

    def _tick(self) -> None:
        """The drain timer: apply events; the router paces the redraws."""
        self.drain_events(flush=False)

    def drain_events(self, flush: bool = True) -> int:
        """Apply queued bus events on the UI thread; `flush` redraws everything now (else what is due).

        Returns how many events were applied.
        """
        if self._closed or not self._running:
            return 0
        events = self.sub.drain(DRAIN_MAX_EVENTS)
        router = self.router
        if not events and not flush and not router.has_pending():
            if self.live_screen is not None:
                self.live_screen.show_dropped(self.sub.dropped)
            return 0  # the common idle tick: touch no other widget
        loading = self.session.phase == "loading"
        self.reporter.fold()  # the reports' event totals, bounded however long the console idles
        with self.batch_update():
            self.follow_requests(events)  # before the router: a request that starts resets its number
            routed = router.route(events, loading=loading, dropped=self.sub.dropped)
            self.session.follow(routed.engine)  # the engine's plan and state, before anything shows them
            if loading and (routed.load_lines or routed.load_progress):
                self.plan_screen.load_events(list(routed.load_progress.values()), routed.load_lines)
            if routed.state_changed:
                self._live_status()
            router.flush(busy=self.session.generating, force=flush)
        if routed.telemetry and self.session.phase in ("plan", "loading") and self.screen is self.plan_screen:
            self._refresh_link()
        return routed.count

    def _live_status(self) -> None:
        live = self.live_screen
        if live is None:
            return
        session = self.session
        policy = session.running_policy  # the engine's, from its PlanReady
        seconds = session.load_seconds
        loaded = f" · loaded in {format_seconds(seconds)}" if seconds is not None else ""
        live.status_text = (f"{self.device_info.describe()} · engine {session.engine_state} · mode={policy.mode} · "
                            f"resident layers {policy.resident_layers}{loaded}{cache_status(session.cache)}")

    # ------------------------------------------------------------------ commands

    def _track(self, kind: str, future: Future) -> Future:
        self.session.track(kind, future)
        future.add_done_callback(lambda f: self._post_from_worker(CommandDone(kind, f)))
        return future

    def action_cancel(self) -> None:
        """esc: stop the load (between components/blocks) or the request (at its next block)."""
        session = self.session
        if session.may_cancel():
            self.worker.cancel()
            self.say("cancelling…", "warning")
            if session.generating and self.live_screen is not None:
                running = self.service.running
                self.cancelled_request = running.number if running is not None else None
                self.live_screen.cancelling = True  # lasts until the request ends
        elif session.phase == "live":
            self.say("no request is running", timeout=2)

    def action_copy_command(self) -> None:
        """c: the vllm serve line for the current policy, to the terminal's clipboard (OSC 52).

        Nothing reports whether the terminal accepted it (tmux, ssh and many terminals drop OSC 52),
        so the notice says how it was sent and shows the whole line to select by hand.
        """
        command = planner.vllm_serve_command(self.plan)
        self.copy_to_clipboard(command)
        self._keep_notice(f"{COPY_NOTICE}\n{command}", "information")
        if not isinstance(self.screen, CopyCommandScreen):  # whole words only: a toast would fold a path
            self.push_screen(CopyCommandScreen(command, COPY_NOTICE))

    def action_cycle_theme(self) -> None:
        names = list(THEMES)
        current = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(current + 1) % len(names)]
        self.say(f"theme: {self.theme}", timeout=2)

    def action_notices(self) -> None:
        """n: every notice of the session with its time (a toast is gone in seconds)."""
        if not isinstance(self.screen, NoticeLogScreen):
            self.push_screen(NoticeLogScreen(self.notices, self.notice_times))

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(help_sections(self.BINDINGS, self.COMMAND_PALETTE_BINDING,
                                                      self.get_key_display, self.world,
                                                      lora_keys=bool(self.lora_set))))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Textual's commands without its "Keys" panel: "Help" (?) lists every key, one place for it."""
        for command in super().get_system_commands(screen):
            if command.title != "Keys":
                yield command
        yield from console_commands(self)

    # ------------------------------------------------------------------ command results

    def on_command_done(self, message: CommandDone) -> None:
        while self.drain_events() >= DRAIN_MAX_EVENTS:  # everything the command published, before its outcome
            pass
        handler = {"load": self._load_done, "unload": self._unload_done, "generate": self._generate_done,
                   "bandwidth": self._bandwidth_done, "budget": self._budget_done,
                   "replan": self._replan_done}[message.kind]
        try:
            handler(message)
        finally:
            self.session.command_done(message.future)
            if message.kind != "generate":  # live-screen bindings do not depend on a request running
                self.screen.refresh_bindings()
