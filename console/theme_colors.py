"""Rich styles written with theme variables (`bold $success`), resolved against one theme's colours.

The active Textual theme is the only source of colour: a module that colours a Rich renderable writes
its style with the theme's variable names ($success, $warning, $error, $primary, $foreground-muted, ...)
and resolves it with `resolve` against the running app's `app.theme_variables` (redrawing when the
theme changes, see `follow_theme`), so `t` and the high-contrast theme reach every cell. The headless
commands have no app: they resolve against the default theme (`default_variables`).

Importing this module imports no Textual: `plan | less` must stay fast, so Textual and the themes are
imported only when a style is actually resolved (a terminal, or an error line).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from textual.dom import DOMNode
    from textual.theme import Theme


def resolve(style: str, variables: Mapping[str, str]) -> str:
    """`bold $success` → `bold #4fd18b`: each `$name` word replaced by that theme colour, opaque.

    A translucent colour (`$foreground-muted` is the foreground at 60%) is blended over the theme's
    background, since a terminal cell has no alpha. An unknown name is a KeyError naming it.
    """
    if "$" not in style:
        return style
    return " ".join(_colour(word[1:], variables) if word.startswith("$") else word for word in style.split())


def _colour(name: str, variables: Mapping[str, str]) -> str:
    from textual.color import Color

    if name not in variables:
        raise KeyError(f"theme variable ${name} is not defined by the theme")
    colour = Color.parse(variables[name])
    if colour.a < 1:
        colour = Color.parse(variables["background"]) + colour
    return colour.rich_color.name


def theme_variables(theme: Theme) -> dict[str, str]:
    """A theme's variables as an app running it has them in `app.theme_variables` (without an app)."""
    return {**theme.to_color_system().generate(), **theme.variables}


@cache
def default_variables() -> dict[str, str]:
    """The default theme's variables: the colours of the headless commands' output."""
    from ..themes import DEFAULT_THEME, THEMES

    return theme_variables(THEMES[DEFAULT_THEME])


def resolve_default(style: str) -> str:
    """`style` in the default theme's colours (the headless commands, which run no Textual app)."""
    return resolve(style, default_variables()) if "$" in style else style


def follow_theme(widget: DOMNode, redraw: Callable[[], Any]) -> None:
    """Call `redraw` whenever the app's theme changes (by then `app.theme_variables` is the new theme's).

    Call it from the widget's `on_mount`; the subscription ends when the widget is removed.
    """
    widget.app.theme_changed_signal.subscribe(widget, lambda _theme: redraw())


def widget_variables(widget: DOMNode) -> Mapping[str, str]:
    """The running app's theme variables, or the default theme's for a widget not yet in an app."""
    variables = widget.app.theme_variables if widget.is_attached else None
    return variables or default_variables()
