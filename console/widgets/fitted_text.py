"""A one-widget line whose long words (a saved path) are shortened in the middle to its width.

The live screen's request line ends with the saved file's path; at 80 columns the path is longer
than the line and Textual folded it inside a word. This widget keeps the full text and shows it
with every word that would not fit shortened (`console.fit_text`), again whenever its width changes.
"""

from __future__ import annotations

from textual.widgets import Static

from ..fit_text import fit_words
from .text_update import set_text


class FittedText(Static):
    """Static text that wraps only at spaces: a word wider than the widget loses its middle to `…`."""

    def __init__(self, text: str = "", *, id: str | None = None) -> None:
        super().__init__("", id=id, markup=False)
        self.full_text = text

    def on_mount(self) -> None:
        self._draw()

    def show(self, text: str) -> None:
        """Show `text` (the full text is kept; what is drawn fits the current width)."""
        self.full_text = text
        self._draw()

    def on_resize(self) -> None:
        self._draw()

    def _draw(self) -> None:
        set_text(self, fit_words(self.full_text, self.content_size.width))
