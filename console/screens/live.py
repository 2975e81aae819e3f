"""The live screen (after load): memory, residency, staging events, step timings, generation, and
for a video request its frames, latent size and where its time went (two lines under the request line),
and the request queue while requests run or wait (`QueuePanel`: cancel, reorder, clear).

An engine that runs as a group of ranks (`engine.world > 1`) adds the GPU group panel (one line per
rank) and the `r` key that narrows the staging log to one rank; a single engine's screen has neither.

The screen owns its widgets: the app's `EventRouter` drives it through the `LiveView` methods
(`add_log`, `add_steps`, `show_snapshots`, ...) and the app sets `status_text`, `cancelling` and the
request line; nothing outside reaches into a widget. Widgets are built in `__init__` so events that
arrive while the model is still loading (before this screen is shown) are kept, not lost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, ScrollableContainer, Vertical, VerticalScroll
from textual.reactive import var
from textual.screen import Screen
from textual.widgets import Header, ProgressBar

from ...engine import events
from ...engine.api import Plan, TelemetrySnapshot, plain_lines
from ..event_text import forecast_check_text
from ..rank_stats import RankStats
from ..request_queue import QueueRow
from ..tier_traffic import TierTraffic, tier_lines
from ..widgets import AllocatorPanel, HostPanel, ResidencyPanel, StagingLog, StepTimings
from ..widgets.fitted_text import FittedText
from ..widgets.gpu_group_panel import GpuGroupPanel
from ..widgets.key_numbers import KeyNumbers
from ..widgets.lora_panel import LoraPanel
from ..widgets.plan_policy import PolicyPanel
from ..widgets.preview_panel import PreviewPanel
from ..widgets.queue_panel import QueuePanel
from ..widgets.request_phases import RequestPhasesLine
from ..widgets.residency_panel import ResidencyRow
from ..widgets.steady_footer import SteadyFooter

CANCELLING = "cancelling… (stops at the next block)"
"""The engine checks the cancel before every block of the DiT, encoders and VAE (`runner.watch_cancel`)."""
LOG_PAUSED = "staging log paused (p resumes)"
RANK_BINDING = Binding("r", "rank_filter", "rank", id="live.rank",
                       tooltip="staging events of every rank → rank 0 → rank 1 → … (multi-GPU group only)")
"""Bound on the screen of a multi-GPU group only (a single engine's footer and help stay as they were)."""
LORA_BINDINGS = [
    Binding("l", "lora_toggle", "LoRA", id="live.lora_toggle", tooltip="LoRA panel: the selected LoRA on / off "
            "(from the next request)"),
    Binding("full_stop", "lora_scale(1)", "LoRA +0.1", id="live.lora_up", show=False,
            tooltip="LoRA panel: the selected LoRA's scale +0.1 (from the next request)"),
    Binding("comma", "lora_scale(-1)", "LoRA -0.1", id="live.lora_down", show=False,
            tooltip="LoRA panel: the selected LoRA's scale -0.1 (from the next request)"),
    Binding("j", "lora_select(1)", "next LoRA", id="live.lora_next", show=False,
            tooltip="LoRA panel: select the next LoRA"),
    Binding("k", "lora_select(-1)", "previous LoRA", id="live.lora_prev", show=False,
            tooltip="LoRA panel: select the previous LoRA"),
]
"""Bound when the console was started with --lora only (otherwise the footer and help stay as they were)."""


RESIDENCY_TITLE = "residency now (what is on the device)"
RESIDENCY_TITLE_CPU = "residency now (CPU: every state is in host RAM)"
"""On a CPU the "device" and the host are the same RAM: the title must not say "on the device"."""


class LiveScreen(Screen[None]):
    """After load: watch memory and transfers, run requests; `u` unloads back to the plan."""

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]

    BINDINGS = [
        Binding("g", "app.generate", "generate", id="live.generate", tooltip="open the generate dialog"),
        Binding("escape", "app.cancel", "cancel", id="live.cancel",
                tooltip="cancel the running request (it stops at the next block)"),
        Binding("u", "app.unload", "unload", id="live.unload", tooltip="unload and return to the plan screen"),
        Binding("slash", "filter", "filter", id="live.filter", tooltip="filter the staging events (substring)"),
        Binding("p", "pause", "pause log", id="live.pause", tooltip="pause / resume the staging events log"),
        Binding("c", "app.copy_command", "copy", id="live.copy", tooltip="copy the vllm serve command"),
        Binding("s", "app.cycle_cache", "cache", id="live.cache",
                tooltip="step cache for the next request: off → each kind diffusers takes here → off"),
        Binding("plus,equals_sign", "app.edit('layers', 1)", "+layer", id="live.layers_up", show=False,
                tooltip="one more resident DiT/UNet block, applied live (re-plan between requests)"),
        Binding("minus", "app.edit('layers', -1)", "-layer", id="live.layers_down", show=False,
                tooltip="one resident DiT/UNet block less, applied live"),
        Binding("o", "app.edit('placement')", "placement", id="live.placement", show=False,
                tooltip="resident blocks leading ⇄ spread, applied live"),
        Binding("right_square_bracket", "app.edit('slots', 1)", "+slot", id="live.slots_up", show=False,
                tooltip="one more prefetch slot, applied live"),
        Binding("left_square_bracket", "app.edit('slots', -1)", "-slot", id="live.slots_down", show=False,
                tooltip="one prefetch slot less, applied live"),
        Binding("d", "app.edit('default')", "default", id="live.default", show=False,
                tooltip="flip the default encoder/VAE residency, applied live"),
        Binding("b", "app.budget", "budget", id="live.budget", show=False,
                tooltip="VRAM budget: the planner's policy, applied live"),
        Binding("i", "toggle_preview", "preview", id="live.preview", show=False,
                tooltip="step and output previews off / on"),
        Binding("v", "plots", "plots", id="live.plots", show=False,
                tooltip="plots of the request: device memory, the link's rate and each step's stall, phases marked"),
        Binding("e", "app.write_trace", "trace", id="live.trace", show=False,
                tooltip="write the request's Chrome/Perfetto trace (JSON) in the output folder"),
    ]

    DEFAULT_CSS = """
    LiveScreen #live-status { height: auto; padding: 0 1; }
    LiveScreen #gen-row { height: auto; max-height: 3; padding: 0 1; }
    LiveScreen #gen-label { width: 1fr; height: auto; }
    LiveScreen #gen-progress { width: auto; margin-left: 1; }
    LiveScreen #gen-progress Bar { width: 12; }
    LiveScreen #key-numbers { height: auto; padding: 0 1; text-style: bold; }
    LiveScreen #live-columns { height: 1fr; layout: horizontal; overflow: hidden hidden; }
    LiveScreen #live-left { width: 1fr; }
    LiveScreen #live-right { width: 1fr; }
    LiveScreen.-narrow #live-columns { layout: vertical; overflow-y: auto; }
    LiveScreen.-narrow #live-left, LiveScreen.-narrow #live-right { width: 100%; height: auto; }
    LiveScreen.-narrow StepTimings { height: 14; }
    LiveScreen.-narrow StagingLog { height: 14; }
    LiveScreen.-narrow AllocatorPanel { max-height: 24; }
    LiveScreen #live-right ResidencyPanel { max-height: 40%; }
    LiveScreen.-narrow GpuGroupPanel { max-height: 6; }
    LiveScreen.-wide PreviewPanel { height: 16; }
    LiveScreen.-wide ToastHolder { align-horizontal: left; }  /* over the policy, not the newest staging events */
    """

    status_text = var("")
    """The engine line (device, state, mode, load time); the app sets it."""
    cancelling = var(False)
    """esc on a running request: said in the status line until the request ends."""

    def __init__(self, *, on_cpu: bool = False, history: Iterable[TelemetrySnapshot] = (),
                 live_policy: bool = False, world: int = 1, previews: bool = True,
                 preview_protocol: str = "halfblock", loras: LoraPanel | None = None) -> None:
        """`on_cpu`: transfers are host copies (said so, with no GB/s). `history`: the telemetry samples
        so far (replayed into the sparklines when shown, so they span the load). `world`: the engine's GPUs
        (ranks). The residency rows arrive as the engine's ResidencySnapshot events (`show_residency`)."""
        super().__init__()
        self.history = history
        self.on_cpu = on_cpu
        self.live_policy = live_policy  # the engine was loaded with live re-plan: the policy keys apply
        self.allocator = AllocatorPanel(id="allocator")
        self.host = HostPanel(id="host")
        self.tiers = TierTraffic()  # the host panel's tier figures (planned, read, rates)
        self.residency = ResidencyPanel(id="residency")
        self.steps = StepTimings(id="steps", on_cpu=on_cpu)
        self.staging = StagingLog(id="staging", on_cpu=on_cpu)
        self.policy_panel = PolicyPanel(id="live-policy")
        self.gen_progress = ProgressBar(total=1, show_eta=False, id="gen-progress")
        self.gen_text = "no request yet — g opens the generate dialog"
        self.telemetry_ready = False
        self.status_line = FittedText(id="live-status")
        self.gen_label = FittedText(self.gen_text, id="gen-label")
        self.phases = RequestPhasesLine(id="request-phases")
        self.key_numbers = KeyNumbers(id="key-numbers")
        self.world = max(world, 1)
        self.gpu_group = GpuGroupPanel(id="gpu-group")
        self.queue = QueuePanel(id="queue")
        # hidden until a step preview or an output arrives
        self.preview = PreviewPanel(id="preview", enabled=previews, protocol=preview_protocol)
        self.lora_panel = loras  # --lora only: the LoRA set each next request carries

    def compose(self) -> ComposeResult:
        if self.world > 1:
            self.gpu_group.set_world(self.world)
            # an instance binding: the class's BINDINGS (the footer and help of every screen) stay as they were
            # (a new list: a copied BindingsMap shares its per-key lists with the class's)
            keys = self._bindings.key_to_bindings
            if RANK_BINDING not in keys.get(RANK_BINDING.key, []):
                keys[RANK_BINDING.key] = [*keys.get(RANK_BINDING.key, []), RANK_BINDING]
            self.staging.enable_rank_filter()
        if self.lora_panel is not None:
            keys = self._bindings.key_to_bindings  # instance bindings, as the rank key's
            for binding in LORA_BINDINGS:
                if binding not in keys.get(binding.key, []):
                    keys[binding.key] = [*keys.get(binding.key, []), binding]
        yield Header()
        yield self.status_line
        yield self.key_numbers
        with Horizontal(id="gen-row"):
            yield self.gen_label
            yield self.gen_progress
        yield self.phases
        yield self.queue
        if self.lora_panel is not None:
            yield self.lora_panel
        if self.world > 1:
            yield self.gpu_group
        with ScrollableContainer(id="live-columns") as columns:
            columns.can_focus = False  # narrow: PgUp/PgDn from a focused panel that cannot scroll scroll this
            with VerticalScroll(id="live-left") as left:
                left.can_focus = False  # tab goes to its panels; PgUp/PgDn on them scroll it
                yield self.allocator
                yield self.host
                yield self.policy_panel
            with Vertical(id="live-right"):
                yield self.residency
                yield self.preview
                yield self.steps
                yield self.staging
        yield SteadyFooter(compact=True, show_command_palette=False)  # ^p is in the help (?)

    def on_mount(self) -> None:
        self.residency.border_title = RESIDENCY_TITLE_CPU if self.on_cpu else RESIDENCY_TITLE
        self.staging.focus_log()
        self.call_after_refresh(self._replay_telemetry)


    def _replay_telemetry(self) -> None:
        """Fill the memory panels with the telemetry history (sparklines span the load too)."""
        self.show_snapshots(list(self.history))
        self.telemetry_ready = True

    def show_snapshots(self, snapshots: list[TelemetrySnapshot]) -> None:
        """New telemetry samples: the memory panels get them all, the headline the newest."""
        self.allocator.update_snapshots(snapshots)
        self.host.update_snapshots(snapshots)
        if snapshots:
            self.key_numbers.show_snapshot(snapshots[-1])

    # ---- what the app and its event router call -------------------------------------------

    def show_plan(self, plan: Plan) -> None:
        self.policy_panel.show_plan(plan, readonly=not self.live_policy, live=self.live_policy)
        self.tiers.show_plan(plan)
        self._show_tiers()

    def watch_status_text(self) -> None:
        self._show_status()

    def watch_cancelling(self) -> None:
        self._show_status()

    def _show_status(self) -> None:
        text = f"{CANCELLING} · {self.status_text}" if self.cancelling else self.status_text
        if self.staging.paused:  # said here too: at 80x24 the log itself is below the fold, and p showed nothing
            text = f"{text} · {LOG_PAUSED}"
        self.status_line.show(plain_lines(text))  # may hold an error or a path from data

    def set_generation(self, text: str, done: int | None = None, total: int | None = None) -> None:
        self.gen_text = text
        if total is not None:
            self.gen_progress.update(total=max(total, 1), progress=done or 0)
        self.gen_label.show(plain_lines(text))  # wraps at spaces; a path too long for the line loses its middle

    def show_request_frames(self, frames: int | None) -> None:
        """A request starts: its frame count for a video pipeline (None hides the phase lines)."""
        self.phases.show_pending(frames)

    def show_queue(self, rows: Sequence[QueueRow]) -> None:
        """The request queue (the running request, then the waiting ones); hidden when empty."""
        self.queue.show(rows)

    def show_phases(self, event: events.RequestPhases) -> None:
        """A request ended: frames, latent size, text encoding / denoise / VAE decode times."""
        self.phases.show_phases(event)

    def show_check(self, event: events.ForecastCheck) -> None:
        """A request ended: its forecast (made before it) against what it measured, in the step panel."""
        self.steps.show_check(forecast_check_text(event))

    def show_loras(self, event: events.LorasApplied) -> None:
        """The engine applied a LoRA set: the panel's title names the mode it runs in (`auto` resolved)."""
        if self.lora_panel is not None:
            self.lora_panel.show_chosen(event.chosen)

    def add_steps(self, steps: list[events.StepTiming]) -> None:
        self.steps.add_steps(steps)
        last = steps[-1]
        self.key_numbers.show_step(last)
        self.show_step_progress(last)

    def show_step_progress(self, step: events.StepTiming) -> None:
        self.gen_progress.update(total=max(step.total_steps, 1), progress=step.step)

    def add_log(self, batch: list[events.Event]) -> None:
        self.staging.add_events(batch)
        if self.tiers.add(batch):
            self._show_tiers()

    def _show_tiers(self) -> None:
        self.host.show_tiers(tier_lines(self.tiers) if self.tiers.uses_files else [])

    def show_dropped(self, dropped: int) -> None:
        self.staging.set_dropped(dropped)

    def show_ranks(self, ranks: Mapping[int, RankStats]) -> None:
        """A multi-GPU group's ranks: each one's newest sample and steps (one line per rank)."""
        self.gpu_group.show_ranks(ranks)

    def show_residency(self, rows: Iterable[ResidencyRow | tuple]) -> None:
        """The engine's latest residency rows (read on its thread; the UI never touches engine objects)."""
        self.residency.update_rows(rows)

    def show_step_preview(self, event: events.StepPreview) -> None:
        """The newest step's latent (the router drops older ones), or the request's "no preview" note."""
        self.preview.show_step(event)

    def show_output_preview(self, path: Path) -> None:
        """A request's output was written: the panel reads it on a thread and shows it."""
        self.preview.show_output(path)

    # ---- keys ------------------------------------------------------------------------------

    def action_filter(self) -> None:
        self.staging.open_filter()

    def action_plots(self) -> None:
        from .plots import PlotScreen  # the plotting library loads when the plots are first opened

        self.app.push_screen(PlotScreen(self.app.router.record))  # type: ignore[attr-defined]

    def action_rank_filter(self) -> None:
        if self.world > 1:
            self.staging.cycle_rank(self.world)  # the log's title and filter bar say which rank

    def action_lora_toggle(self) -> None:
        self._lora_changed(self.lora_panel.loras.toggle() if self.lora_panel else None)

    def action_lora_scale(self, sign: int) -> None:
        from ..lora_set import SCALE_STEP

        self._lora_changed(self.lora_panel.loras.rescale(sign * SCALE_STEP) if self.lora_panel else None)

    def action_lora_select(self, delta: int) -> None:
        if self.lora_panel is not None:
            self.lora_panel.loras.move(delta)
            self.lora_panel.refresh_rows()

    def _lora_changed(self, entry) -> None:
        if entry is None or self.lora_panel is None:
            return
        self.lora_panel.refresh_rows()
        state = f"×{entry.scale:g}" if entry.on else "off"
        self.notify(f"LoRA {entry.name} {state}: from the next request (a queued one keeps its set)", timeout=3)

    def action_toggle_preview(self) -> None:
        on = self.preview.toggle()
        self.notify("previews on" if on else "previews off")

    def action_pause(self) -> None:
        paused = self.staging.toggle_pause()
        self._show_status()
        self.notify(LOG_PAUSED if paused else "staging log live")
