"""What watching the console costs the engine: the live screen drawn to a terminal while it generates.

`console_responsiveness.py` times the app headless, where Textual composes each frame but never turns
it into terminal output; an operator's terminal also gets every frame rendered to escape sequences
and written. Here each composed frame is rendered as the real driver would (`render_segments`) and
written to /dev/null, at the live screen's normal redraw rate, at each terminal size (--sizes):

1. headless `Engine` baseline (the same request, same process) before, between and after the sizes, so each
   size is compared with the headless runs around it (and the drift between those is printed);
2. per size: the watched app loads the model, runs --repeats requests of --steps steps (step 1 of
   each excluded), then presses `p` (pause/resume the log) --presses times during a long request:
   key → state and key → the first frame written that shows the change (the status line), p50/p95/max;
3. with --esc N, per size: esc pressed N times during a long request, key → back to idle (the request
   cancelled, the engine ready; target 2 s) and key → the frame that no longer says "cancelling"
   (`console_cancel.py`);
4. prints, per size, the watched/headless ratio of the median step (target ≤ 1.01) and the key→frame
   p95 (target < 100 ms), and writes JSON to --out.

--previews: the watched engine publishes step previews (`EngineOptions.step_previews`) and the live screen
draws them and each output (half-block cells), so the ratio is "watched with previews on" against the same
headless baseline (previews off); it also prints the previews drawn and dropped (the UI behind).

With --plots the plot screen (`v`: memory, link rate and stalls over the request) is open while the
warm-up and the timed requests run, redrawing as it does for an operator; it is closed (esc) before the
key presses, which are the live screen's. The ratio is then the watched cost with the plots open.

Usage: python -m benchmarks.console_watched [--model PATH] [--device cuda|cpu] [--steps N]
       [--sizes 160x48,80x24] [--presses N] [--esc N] [--esc-delay-s S] [--previews] [--plots] [--out watched.json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from omni_console.console.app import OmniConsoleApp  # noqa: E402
from omni_console.console.args import resolve_model_path  # noqa: E402
from omni_console.engine.engine import Engine, GenerateResult  # noqa: E402
from omni_console.engine.options import EngineOptions  # noqa: E402
from omni_console.offload.policy import OffloadPolicy, build_policy, parse_components_json  # noqa: E402

from . import console_cancel, harness
from . import console_responsiveness as base


class TerminalClock(base.FrameClock):
    """Every composed frame rendered to terminal output and written, as the real driver does."""

    def __init__(self, app: OmniConsoleApp) -> None:
        super().__init__(app)
        self.sink = open(os.devnull, "w")  # noqa: SIM115 (closed by close())
        self.bytes = 0
        self.render_s = 0.0
        counted = app._display

        def display(screen, renderable) -> None:
            counted(screen, renderable)
            if renderable is None or app._batch_count:
                return
            if self.sink.closed:
                return
            t0 = time.perf_counter()
            render = getattr(renderable, "render_segments", None)
            text = render(app.console) if render is not None else app.console._render_buffer(
                app.console.render(renderable))
            self.sink.write(text)
            self.bytes += len(text)
            self.render_s += time.perf_counter() - t0

        app._display = display  # type: ignore[method-assign]

    def close(self) -> None:
        self.sink.close()


async def watched(model: Path, device: str, policy: OffloadPolicy, args: argparse.Namespace,
                  size: tuple[int, int]) -> dict[str, Any]:
    engine = Engine(model, device=device, variant=args.variant, options=EngineOptions(step_previews=args.previews))
    app = OmniConsoleApp(engine, policy, telemetry_hz=args.hz, out_dir=Path(args.out_dir),
                         preview="halfblock" if args.previews else "off")
    out: dict[str, Any] = {"size": f"{size[0]}x{size[1]}"}
    try:
        async with app.run_test(size=size, notifications=True) as pilot:
            clock = TerminalClock(app)
            await pilot.pause()
            future = app.action_load()
            assert future is not None
            await asyncio.wrap_future(future)
            if not await base.wait_for(lambda: app.screen is app.live_screen, 120):
                raise RuntimeError(f"load did not reach the live screen: {app.last_error}")

            async def generate(steps: int) -> GenerateResult:
                while app.generating or app.phase != "live":
                    await asyncio.sleep(0.001)
                fut = app.start_generate(base.make_request(engine, args, steps))
                assert fut is not None
                return await asyncio.wrap_future(fut)

            plots = await open_plots(pilot, app) if args.plots else None
            await generate(args.steps)  # warm-up
            frames0, bytes0, render0, t0 = clock.frames, clock.bytes, clock.render_s, time.perf_counter()
            results = [await generate(args.steps) for _ in range(args.repeats)]
            elapsed = time.perf_counter() - t0
            out["steps"] = base.step_stats(results)
            out["frames_per_s"] = (clock.frames - frames0) / elapsed
            out["terminal_bytes_per_s"] = (clock.bytes - bytes0) / elapsed
            out["render_share_of_wall"] = (clock.render_s - render0) / elapsed
            if args.previews and app.live_screen is not None:
                out["previews"] = {"drawn": app.live_screen.preview.step_previews,
                                   "dropped": app.router.previews_dropped,
                                   "output_shown": app.live_screen.preview.output is not None,
                                   "output_delay_ms": base.percentiles(
                                       [d * 1e3 for d in app.live_screen.preview.output_delays]),
                                   "step_delay_ms": base.percentiles(
                                       [d * 1e3 for d in app.live_screen.preview.step_delays])}
            if plots is not None:
                out["plot_redraws_per_s"] = plots.count / elapsed  # includes the warm-up's: an upper bound
                await pilot.press("escape")
                if not await base.wait_for(lambda: app.screen is app.live_screen, 10):
                    raise RuntimeError("esc did not close the plot screen")
            state_ms: list[float] = []
            frame_ms: list[float] = []
            failures = 0
            while len(state_ms) + failures < args.presses:
                while app.generating or app.phase != "live":  # the previous request's outcome first
                    await asyncio.sleep(0.001)
                running = app.start_generate(base.make_request(engine, args, args.key_steps))
                assert running is not None
                while not running.done() and len(state_ms) + failures < args.presses:
                    timed = await base.press_and_time(app, clock, "p")
                    if timed is None:
                        failures += 1
                    else:
                        state_ms.append(timed[0])
                        frame_ms.append(timed[1])
                    await asyncio.sleep(args.gap_ms / 1e3)
                await asyncio.wrap_future(running)
                while app.generating:
                    await asyncio.sleep(0.001)
            out["key_to_state_ms"] = base.percentiles(state_ms)
            out["key_to_frame_ms"] = base.percentiles(frame_ms)
            out["key_timeouts"] = failures
            if args.esc:
                out["esc"] = await console_cancel.esc_to_idle(app, clock, args)
            await base.quit_app(pilot, app)
        clock.close()
    finally:
        app.shutdown()
    return out


class RedrawCount:
    """How many times the plot screen drew its plots (its `redraw` found the record changed)."""

    def __init__(self, screen: Any) -> None:
        self.count = 0
        show = screen.memory.show  # called on each drawing (the screen's timer holds its own `redraw`)

        def counted(record: Any) -> None:
            self.count += 1
            show(record)

        screen.memory.show = counted


async def open_plots(pilot: Any, app: OmniConsoleApp) -> RedrawCount:
    """Press v on the live screen and wait for the plot screen; its redraws are counted from here."""
    from omni_console.console.screens.plots import PlotScreen

    await pilot.press("v")
    if not await base.wait_for(lambda: isinstance(app.screen, PlotScreen), 10):
        raise RuntimeError("v did not open the plot screen")
    return RedrawCount(app.screen)


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__.split("\n")[0], out=None, device=harness.AUTO)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--variant", default=None)
    parser.add_argument("--dlo-offload-components", default=None, metavar="JSON")
    parser.add_argument("--resident-layers", type=int, default=0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--key-steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--height", type=int, default=None)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--presses", type=int, default=40)
    parser.add_argument("--gap-ms", type=float, default=50.0)
    parser.add_argument("--hz", type=float, default=10.0)
    parser.add_argument("--sizes", default="160x48,80x24")
    parser.add_argument("--out-dir", default="omni-console-out")
    parser.add_argument("--previews", action="store_true",
                        help="step and output previews on in the watched app (the headless baseline has none)")
    parser.add_argument("--plots", action="store_true", help="the plot screen (v) open while the requests run")
    console_cancel.add_arguments(parser)
    args = parser.parse_args(argv)
    args.replan = None
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    model = resolve_model_path(args.model)
    policy = build_policy(parse_components_json(args.dlo_offload_components), args.resident_layers)
    # each size bracketed by headless runs (headless, size 1, headless, size 2, headless): a drift of the
    # machine between the first and the last (12 % once on an H100) is not read as the console's cost
    brackets = [base.headless_baseline(model, args.device, policy, args)]
    base.log(f"headless: median step {brackets[0]['median_s'] * 1e3:.2f} ms")
    runs = []
    for size in sizes:
        runs.append(asyncio.run(watched(model, args.device, policy, args, size)))  # type: ignore[arg-type]
        brackets.append(base.headless_baseline(model, args.device, policy, args))
        base.log(f"headless: median step {brackets[-1]['median_s'] * 1e3:.2f} ms")
    before, after = brackets[0], brackets[-1]
    headless = statistics.fmean(b["median_s"] for b in brackets)
    print(f"device {args.device} · model {model.name} · {args.steps} steps × {args.repeats} · "
          f"headless median step {headless * 1e3:.2f} ms (runs: "
          + ", ".join(f"{b['median_s'] * 1e3:.2f}" for b in brackets) + ")")
    for k, run in enumerate(runs):
        around = [brackets[k]["median_s"], brackets[k + 1]["median_s"]]
        run["headless_around_s"] = around
        run["step_ratio"] = run["steps"]["median_s"] / statistics.fmean(around)
        run["headless_drift"] = max(around) / min(around) - 1  # the ratio means little where this exceeds ~1 %
        p95 = run["key_to_frame_ms"]["p95"]
        print(f"{run['size']}: watched median step {run['steps']['median_s'] * 1e3:.2f} ms · ratio "
              f"{run['step_ratio']:.3f} to the headless runs around it (drift between them "
              f"{run['headless_drift'] * 100:.1f} %; target ≤ 1.01) · key→frame p95 "
              f"{'n/a' if p95 is None else f'{p95:.1f} ms'} (target < 100) · {run['frames_per_s']:.1f} frames/s, "
              f"{run['terminal_bytes_per_s'] / 1e3:.1f} kB/s to the terminal, "
              f"render {run['render_share_of_wall'] * 100:.1f} % of wall"
              + (f" · plots open, {run['plot_redraws_per_s']:.1f} redraws/s" if "plot_redraws_per_s" in run else ""))
        if "previews" in run:
            shown = run["previews"]
            print(f"{run['size']}: step previews drawn {shown['drawn']}, dropped {shown['dropped']} (UI behind), "
                  f"output preview {'shown' if shown['output_shown'] else 'NOT shown'}, file → drawn p95 "
                  f"{shown['output_delay_ms']['p95'] or float('nan'):.1f} ms (target < 500)")
            step_p95 = shown["step_delay_ms"]["p95"] or float("nan")
            print(f"{run['size']}: step preview published → drawn p95 {step_p95:.1f} ms = "
                  f"{step_p95 / (run['steps']['median_s'] * 1e3):.2f} steps (target ≤ 1 step)")
        if "esc" in run:
            print(console_cancel.summary(run["size"], run["esc"]))
    harness.write({"schema": "omni-console.bench.watched/1", "device": args.device, "model": str(model),
                   "previews": args.previews, "plots_open": args.plots,
                   "headless_median_s": headless, "headless": {"before": before, "after": after, "runs": brackets},
                   "watched": runs},
                  args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
