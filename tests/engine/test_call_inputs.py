"""Non-finite numbers in `--param` values are refused wherever they sit; finite values pass."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from omni_console.engine.errors import ConfigError
from omni_console.engine.running.param_syntax import check_finite, parse_param

finite = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                      | st.text(max_size=5),
                      lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner,
                                                                                     max_size=3), max_leaves=12)
BAD = st.sampled_from([math.nan, math.inf, -math.inf])


def _plant(value, bad, path: list[int]):
    """`value` with `bad` put in a list or dict somewhere along `path`."""
    if not path or not isinstance(value, list | dict) or not value:
        return [value, bad]
    if isinstance(value, list):
        i = path[0] % len(value)
        return [*value[:i], _plant(value[i], bad, path[1:]), *value[i + 1:]]
    key = sorted(value)[path[0] % len(value)]
    return {**value, key: _plant(value[key], bad, path[1:])}


@given(finite)
def test_finite_values_pass(value):
    check_finite({"sigmas": value}, "--param")


@given(finite, BAD, st.lists(st.integers(0, 5), max_size=4))
def test_a_non_finite_number_anywhere_is_refused(value, bad, path):
    with pytest.raises(ConfigError, match=r"^--param sigmas: holds a non-finite number"):
        check_finite({"sigmas": _plant(value, bad, path)}, "--param")


@pytest.mark.parametrize("text", ["[NaN]", "[1, [2, Infinity]]", "{\"a\": -Infinity}", "[1e999]"])
def test_the_command_line_forms_parse_to_a_refused_value(text):
    _, value = parse_param(f"sigmas={text}")
    assert isinstance(value, list | dict), json.dumps(value)
    with pytest.raises(ConfigError):
        check_finite({"sigmas": value}, "--param")
