"""Property-based checks of `parse_components_json`: every text ends in a valid map or one PolicyError."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_console.offload.errors import PolicyError
from omni_console.offload.policy import build_policy, parse_components_json

FAST = settings(max_examples=150, deadline=None)

names = st.text(min_size=1, max_size=12)
component_maps = st.dictionaries(names, st.booleans(), max_size=6)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=10,
)


def _outcome(text: str) -> dict[str, bool] | PolicyError | None:
    try:
        return parse_components_json(text)
    except PolicyError as exc:
        return exc


def _assert_map_or_policy_error(result: object) -> None:
    if isinstance(result, PolicyError):
        assert str(result) and "\n" not in str(result)
    else:
        assert isinstance(result, dict)
        assert all(isinstance(k, str) and k and isinstance(v, bool) for k, v in result.items())


@FAST
@given(st.text(max_size=80))
def test_any_text_is_a_map_or_a_policy_error(text: str):
    _assert_map_or_policy_error(_outcome(text))


@FAST
@given(json_values)
def test_any_json_document_is_a_map_or_a_policy_error(value: object):
    _assert_map_or_policy_error(_outcome(json.dumps(value)))


@FAST
@given(component_maps)
def test_component_maps_round_trip_exactly(components: dict[str, bool]):
    for text in (json.dumps(components), build_policy(components).components_json()):
        parsed = parse_components_json(text)
        assert parsed == components
        assert list(parsed) == list(components)  # order kept too: the exported flag is stable


@FAST
@given(component_maps, names, st.booleans(), st.booleans(), st.integers(min_value=0, max_value=6))
def test_duplicate_keys_are_always_refused_naming_the_key(components, key, first, second, position):
    entries = [json.dumps(k) + ": " + json.dumps(v) for k, v in components.items() if k != key]
    entries.insert(min(position, len(entries)), json.dumps(key) + ": " + json.dumps(first))
    entries.append(json.dumps(key) + ": " + json.dumps(second))
    with pytest.raises(PolicyError) as err:
        parse_components_json("{" + ", ".join(entries) + "}")
    assert str(err.value) == f"--dlo-offload-components has a duplicate key {key!r}"


@pytest.mark.parametrize("text", ["[" * 100_000, '{"a": ' * 100_000, "1" * 5000])
def test_hostile_texts_give_one_line(text: str):
    with pytest.raises(PolicyError) as err:
        parse_components_json(text)
    assert "\n" not in str(err.value) and str(err.value).startswith("--dlo-offload-components ")
