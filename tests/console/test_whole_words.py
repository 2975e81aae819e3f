"""At 80 columns no word is broken in the middle: `plan`'s tables and the plan screen's block-list
panel wrap at spaces and cut only free text with `…` (they used to print `compone/nt`, `transfor/mer`)."""

from __future__ import annotations

import re

import pytest
from app_helpers import screen_text
from rich.console import Console

from omni_console.console.plan_view import blocks_sheet, component_sheet, forecast_sheet, render_plan
from omni_console.console.table_fit import fit_widths
from omni_console.console.widgets.plan_blocks import BlockListPanel
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.plan import make_plan
from omni_console.offload.policy import build_policy

WORD = re.compile(r"[^\s│┃┏┓┗┛┡┩┣┫━─┌┐└┘├┤┬┴┼╇╈╋┳┻╭╮╰╯]+")


@pytest.fixture(scope="module")
def plan(demo_model_dir):
    return make_plan(discover_model(demo_model_dir), build_policy({}, 0))


def vocabulary(plan) -> set[str]:
    words: set[str] = set()
    for sheet in filter(None, (component_sheet(plan), blocks_sheet(plan), forecast_sheet(plan))):
        for text in (sheet.title, sheet.caption or "", *sheet.header, *sheet.narrow_header.values(),
                     *(cell for row in sheet.rows for cell in row)):
            words.update(text.split())
    return words


def broken_words(text: str, words: set[str]) -> list[str]:
    """Tokens that are neither whole words of the tables nor a word's start cut with `…`."""
    bad = []
    for token in WORD.findall(text):
        if token in words:
            continue
        if token.endswith("…") and any(w.startswith(token[:-1]) for w in words):
            continue
        bad.append(token)
    return bad


@pytest.mark.parametrize("width", [80, 100])
def test_plan_tables_at_narrow_widths_keep_every_word_whole(plan, width):
    console = Console(width=width, force_terminal=True, color_system=None, record=True)
    render_plan(plan, console)
    text = console.export_text()
    tables = text.split("vLLM-Omni equivalent")[0]  # the panels below hold commands, not table cells
    assert max(len(line) for line in tables.splitlines()) <= width
    assert broken_words(tables, vocabulary(plan)) == []
    for name in ("text_encoder", "text_encoder_2", "transformer", "tokenizer_2"):  # names are never cut
        assert re.search(rf"(^|\s){name}(\s|$)", tables, re.M), name


def test_fit_widths_gives_each_column_its_longest_word():
    header = ("name", "class", "size")
    rows = [("text_encoder_2", "T5EncoderModel", "114.6 kB"), ("vae", "AutoencoderKL", "1.1 MB")]
    assert fit_widths(header, rows, 40) is None  # fits as it is
    widths = fit_widths(header, rows, 28, squeeze={1}, whole={2})
    assert widths is not None and sum(widths) <= 28
    assert widths[0] == len("text_encoder_2") and widths[2] == len("114.6 kB") and widths[1] >= 6


async def test_block_list_panel_at_80_columns_keeps_words_whole(app, plan):
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        panel = app.screen.query_one(BlockListPanel)
        panel.scroll_visible(animate=False)
        await pilot.pause()
        region = panel.region
        lines = screen_text(app).splitlines()[region.y:region.bottom]
        inside = "\n".join(line[region.x:region.right] for line in lines)
        words = vocabulary(plan) | {"DiT", "block", "lists", "—", "blocks:", "total", "(per", "list,", "in",
                                    "execution", "order)"}
        assert "transformer" in inside.split() and broken_words(inside, words) == []
