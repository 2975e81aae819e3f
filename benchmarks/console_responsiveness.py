"""How responsive the console stays while the engine generates, and what the console costs the engine.

1. Headless baseline: the same request through `Engine` directly (no app), step wall times; run
   before and after the app (the mean of the two medians is the baseline, against drift).
2. App, idle operator: the console app (headless Textual, real telemetry sources at --hz) loads the
   model and runs the same request; step wall times → overhead ratio app / headless (target ≤ 1.01).
3. App, busy operator: while requests with many steps run (and --queued N more wait in the queue), press
   a key (`p`, pause/resume the staging log) --presses times and measure key → state changed (the binding
   ran) and key → the first frame that shows the change (the status line says paused, or no longer;
   checked on the composed screen as each frame goes out), p50/p95/max in ms. Notifications are on, as on a terminal.
4. --replan N: live re-plans 0 → N → 0 → N → 0 resident layers (the engine is loaded for live re-plan),
   with the same key presses while each re-plan runs on the engine thread; each re-plan's seconds and
   bytes (its `Replanned` event) and the key latencies during re-plans.

The key goes through the driver's message path, like a real keypress. Frames are timed by wrapping
`App._display` (Textual private API; headless apps still compose every frame before it). Step 1 of
each request is excluded from step statistics (warm-up). Prints the figures and writes JSON to --out.

Usage: python -m benchmarks.console_responsiveness [--model PATH] [--device cpu|cuda] [--steps N]
       [--key-steps N] [--presses N] [--hz 10] [--out console.json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import textual  # noqa: E402
import torch  # noqa: E402
from textual import events  # noqa: E402

from omni_console.console.app import OmniConsoleApp  # noqa: E402
from omni_console.console.args import resolve_model_path  # noqa: E402
from omni_console.console.headless import default_request  # noqa: E402
from omni_console.console.screens.live import LOG_PAUSED  # noqa: E402
from omni_console.engine.engine import Engine, GenerateResult  # noqa: E402
from omni_console.engine.options import EngineOptions
from omni_console.engine.running.runner import GenerateRequest  # noqa: E402
from omni_console.offload.policy import OffloadPolicy, build_policy, parse_components_json  # noqa: E402

from . import harness

TIMEOUT_S = 10.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50": None, "p95": None, "max": None, "mean": None}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]
    return {"n": len(values), "p50": statistics.median(ordered), "p95": p95, "max": ordered[-1],
            "mean": statistics.fmean(ordered)}


def step_stats(results: list[GenerateResult]) -> dict[str, Any]:
    """Step wall times of every request, step 1 (warm-up) excluded, in seconds."""
    walls = [s.wall_s for r in results for s in r.steps if s.step > 1]
    stalls = [s.stall_s for r in results for s in r.steps if s.step > 1]
    return {"steps": len(walls), "median_s": statistics.median(walls) if walls else None,
            "mean_s": statistics.fmean(walls) if walls else None,
            "min_s": min(walls) if walls else None, "stall_mean_s": statistics.fmean(stalls) if stalls else None}


def make_request(engine: Engine, args: argparse.Namespace, steps: int) -> GenerateRequest:
    return default_request(engine, prompt="a lighthouse on a cliff at dusk", steps=steps, height=args.height,
                           width=args.width, seed=0)


def headless_baseline(model: Path, device: str, policy: OffloadPolicy, args: argparse.Namespace) -> dict[str, Any]:
    engine = Engine(model, device=device, variant=args.variant,
                    options=EngineOptions(live_replan=args.replan is not None))
    try:
        engine.load(policy)
        request = make_request(engine, args, args.steps)
        engine.generate(request)  # warm-up request (allocator, kernels, page cache)
        results = [engine.generate(request) for _ in range(args.repeats)]
    finally:
        engine.close()
    return step_stats(results)


class FrameClock:
    """Counts composed frames by wrapping App._display (called for every screen update).

    `watch`, when set, is checked right after each frame is handed to the driver (the compositor then
    holds what the terminal shows); the first frame for which it holds is timed in `seen` and disarms it.
    """

    def __init__(self, app: OmniConsoleApp) -> None:
        self.frames = 0
        self.last = 0.0
        self.watch: Callable[[], bool] | None = None
        self.seen: float | None = None
        original = app._display

        def display(screen, renderable) -> None:
            original(screen, renderable)
            if renderable is not None:
                self.frames += 1
                self.last = time.perf_counter()
                if self.watch is not None and self.watch():
                    self.seen, self.watch = self.last, None

        app._display = display  # type: ignore[method-assign]


def screen_lines(app: OmniConsoleApp) -> list[str]:
    """What the terminal shows, line by line (the compositor's current frame)."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def status_says_paused(app: OmniConsoleApp) -> bool:
    """The live screen's status line (on screen at every size) says the staging log is paused. The line wraps at
    spaces (a GPU's name makes it longer than 80 columns), so its rows are read as one run of words: joined
    without spaces, "staging log / paused" was never found and every other press at 80x24 timed out (H100)."""
    region = app.live_screen.status_line.region  # type: ignore[union-attr]
    words = " ".join(" ".join(screen_lines(app)[region.y:region.bottom]).split())
    return LOG_PAUSED in words


async def wait_for(condition, timeout: float = TIMEOUT_S) -> bool:
    deadline = time.perf_counter() + timeout
    while not condition():
        if time.perf_counter() > deadline:
            return False
        await asyncio.sleep(0.0002)
    return True


async def quit_app(pilot: Any, app: OmniConsoleApp) -> None:
    """q, and wait for the app's exit: q exits at once, so the pilot's own wait after the key (for
    widgets that are gone by then) runs as a task and is dropped."""
    press = asyncio.create_task(pilot.press("q"))
    await wait_for(lambda: app.return_value is not None, 60)
    press.cancel()


async def press_and_time(app: OmniConsoleApp, clock: FrameClock, key: str) -> tuple[float, float] | None:
    """Send one key like a terminal would; (ms until the binding ran, ms until a frame shows its change).

    The change is what an operator reads: the status line saying the log is paused (or no longer). Any
    frame would not do: at 80x24 the log is below the fold, and the next frame after the key was often a
    periodic redraw that did not carry it. Apps run with notifications on, as on a terminal (Textual's
    `run_test` turns them off by default).
    """
    live = app.live_screen
    assert live is not None
    before = live.staging.paused
    event = events.Key(key, key)
    event.set_sender(app)
    clock.seen = None
    clock.watch = lambda: live.staging.paused != before and status_says_paused(app) != before
    t0 = time.perf_counter()
    app._driver.send_message(event)  # type: ignore[union-attr]
    if not await wait_for(lambda: live.staging.paused != before):
        clock.watch = None
        return None
    t_state = time.perf_counter()
    if not await wait_for(lambda: clock.seen is not None):
        clock.watch = None
        return None
    assert clock.seen is not None
    return (t_state - t0) * 1e3, (clock.seen - t0) * 1e3


async def replans_under_keys(app: OmniConsoleApp, clock: FrameClock, engine: Engine,
                             args: argparse.Namespace) -> dict[str, Any]:
    """Re-plan 0 -> N -> 0 -> N -> 0 resident layers through the app; time keys while each runs."""
    from omni_console.engine.events import Replanned

    sub = engine.bus.subscribe()
    rows: list[dict[str, Any]] = []
    state_ms: list[float] = []
    frame_ms: list[float] = []
    for layers in (args.replan, 0, args.replan, 0):
        target = app.policy.with_resident_layers(layers)
        app.action_edit("policy", target)
        while engine.plan is None or engine.plan.policy != target:
            timed = await press_and_time(app, clock, args.key)
            if timed is not None:
                state_ms.append(timed[0])
                frame_ms.append(timed[1])
            await asyncio.sleep(args.gap_ms / 1e3)
        await asyncio.sleep(0.05)
        event = next((e for e in reversed(sub.drain()) if isinstance(e, Replanned)), None)
        if event is not None:
            rows.append({"to": layers, "seconds": event.seconds, "copied": event.copied_bytes,
                         "freed": event.freed_bytes, "ring": event.ring_bytes, "summary": event.summary})
            log(event.summary)
    return {"replans": rows, "key_to_state_ms": percentiles(state_ms), "key_to_frame_ms": percentiles(frame_ms)}


async def run_app(model: Path, device: str, policy: OffloadPolicy, args: argparse.Namespace) -> dict[str, Any]:
    engine = Engine(model, device=device, variant=args.variant,
                    options=EngineOptions(live_replan=args.replan is not None))
    app = OmniConsoleApp(engine, policy, telemetry_hz=args.hz, out_dir=Path(args.out_dir))
    out: dict[str, Any] = {}
    try:
        async with app.run_test(size=(args.cols, args.rows), notifications=True) as pilot:
            clock = FrameClock(app)
            await pilot.pause()
            future = app.action_load()
            assert future is not None
            await asyncio.wrap_future(future)
            if not await wait_for(lambda: app.screen is app.live_screen, 60):
                raise RuntimeError(f"load did not reach the live screen: {app.last_error}")
            log(f"app: loaded in {app.load_seconds:.2f} s; telemetry {app.sampler.hz:g} Hz")

            async def generate(steps: int) -> GenerateResult:
                while app.generating or app.phase != "live":  # the previous request's outcome first
                    await asyncio.sleep(0.001)
                fut = app.start_generate(make_request(engine, args, steps))
                assert fut is not None
                return await asyncio.wrap_future(fut)

            await generate(args.steps)  # warm-up
            idle = [await generate(args.steps) for _ in range(args.repeats)]
            out["app_idle"] = step_stats(idle)
            log(f"app idle: median step {out['app_idle']['median_s'] * 1e3:.2f} ms")

            state_ms: list[float] = []
            frame_ms: list[float] = []
            failures = 0
            busy: list[GenerateResult] = []
            frames_start, t_start = clock.frames, time.perf_counter()
            while len(state_ms) + failures < args.presses:
                running = app.start_generate(make_request(engine, args, args.key_steps))
                assert running is not None
                # --queued N: N more requests wait in the engine's queue (the queue panel shows them)
                waiting = [app.start_generate(make_request(engine, args, args.steps)) for _ in range(args.queued)]
                await wait_for(lambda f=running: f.done() or app.engine.state.value == "running", 30)
                while not running.done() and len(state_ms) + failures < args.presses:
                    timed = await press_and_time(app, clock, args.key)
                    if timed is None:
                        failures += 1
                    else:
                        state_ms.append(timed[0])
                        frame_ms.append(timed[1])
                    await asyncio.sleep(args.gap_ms / 1e3)
                busy.append(await asyncio.wrap_future(running))
                for queued in waiting:
                    assert queued is not None
                    await asyncio.wrap_future(queued)
                while app.generating:
                    await asyncio.sleep(0.001)
            elapsed = time.perf_counter() - t_start
            out["app_busy"] = step_stats(busy)
            out["latency_ms"] = {"key_to_state": percentiles(state_ms), "key_to_frame": percentiles(frame_ms),
                                 "timeouts": failures, "key": args.key, "gap_ms": args.gap_ms}
            out["frames_per_s_while_generating"] = (clock.frames - frames_start) / elapsed if elapsed > 0 else None
            if args.replan is not None:
                out["replan"] = await replans_under_keys(app, clock, engine, args)
            out["events_dropped"] = app.sub.dropped
            out["telemetry_samples"] = app.sampler.samples
            out["telemetry_overruns"] = app.sampler.overruns
            await quit_app(pilot, app)
    finally:
        app.shutdown()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__.split("\n")[0], out=None, device=harness.AUTO)
    parser.add_argument("--model", type=Path, default=None, help="diffusers model dir (default: the demo model)")
    parser.add_argument("--variant", default=None)
    parser.add_argument("--dlo-offload-components", default=None, metavar="JSON")
    parser.add_argument("--resident-layers", type=int, default=0)
    parser.add_argument("--steps", type=int, default=30, help="steps per request for the overhead runs")
    parser.add_argument("--key-steps", type=int, default=200, help="steps per request while keys are pressed")
    parser.add_argument("--repeats", type=int, default=3, help="timed requests per overhead run (after a warm-up)")
    parser.add_argument("--height", type=int, default=None)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--presses", type=int, default=60)
    parser.add_argument("--queued", type=int, default=0, metavar="N",
                        help="requests waiting in the queue while the keys are pressed (the console's queue panel)")
    parser.add_argument("--replan", type=int, default=None, metavar="N",
                        help="also re-plan live 0 -> N -> 0 -> N -> 0 resident layers while keys are pressed")
    parser.add_argument("--key", default="p", help="live-screen key to press (p: pause/resume the staging log)")
    parser.add_argument("--gap-ms", type=float, default=20.0, help="pause between presses")
    parser.add_argument("--hz", type=float, default=10.0, help="telemetry rate")
    parser.add_argument("--cols", type=int, default=200)
    parser.add_argument("--rows", type=int, default=60)
    parser.add_argument("--out-dir", default="omni-console-out", help="where the app saves images")
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="torch intra-op threads (CPU runs: leave a core for the UI, e.g. nproc - 1)")
    args = parser.parse_args(argv)
    if args.key != "p":
        parser.error("only --key p is timed (its effect, the staging log's paused state, is observable)")

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    model = resolve_model_path(args.model)
    policy = build_policy(parse_components_json(args.dlo_offload_components), args.resident_layers)
    log(f"model {model} on {args.device}; policy {policy.components_json()} resident_layers={policy.resident_layers}")
    before = headless_baseline(model, args.device, policy, args)
    log(f"headless (before): median step {before['median_s'] * 1e3:.2f} ms")
    app = asyncio.run(run_app(model, args.device, policy, args))
    after = headless_baseline(model, args.device, policy, args)  # brackets the app run against drift
    log(f"headless (after): median step {after['median_s'] * 1e3:.2f} ms")
    headless = {"median_s": statistics.fmean([before["median_s"], after["median_s"]]),
                "mean_s": statistics.fmean([before["mean_s"], after["mean_s"]]), "before": before, "after": after}
    ratio = app["app_idle"]["median_s"] / headless["median_s"] if headless["median_s"] else None
    busy_ratio = app["app_busy"]["median_s"] / headless["median_s"] if headless["median_s"] else None
    mean_ratio = app["app_idle"]["mean_s"] / headless["mean_s"] if headless["mean_s"] else None
    report = {
        "schema": "omni-console.bench.console/1",
        "model": str(model), "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor(),
        "torch": torch.__version__, "textual": textual.__version__, "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "steps": args.steps, "key_steps": args.key_steps, "queued": args.queued, "repeats": args.repeats,
        "telemetry_hz": args.hz,
        "headless": headless, **app,
        "overhead_ratio_idle": ratio, "overhead_ratio_idle_mean": mean_ratio, "overhead_ratio_busy": busy_ratio,
        "overhead_target": 1.01,
    }
    lat = app["latency_ms"]
    print(f"device {args.device} · model {model.name} · {args.steps} steps × {args.repeats} · telemetry {args.hz:g} Hz")
    print(f"step median: headless {headless['median_s'] * 1e3:.2f} ms · app idle "
          f"{app['app_idle']['median_s'] * 1e3:.2f} ms · "
          f"app with key presses {app['app_busy']['median_s'] * 1e3:.2f} ms")
    print(f"overhead ratio (app idle / headless, medians): {ratio:.3f} (target ≤ 1.01); of means {mean_ratio:.3f}; "
          f"with key presses (medians): {busy_ratio:.3f}")
    for name in ("key_to_state", "key_to_frame"):
        p = lat[name]
        if p["n"]:
            print(f"{name}: p50 {p['p50']:.1f} ms · p95 {p['p95']:.1f} ms · max {p['max']:.1f} ms (n={p['n']})")
    print(f"timeouts {lat['timeouts']} · frames/s while generating {app['frames_per_s_while_generating']:.1f} · "
          f"events dropped {app['events_dropped']} · telemetry overruns {app['telemetry_overruns']}")
    harness.write(report, args)
    if args.out is not None:
        log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
