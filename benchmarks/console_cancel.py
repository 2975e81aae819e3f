"""esc during a long request, as an operator presses it: how long until the console is idle again.

Used by `console_watched.py --esc N` (and callable from any benchmark that holds a loaded app and a
`FrameClock`). Each trial starts a request of --key-steps steps, lets it run --esc-delay-s (so the key
lands inside a step, not at its start), sends `escape` through the driver like a terminal, and times:

- key → state: the live screen says "cancelling" (the binding ran);
- key → idle: the request has ended (its future done), the app is no longer generating and the engine
  is ready for the next request — what "back to idle" means for the operator (target: 2 s);
- key → frame: the first frame written after that whose status line no longer says "cancelling".

The request must end cancelled (not finished): a trial where it ran to its end is counted as
`finished_first` and not timed (raise --key-steps).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from textual import events

from omni_console.console.app import OmniConsoleApp
from omni_console.console.screens.live import CANCELLING

from . import console_responsiveness as base

IDLE_LIMIT_S = 120.0


def status_says_cancelling(app: OmniConsoleApp) -> bool:
    """The composed screen's status line (the first words of CANCELLING) — what the operator reads."""
    region = app.live_screen.status_line.region  # type: ignore[union-attr]
    shown = " ".join(base.screen_lines(app)[region.y:region.bottom])
    return CANCELLING.split(" (")[0] in shown


async def one_trial(app: OmniConsoleApp, clock: base.FrameClock, args: argparse.Namespace) -> dict[str, Any]:
    while app.generating or app.phase != "live":  # the previous request's outcome first
        await asyncio.sleep(0.001)
    running = app.start_generate(base.make_request(app.engine, args, args.key_steps))  # type: ignore[arg-type]
    assert running is not None
    await base.wait_for(lambda: running.done() or app.engine.state.value == "running", 60)
    await asyncio.sleep(args.esc_delay_s)
    if running.done():
        return {"finished_first": True}
    live = app.live_screen
    assert live is not None
    event = events.Key("escape", None)
    event.set_sender(app)
    clock.seen = None
    clock.watch = None
    t0 = time.perf_counter()
    app._driver.send_message(event)  # type: ignore[union-attr]
    state = await base.wait_for(lambda: live.cancelling or running.done(), IDLE_LIMIT_S)
    t_state = time.perf_counter()
    clock.watch = lambda: not app.generating and not status_says_cancelling(app)
    idle = await base.wait_for(lambda: running.done() and not app.generating
                               and app.engine.state.value == "ready", IDLE_LIMIT_S)
    t_idle = time.perf_counter()
    shown = await base.wait_for(lambda: clock.seen is not None, IDLE_LIMIT_S)
    clock.watch = None
    exc = running.exception() if running.done() and not running.cancelled() else None
    return {"finished_first": False, "cancelled": exc is not None and type(exc).__name__ == "RequestCancelled",
            "outcome": repr(exc) if exc is not None else "finished",
            "key_to_state_ms": (t_state - t0) * 1e3 if state else None,
            "key_to_idle_ms": (t_idle - t0) * 1e3 if idle else None,
            "key_to_frame_ms": (clock.seen - t0) * 1e3 if shown and clock.seen is not None else None}


async def esc_to_idle(app: OmniConsoleApp, clock: base.FrameClock, args: argparse.Namespace) -> dict[str, Any]:
    """args.esc trials; per-trial rows and p50/p95/max of each figure."""
    trials = [await one_trial(app, clock, args) for _ in range(args.esc)]
    timed = [t for t in trials if not t["finished_first"]]
    out: dict[str, Any] = {"trials": trials, "delay_s": args.esc_delay_s, "target_ms": 2000,
                           "finished_first": len(trials) - len(timed),
                           "not_cancelled": sum(1 for t in timed if not t["cancelled"])}
    for name in ("key_to_state_ms", "key_to_idle_ms", "key_to_frame_ms"):
        out[name] = base.percentiles([t[name] for t in timed if t[name] is not None])
    while app.generating:
        await asyncio.sleep(0.001)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--esc", type=int, default=0, metavar="N",
                        help="also time esc -> idle during a --key-steps request, N times per size")
    parser.add_argument("--esc-delay-s", type=float, default=1.5,
                        help="how long each request runs before esc (land inside a step)")


def summary(size: str, esc: dict[str, Any]) -> str:
    idle, frame = esc["key_to_idle_ms"], esc["key_to_frame_ms"]
    if not idle["n"]:
        return f"{size}: esc -> idle: no timed trial ({esc['finished_first']} requests finished first)"
    return (f"{size}: esc -> idle p50 {idle['p50']:.0f} ms, max {idle['max']:.0f} ms (target < 2000); "
            f"-> frame p50 {frame['p50'] or 0:.0f} ms, max {frame['max'] or 0:.0f} ms (n={idle['n']}, "
            f"not cancelled {esc['not_cancelled']}, finished first {esc['finished_first']})")
