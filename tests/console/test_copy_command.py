"""`c` shows the serve command whole for selecting by hand: at 80 columns no word is broken, and the
lines as selected are the same command to a shell."""

from __future__ import annotations

import shlex

from app_helpers import screen_text, until

from omni_console.console.screens import CopyCommandScreen, PlanScreen
from omni_console.console.screens.copy_command import shell_lines
from omni_console.engine.planning.export import vllm_serve_command


def as_shell_words(lines: list[str]) -> list[str]:
    return shlex.split(" ".join(line.rstrip("\\").rstrip() for line in lines))


def test_shell_lines_keep_words_and_quoting_whole():
    command = ("vllm serve /very/long/path/to/a/model/folder/with-a-long-name --omni "
               "--enable-distributed-layerwise-offload --dlo-offload-components '{\"text_encoder\": false}'")
    lines = shell_lines(command, 40)
    assert len(lines) > 2 and all(line.endswith(" \\") for line in lines[:-1])
    assert as_shell_words(lines) == shlex.split(command)
    assert """'{"text_encoder": false}'""" in "\n".join(lines)  # the quoted JSON stays one quoted word


async def test_c_at_80_columns_shows_the_command_in_whole_words(app, engine):
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, CopyCommandScreen))
        expected = vllm_serve_command(app.plan)
        assert app.clipboard == expected
        shown = screen_text(app)
        assert all(line in shown for line in app.screen.lines)  # every line on screen as laid out
        assert as_shell_words(app.screen.lines) == shlex.split(expected)
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, PlanScreen))


def test_a_word_with_controls_is_shown_escaped_and_bash_reads_back_the_same_bytes(tmp_path):
    import subprocess

    path = "/m/\x1b]52;c;cHduZWQ=\x07\u202eevil\r\t\n'q\\ \x7f\x9b\udcff\u2066x"
    lines = shell_lines(f"vllm serve {shlex.quote(path)} --omni", 200)
    shown = "\n".join(lines)
    assert all(ch.isprintable() for ch in shown.replace("\n", "")), shown
    assert "\\x1b]52;c;cHduZWQ=\\x07\\u202eevil" in shown
    word = lines[0].removeprefix("vllm serve ").removesuffix(" --omni")
    out = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, check=True).stdout
    assert out == path.encode("utf-8", "surrogateescape")
