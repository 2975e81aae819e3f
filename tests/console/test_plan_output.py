"""`omni-console plan` text output: piped, every value complete in tab-separated rows; on a narrow
terminal, rich tables whose names wrap and are never cut short with `…`."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from omni_console.console.cli import main
from omni_console.console.plan_view import render_plan
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.export import vllm_python_call, vllm_serve_command
from omni_console.engine.planning.plan import make_plan
from omni_console.offload.policy import build_policy

COMPONENT_HEADER = ["component", "role", "class", "dtype", "size", "blocks", "residency", "why"]
BLOCKS_HEADER = ["DiT", "block list", "count", "bytes/block", "largest", "total", "resident", "streamed"]


def _sections(out: str) -> list[list[str]]:
    return [block.split("\n") for block in out.strip("\n").split("\n\n")]


def _table(sections: list[list[str]], header: list[str]) -> list[list[str]]:
    """The rows (split at tabs) of the section whose first line is `header`."""
    matches = [s for s in sections if s[0].split("\t") == header]
    assert len(matches) == 1, f"no single table with header {header}"
    rows = [line.split("\t") for line in matches[0][1:]]
    assert rows and all(len(row) == len(header) for row in rows), rows
    return rows


def test_piped_plan_is_tab_separated_and_complete(demo_model_dir: Path, capsys):
    assert main(["plan", "--model", str(demo_model_dir), "--resident-layers", "1"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and "┃" not in out and "│" not in out  # no rich table, nothing cut short
    sections = _sections(out)

    model = discover_model(demo_model_dir)
    rows = _table(sections, COMPONENT_HEADER)
    assert [(r[0], r[2]) for r in rows] == [(c.name, c.class_name) for c in model.components]
    by_name = {r[0]: dict(zip(COMPONENT_HEADER, r, strict=True)) for r in rows}
    assert by_name["transformer"]["residency"] == "streamed by DLO" and by_name["transformer"]["why"] == "dlo"
    assert by_name["vae"]["residency"] == "offloaded (staged)"

    dit = model.component("transformer")
    blocks = _table(sections, BLOCKS_HEADER)
    assert [(r[1], r[2], r[6]) for r in blocks[:-1]] == [
        (b.attr, str(b.count), str(min(1, b.count) if i == 0 else 0)) for i, b in enumerate(dit.block_lists)]

    forecast = _table(sections, ["forecast", "bytes"])
    assert {r[0] for r in forecast} >= {"device resident weights", "device peak weights"}

    plan = make_plan(model, build_policy(None, 1, "dlo"))
    lines = out.splitlines()
    assert f"serve: {vllm_serve_command(plan)}" in lines  # the whole command on one line, ready to copy
    assert f"python: {vllm_python_call(plan)}" in lines
    assert f"model: {demo_model_dir} (FluxPipeline)" in lines


def test_piped_plan_escapes_tabs_and_newlines_in_values(demo_model_dir: Path, capsys):
    plan = make_plan(discover_model(demo_model_dir), build_policy(None, 0, "dlo"))
    object.__setattr__(plan.model, "notes", ("a\tnote\nover two lines",))
    render_plan(plan)  # capsys: not a terminal
    out = capsys.readouterr().out
    assert "note: a\\tnote\\nover two lines" in out.splitlines()
    for row in _table(_sections(out), COMPONENT_HEADER):
        assert len(row) == len(COMPONENT_HEADER)


def _column(table_lines: list[str], index: int) -> str:
    """A column's text read top to bottom (a folded value continues on the next line)."""
    return "".join(line.split("│")[index].strip() for line in table_lines)


def test_narrow_terminal_keeps_names_and_the_command_whole(demo_model_dir: Path):
    """Words wrap at spaces, only free text (a class name) is cut with `…` (tests/console/test_whole_words.py
    checks every word); component names and the serve command stay whole."""
    plan = make_plan(discover_model(demo_model_dir), build_policy(None, 0, "dlo"))
    for width in (80, 100):
        buf = io.StringIO()
        render_plan(plan, Console(width=width, file=buf, force_terminal=True, color_system=None))
        text = buf.getvalue()
        assert "\t" not in text
        assert all(len(line) <= width for line in text.splitlines())
        first_cells = {line.split()[0] for line in text.splitlines() if line.strip()}
        assert {c.info.name for c in plan.components} <= first_cells, width
        flat = "".join(text.replace("│", "").split())  # the panel wraps the command at spaces, never cuts it
        assert "".join(vllm_serve_command(plan).split()) in flat


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps at the terminal width


def test_theme_help_lists_the_theme_names(capsys, monkeypatch):
    from omni_console import themes

    text = _help(capsys, "console")
    assert f"{themes.DEFAULT_THEME} (default)" in text
    assert all(name in text for name in themes.THEMES)
    monkeypatch.setitem(themes.THEMES, "omni-sepia", themes.THEMES[themes.DEFAULT_THEME])
    assert "omni-sepia" in _help(capsys, "console")  # read from the themes module, not a list of its own


def test_forecast_caption_counts_the_streamers_slots(demo_model_dir, capsys):
    """One streamed block uses one slot, and the caption's formula says so (it said 2 always)."""
    from omni_console.console.cli import main

    assert main(["plan", "--model", str(demo_model_dir), "--resident-layers", "5"]) == 0
    assert "peak = resident + 1 × largest streamed block" in capsys.readouterr().out
    assert main(["plan", "--model", str(demo_model_dir)]) == 0
    assert "peak = resident + 2 × largest streamed block" in capsys.readouterr().out
