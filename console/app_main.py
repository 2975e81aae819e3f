"""`omni-console [console]`: validate every flag, then run the app.

Everything an operator can get wrong (policy JSON, resident layers against the model's blocks,
mode, theme, model directory) is checked before Textual takes the terminal, so a bad flag prints
one line and exits 2 instead of flashing an app.
"""

from __future__ import annotations

import argparse

from ..engine.engine import Engine
from ..offload.errors import ConfigError
from ..offload.telemetry import validate_hz


def build_app(args: argparse.Namespace):
    """The configured app (raises ConfigError for anything invalid); the CLI runs it."""
    from .app import OmniConsoleApp, theme_or_error
    from .cli import policy_from_args, resolve_model_path

    theme_or_error(args.theme)
    policy = policy_from_args(args)  # build-time policy checks: no disk access for a bad flag
    try:
        hz = validate_hz(args.telemetry_hz)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    engine = Engine(resolve_model_path(args.model), variant=args.variant)
    try:
        engine.make_plan(policy)  # post-discovery checks (DiT names, resident layers > blocks)
        return OmniConsoleApp(engine, policy, theme=args.theme, telemetry_hz=hz)
    except BaseException:
        engine.close()
        raise


def run_app(args: argparse.Namespace) -> int:
    app = build_app(args)
    try:
        result = app.run()
    finally:
        app.shutdown()  # idempotent: q already did it; covers crashes and signals
    return 0 if result is None else int(result)
