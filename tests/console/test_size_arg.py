"""`--vram-budget` sizes: what an operator writes parses to the bytes they mean; the rest is one line."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_console.console.size_arg import UNITS, parse_size
from omni_console.engine.errors import ConfigError


@pytest.mark.parametrize(("text", "expected"), [("24", 24 * 10**9), ("24GB", 24 * 10**9), ("24 gib", 24 * 2**30),
                                                ("8000M", 8 * 10**9), ("1.5T", 1.5 * 10**12), (".5G", 5 * 10**8),
                                                ("512MiB", 512 * 2**20)])
def test_operator_spellings(text, expected):
    assert parse_size(text) == int(expected)


@pytest.mark.parametrize("text", ["", "G", "-8G", "0", "8 GBs", "8G8", "nan", "inf", "1e3G", "2000TB", "8,5G"])
def test_refused_with_one_line(text):
    with pytest.raises(ConfigError) as err:
        parse_size(text)
    assert "--vram-budget" in str(err.value) and "\n" not in str(err.value)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**6), st.sampled_from(sorted(UNITS)), st.booleans())
def test_integer_sizes_round_trip(number, unit, spaced):
    text = f"{number}{' ' if spaced else ''}{unit.upper() if number % 2 else unit}"
    if number * UNITS[unit] > 10**15:
        with pytest.raises(ConfigError):
            parse_size(text)
    else:
        assert parse_size(text) == number * UNITS[unit]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=12))
def test_any_text_parses_or_fails_with_a_config_error(text):
    with contextlib.suppress(ConfigError):
        assert parse_size(text) >= 1
