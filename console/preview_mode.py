"""How previews are drawn: `--preview off|halfblock|auto` and what `auto` resolves to.

Half-block cells (one character, two pixels: foreground above, background below) are the default: they
work in every terminal that shows colour, and in snapshot tests. `auto` asks the terminal, through
textual-image's detection, for a pixel protocol (Sixel, Kitty's graphics protocol) — only when stdout is
a terminal, TERM is not `dumb`, and not inside tmux (TMUX set: the query and the images need tmux's
passthrough, which is off by default). The query is made once, before the app takes the terminal.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import TextIO

PREVIEW_MODES = ("off", "halfblock", "auto")
DEFAULT_PREVIEW = "halfblock"
OFF, HALFBLOCK, SIXEL, TGP = "off", "halfblock", "sixel", "tgp"
"""What a mode resolves to: no previews, half-block cells, or a pixel protocol (for output previews)."""


def pixel_protocol_allowed(env: Mapping[str, str], stream: TextIO | None) -> bool:
    """May the terminal be asked for a pixel protocol at all (no query otherwise)?"""
    try:
        tty = stream is not None and stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return tty and env.get("TERM", "") not in ("", "dumb") and not env.get("TMUX")


def detect_protocol() -> str:
    """textual-image's answer for this terminal: SIXEL, TGP or HALFBLOCK (its query runs at import)."""
    from textual_image import renderable, widget  # noqa: F401 - widget: caches the cell size while it can ask

    if renderable.Image is renderable.SixelImage:
        return SIXEL
    if renderable.Image is renderable.TGPImage:
        return TGP
    return HALFBLOCK


def resolve_preview(mode: str, env: Mapping[str, str] | None = None, stream: TextIO | None = None,
                    detect: Callable[[], str] = detect_protocol) -> str:
    """OFF, HALFBLOCK, SIXEL or TGP for `--preview MODE` in this terminal."""
    if mode == OFF:
        return OFF
    if mode != "auto":
        return HALFBLOCK
    env = os.environ if env is None else env
    if not pixel_protocol_allowed(env, sys.__stdout__ if stream is None else stream):
        return HALFBLOCK
    return detect()
