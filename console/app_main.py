"""`omni-console [console]`: validate every flag, then run the app.

Everything an operator can get wrong (policy JSON, resident layers against the model's blocks,
mode, theme, model directory) is checked before the app runs, so a bad flag prints one line and
exits 2. On a terminal those checks, torch's import and the model's discovery run under the
start-up frame (`startup_frame`), drawn at once; an error there gives the terminal back first.

Ending the app: q, SIGTERM, SIGHUP and SIGINT all go through the app's quit (the terminal is restored
by Textual on the way out); a signal ends with its one line and 128 + its number (`exit_signals`), also
when the terminal is already gone (a hangup: restoring it fails, which is not an error then). The
console needs a terminal: without one (stdin or stdout not a tty) it is refused with one line, exit 2,
instead of waiting for keys that never come. The engine thread is never waited for past a short bound, and once the
app has exited the process ends with `os._exit`: letting the interpreter finalize under a thread
that is inside torch can hang or abort, finalizing it after an idle quit takes over a second (torch's
modules), and the OS frees the device and pinned memory of an exiting process anyway.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NoReturn

from ..engine.errors import ConfigError
from .exit_signals import CONSOLE_OUTCOME, say
from .startup_frame import startup_frame

if TYPE_CHECKING:  # torch: imported while the start-up frame is shown, not before it
    from ..engine.api import EngineHandle, RankLayout


def build_app(args: argparse.Namespace, step: Callable[[str], None] = lambda text: None):
    """The configured app (raises ConfigError for anything invalid); the CLI runs it. `step` is told what
    loads next (the start-up frame shows it)."""
    from ..engine.api import probes
    from .args import budget_from_args, layout_from_args, policy_from_args, ram_budget_from_args

    step("checking the flags")
    policy = policy_from_args(args)  # build-time policy checks: no disk access for a bad flag
    budget = budget_from_args(args)
    ram_budget = ram_budget_from_args(args)  # auto: what the host has available now, before the imports below
    layout = layout_from_args(args)  # enough GPUs (or cores, on a CPU) for --gpus N, checked here
    if layout.distributed and budget is not None:
        raise ConfigError("--vram-budget with --gpus: plan one rank's budget with `plan --gpus`, then pass its policy")
    if layout.distributed and ram_budget is not None:
        raise ConfigError("--ram-budget with --gpus: the ranks share the host's memory, which the host plan does not "
                          "split yet; leave it out")
    from ..engine.api import checks

    cache = checks.parse_cache(getattr(args, "cache", None))  # torch-free: a typo is answered before the imports
    if layout.distributed and cache is not None:
        raise ConfigError("--cache with --gpus N > 1: the console's rank group runs its requests without a cache; "
                          "`run --gpus N --dlo-no-use-allgather --cache ...` takes one, or the console on one GPU")
    try:
        hz = probes.validate_hz(args.telemetry_hz)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    from ..themes import THEMES  # Textual, not torch

    if args.theme is not None and args.theme not in THEMES:
        raise ConfigError(f"unknown theme {args.theme!r}; valid themes: {', '.join(sorted(THEMES))}")
    step("importing torch")
    from ..engine.api import probes

    probes.import_runtime()

    step("reading the model (headers only)")
    engine = _engine_for(args, layout)
    step("planning and building the console")
    from ..engine.api import RequestSize, planner
    from .app import OmniConsoleApp

    try:
        # post-discovery checks (DiT names, resident layers > blocks); with a budget the planner's choice
        # (for the pipeline's default request) becomes the starting policy; nothing fits: exit 2. With a host
        # budget, the live re-plan masters are planned within it too (a master that does not fit stays on disk)
        planned = planner.plan_for(engine, policy, budget, RequestSize(), forecast=False, ram_budget=ram_budget,
                                   live=True, lora_modules=[m for f in getattr(engine, "loras", ()) for m in f.modules],
                                   lora_mode=getattr(args, "lora_mode", "auto"))
        if budget is not None:
            policy = planned.plan.policy
        from .preview_mode import DEFAULT_PREVIEW, resolve_preview

        checks.check_cache_support(engine.model, cache)  # the family's denoiser takes the kind: before load
        preview = resolve_preview(getattr(args, "preview", DEFAULT_PREVIEW))  # before Textual owns the terminal
        app = OmniConsoleApp(engine, policy, theme=args.theme, telemetry_hz=hz, ram_budget=ram_budget,
                             preview=preview)
        app.session.cache = cache  # the first request's; `s` on the live screen changes it between requests
        if getattr(args, "lora", None):  # the LoRA panel's files; each request carries the set it shows
            from .lora_set import LoraSet

            app.lora_set = LoraSet(args.lora, args.lora_mode)
            app.lora_chosen_mode = getattr(planned.lora, "chosen", None)
        return app
    except BaseException:
        engine.close()
        raise


def _engine_for(args: argparse.Namespace, layout: RankLayout) -> EngineHandle:
    """One GPU: the in-process engine, loaded for live re-plan. Several: a rank group (its processes
    start when the operator loads)."""
    from ..engine.api import EngineOptions, service
    from .args import resolve_model_path
    from .compile_flags import compile_options
    from .lora_flags import lora_options

    if not layout.distributed:
        return service.open_engine(resolve_model_path(args.model), variant=args.variant,
                           options=EngineOptions(live_replan=True,
                                                 step_previews=getattr(args, "preview", "halfblock") != "off",
                                                 preview_decoder=_preview_decoder(args), **compile_options(args),
                                                 **lora_options(args)))  # a bad --lora: one line, exit 2
    if getattr(args, "lora", None):
        raise ConfigError("--lora with --gpus N > 1: the rank group does not apply LoRAs yet (one GPU does)")
    if getattr(args, "compile", "off") != "off":
        raise ConfigError("--compile with --gpus N > 1: the rank group does not compile yet (one GPU does)")
    from platformdirs import user_log_path

    return service.open_engine(resolve_model_path(args.model), layout=layout, variant=args.variant,
                       log_dir=user_log_path("omni-console"))  # the app owns the terminal: not the ranks' output


def _preview_decoder(args: argparse.Namespace) -> str | None:
    path = getattr(args, "preview_decoder", None)
    return str(path) if path is not None and getattr(args, "preview", "halfblock") != "off" else None


EXIT_RELEASE_WAIT_S = 0.2
"""After the app has exited: how long to wait for the engine's release before ending the process."""
QUIT_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGINT") if hasattr(signal, name))
SIGNAL_CODES = {128 + int(signum) for signum in QUIT_SIGNALS}


@contextlib.contextmanager
def quit_on_signals(app) -> Iterator[None]:
    """SIGTERM/SIGHUP/SIGINT quit the app like q (terminal restored) instead of killing it mid-screen.

    The handler only hands the quit to the app's event loop (`OmniConsoleApp.quit_on_signal`);
    the previous handlers come back afterwards. Outside the main thread (tests) nothing is installed.
    """
    previous: dict[int, object] = {}
    try:
        for signum in QUIT_SIGNALS:
            previous[signum] = signal.signal(signum, lambda num, _frame: app.quit_on_signal(num))
    except ValueError:  # not the main thread: signals cannot be handled here
        pass
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]


def exit_now(code: int) -> NoReturn:
    """End the process without waiting for the engine thread (see the module docstring); an image
    or video still being written on that thread leaves no temporary file (`remove_pending`)."""
    from ..engine.api import writes

    writes.remove_pending()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _needs_terminal() -> None:
    for name, stream in (("stdin", sys.stdin), ("stdout", sys.stdout)):
        try:
            ok = stream is not None and stream.isatty()
        except (AttributeError, ValueError):
            ok = False
        if not ok:
            raise ConfigError(f"the console needs a terminal ({name} is not one); for scripts use "
                              "`omni-console run` or `omni-console plan`")


def run_app(args: argparse.Namespace) -> NoReturn:
    """Run the console, then end the process: 0 after q, 128 + signal number after SIGTERM/SIGHUP/SIGINT.

    Once the app has exited the terminal is restored, the output flushed and the engine released, so
    the process ends with `exit_now` at once: finalizing the interpreter (torch, CUDA, thread states)
    took over a second and does nothing the operator needs.
    """
    with startup_frame(str(args.model) if args.model is not None else "built-in demo model") as frame:
        app = build_app(args, frame.step)  # the frame is on screen at once; Textual draws over it
    try:
        _needs_terminal()
    except ConfigError:
        app.engine.close()
        raise
    from .app_lifecycle import QUIT_RELEASE_WAIT_S
    from .shutdown import release_wait_s

    app.release.collect = False  # the process ends after the app: no full collection over the model first
    try:
        with quit_on_signals(app):
            result = app.run()
    except BaseException:
        if app.session.exit_code in SIGNAL_CODES:  # the terminal hung up under the quit: not a failure
            app.shutdown(timeout=EXIT_RELEASE_WAIT_S)
            _end_on_signal(app.session.exit_code)
        if not app.shutdown(timeout=EXIT_RELEASE_WAIT_S) and app.worker.busy:
            traceback.print_exc()
            exit_now(1)
        raise
    code = int(result) if result is not None else (app.return_code or 0)
    # idempotent: q already began it. The terminal is back; the release gets a bounded wait (a stuck step is
    # not waited for past it)
    app.shutdown(timeout=release_wait_s(app.engine, QUIT_RELEASE_WAIT_S))
    if code in SIGNAL_CODES:
        _end_on_signal(code)
    exit_now(code)  # released (or stuck): the interpreter's teardown of torch would only add a second


def _end_on_signal(code: int) -> NoReturn:
    say(code - 128, CONSOLE_OUTCOME)
    exit_now(code)
