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


def test_frames_of_another_size_than_asked_get_a_note():
    """A pipeline whose VAE upsamples by another factor than the pipeline assumes (a tiny Kandinsky 5 at
    1024x1024 decodes 256x256) writes what it rendered, and `run` says so."""
    from omni_console.engine.service.run_report import rendered_size_notes

    assert rendered_size_notes(1024, 1024, [256, 256]) == [
        "the pipeline rendered 256x256, not the 1024x1024 asked (written as rendered)"]
    assert rendered_size_notes(64, 32, [64, 32]) == []
    assert rendered_size_notes(None, None, [256, 256]) == []  # the pipeline's default size: nothing asked
