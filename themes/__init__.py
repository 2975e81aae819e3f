"""omni_console.themes: the console's Textual themes and shared stylesheet.

Three themes: a dark default, a light one for light terminals, and a high-contrast one for
projectors, screen sharing and low vision. Widgets style themselves only through theme
variables ($primary, $panel, $error, ...), so every theme works with every screen.
"""

from __future__ import annotations

from pathlib import Path

from textual.app import App
from textual.theme import Theme

CSS_PATH: Path = Path(__file__).with_name("console.tcss")
"""The app stylesheet (pass as `App.CSS_PATH`)."""

OMNI_DARK = Theme(
    name="omni-dark",
    primary="#4EA1FF",
    secondary="#8B9CF7",
    accent="#FFB86C",
    warning="#F2C14E",
    error="#FF5F5F",
    success="#4FD18B",
    foreground="#E3E6EB",
    background="#0E1116",
    surface="#161A21",
    panel="#1E2430",
    dark=True,
)

OMNI_LIGHT = Theme(
    name="omni-light",
    primary="#0057B8",
    secondary="#5A4FCF",
    accent="#B35C00",
    warning="#9A6700",
    error="#C62828",
    success="#1B7F3B",
    foreground="#1B1F24",
    background="#F7F8FA",
    surface="#FFFFFF",
    panel="#E6EAF0",
    dark=False,
)

OMNI_HIGH_CONTRAST = Theme(
    name="omni-high-contrast",
    primary="#00E5FF",
    secondary="#FFFF00",
    accent="#FF66FF",
    warning="#FFFF00",
    error="#FF4040",
    success="#00FF66",
    foreground="#FFFFFF",
    background="#000000",
    surface="#000000",
    panel="#1A1A1A",
    boost="#FFFFFF20",
    dark=True,
    luminosity_spread=0.25,
    text_alpha=1.0,
)

THEMES: dict[str, Theme] = {t.name: t for t in (OMNI_DARK, OMNI_LIGHT, OMNI_HIGH_CONTRAST)}
DEFAULT_THEME = "omni-dark"


def register_themes(app: App, *, activate: str | None = DEFAULT_THEME) -> None:
    """Register every omni theme on `app` and switch to `activate` (None keeps the current)."""
    for theme in THEMES.values():
        app.register_theme(theme)
    if activate is not None:
        if activate not in app.available_themes:
            raise ValueError(f"unknown theme {activate!r}; available: {sorted(app.available_themes)}")
        app.theme = activate


__all__ = [
    "CSS_PATH",
    "DEFAULT_THEME",
    "OMNI_DARK",
    "OMNI_HIGH_CONTRAST",
    "OMNI_LIGHT",
    "THEMES",
    "register_themes",
]
