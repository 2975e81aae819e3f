"""`omni-console --help`'s closing overview: every subcommand's flags, read from the parsers themselves.

argparse's top-level help lists only the subcommands, so a new user reading `omni-console --help`
never learns `--vram-budget` or `--output` exist. The overview is built from the subparsers (a flag
added there appears here, none can go stale) and names each subcommand's own `--help` for the details.
"""

from __future__ import annotations

import argparse

EXAMPLES = (
    ("the console app on a model, within 24 GB of device memory", "omni-console --model DIR --vram-budget 24GB"),
    ("what would load where, and the forecast", "omni-console plan --model DIR --vram-budget 24GB"),
    ("a 12 GB card on a 32 GB host", "omni-console run --model DIR --vram-budget auto --ram-budget auto"),
    ("one image or video, no UI", "omni-console run --model DIR --prompt TEXT --output out.png"),
    ("the tiny demo model, written to a folder", "omni-console demo-model ./demo"),
)


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    """The parser's flags, long spelling, in the order its help shows them (positionals as their metavar)."""
    names = []
    for action in parser._actions:  # noqa: SLF001 - argparse has no public list of a parser's actions
        if isinstance(action, argparse._HelpAction):  # noqa: SLF001
            continue
        names.append(action.option_strings[-1] if action.option_strings else (action.metavar or action.dest).upper())
    return names


def overview(subcommands: dict[str, argparse.ArgumentParser]) -> str:
    """Lines for the top-level help's epilog: the flags every model subcommand shares, each one's own, examples."""
    flags = {name: _flags(parser) for name, parser in subcommands.items()}
    users = [name for name in subcommands if "--model" in flags[name]]
    shared = [f for f in flags[users[0]] if all(f in flags[name] for name in users)]
    lines = ["flags (each subcommand's --help explains them, e.g. omni-console run --help):",
             f"  {', '.join(users)}: {' '.join(shared)}"]
    for name, names in flags.items():
        own = [f for f in names if f not in shared or name not in users]
        if own:
            lines.append(f"  {name} also: {' '.join(own)}" if name in users else f"  {name}: {' '.join(own)}")
    lines += ["", "examples:"]
    for what, command in EXAMPLES:
        lines += [f"  {what}:", f"    {command}"]
    return "\n".join(lines)
