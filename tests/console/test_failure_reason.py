"""A failure's line always has a reason: transformers' and diffusers' `ImportError`s start with a newline, so
their first line was empty and `run` said "load failed: ImportError: " and nothing else."""

from __future__ import annotations

from omni_console.console.event_text import one_line


def test_a_message_that_starts_with_a_newline_keeps_its_reason():
    what = f"ImportError: {ImportError(chr(10) + 'Qwen2VLVideoProcessor requires the Torchvision library.' + chr(10))}"
    assert one_line(what) == "ImportError: Qwen2VLVideoProcessor requires the Torchvision library."


def test_an_ordinary_message_is_its_first_line():
    assert one_line("out of memory\nat step 2") == "out of memory"
    assert one_line("  \n\n") == ""
