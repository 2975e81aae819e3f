"""`omni-console --help` shows what a new user needs: every subcommand's main flags and examples."""

from __future__ import annotations

import pytest

from omni_console.console.cli import build_parser, main


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_lists_the_main_flags_of_each_subcommand(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    text = _help(capsys)
    words = text.split()
    for flag in ("--model", "--vram-budget", "--resident-layers", "--prefetch-slots", "--gpus", "--output",
                 "--steps", "--prompt", "--overwrite", "--json", "--theme"):
        assert flag in words, flag
    assert "omni-console run --help" in text
    assert "omni-console run --model DIR --prompt TEXT --output out.png" in text
    assert all(len(line) <= 80 for line in text.splitlines())


def test_every_flag_of_every_subcommand_is_in_the_overview(capsys):
    """Read from the parsers: a flag added to a subcommand cannot be missing from the top-level help."""
    words = set(_help(capsys).split())
    sub = next(a for a in build_parser()._actions if a.dest == "command")  # noqa: SLF001
    for parser in sub.choices.values():
        for action in parser._actions:  # noqa: SLF001
            if action.option_strings and action.option_strings[-1] not in ("--help",):
                assert action.option_strings[-1] in words, action.option_strings


def test_subcommand_descriptions_are_not_indented_as_rows(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    text = _help(capsys, "plan")
    start = text.index("Show components")
    paragraph = text[start:text.index("\n\n", start)].splitlines()
    assert len(paragraph) > 1 and not any(line.startswith(" ") for line in paragraph)


def test_a_one_shot_command_gives_the_collector_back_as_it_found_it(demo_model_dir, capsys):
    """`plan` and `run` turn the collector off while the libraries import (engine/running/collector.py); a caller
    that goes on (this test process) gets it back on."""
    import gc

    assert gc.isenabled()
    assert main(["plan", "--model", str(demo_model_dir)]) == 0
    assert gc.isenabled()
    assert main(["plan", "--model", str(demo_model_dir), "--height", "63"]) == 2  # a refusal too
    assert gc.isenabled()
