"""Pixels drawn as half-block cells: "▀" with the upper pixel as foreground and the lower as background,
so one cell shows two (about square) pixels. Works in any colour terminal and in snapshot SVGs; no escape
sequence beyond colours, no terminal query.

The image is scaled to fit the space Rich offers (keeping its aspect), enlarged with nearest pixels (a
64x64 latent stays crisp blocks) and reduced by averaging.
"""

from __future__ import annotations

import numpy as np
from PIL import Image
from rich.color import Color
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style

UPPER_HALF = "▀"


def fit_cells(width: int, height: int, max_cells: int, max_rows: int) -> tuple[int, int]:
    """(cells, rows) to draw a width x height image in at most max_cells x max_rows, keeping its aspect."""
    if width < 1 or height < 1 or max_cells < 1 or max_rows < 1:
        return 0, 0
    scale = min(max_cells / width, (2 * max_rows) / height)
    cells = max(1, min(max_cells, round(width * scale)))
    pixel_rows = max(2, min(2 * max_rows, round(height * scale)))
    return cells, (pixel_rows + 1) // 2


class HalfBlockImage:
    """A Rich renderable of an RGB image (PIL image or (h, w, 3) uint8 array) in half-block cells."""

    def __init__(self, image: Image.Image | np.ndarray, *, max_rows: int | None = None) -> None:
        self.image = image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image, np.uint8), "RGB")
        self.image = self.image.convert("RGB")
        self.max_rows = max_rows

    def _size(self, options: ConsoleOptions) -> tuple[int, int]:
        rows = options.height or options.max_height
        if self.max_rows is not None:
            rows = min(rows, self.max_rows)
        return fit_cells(self.image.width, self.image.height, options.max_width, rows)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        cells, _ = self._size(options)
        return Measurement(cells, cells)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        cells, rows = self._size(options)
        if cells == 0:
            return
        enlarge = cells > self.image.width
        pixels = np.asarray(self.image.resize((cells, rows * 2), Image.NEAREST if enlarge else Image.BOX)).tolist()
        for row in range(rows):
            upper, lower = pixels[2 * row], pixels[2 * row + 1]
            for top, bottom in zip(upper, lower, strict=True):
                yield Segment(UPPER_HALF, Style(color=Color.from_rgb(*top), bgcolor=Color.from_rgb(*bottom)))
            yield Segment.line()
