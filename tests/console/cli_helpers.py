"""Helpers of the CLI tests: what a refused input must look like to the operator."""

from __future__ import annotations


def one_error_line(capsys) -> str:
    """Exactly one `omni-console: error:` line on stderr, nothing on stdout, no traceback."""
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("omni-console: error: ") and "Traceback" not in captured.err
    assert captured.out == ""
    return lines[0]
