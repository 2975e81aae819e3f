"""`dlo_offload_components` semantics (as vLLM-Omni has them): build-time checks, post-discovery checks,
resolution order, resident layers and mode."""

from __future__ import annotations

import pytest

from omni_console.offload.errors import PolicyError, PolicyTypeError
from omni_console.offload.policy import build_policy, parse_components_json

AUX = ["text_encoder", "text_encoder_2", "vae"]
DITS = ["transformer"]


def test_none_means_empty_map_and_everything_staged():
    policy = build_policy(None)
    assert policy.dlo_offload_components == {}
    assert all(policy.offload_enabled(name) for name in AUX)
    assert all(policy.source_of(name) == "implicit" for name in AUX)


@pytest.mark.parametrize("value,type_name", [([], "list"), (["text_encoder"], "list"), (False, "bool"),
                                             ("text_encoder", "str"), (3, "int")])
def test_non_mapping_is_a_type_error_naming_the_type(value, type_name):
    with pytest.raises(PolicyTypeError) as err:
        build_policy(value)
    assert str(err.value) == (
        f"dlo_offload_components must be a mapping of component names to booleans, got {type_name}"
    )
    assert isinstance(err.value, TypeError)


@pytest.mark.parametrize("key", ["", 3, None])
def test_keys_must_be_non_empty_strings(key):
    with pytest.raises(PolicyTypeError, match="keys must be non-empty strings"):
        build_policy({key: True})


@pytest.mark.parametrize("value,type_name", [(0, "int"), (1, "int"), ("false", "str"), (None, "NoneType"),
                                             (1.0, "float")])
def test_values_must_be_real_booleans_naming_key_and_type(value, type_name):
    with pytest.raises(PolicyTypeError) as err:
        build_policy({"vae": value})
    assert str(err.value) == f"dlo_offload_components['vae'] must be a boolean, got {type_name}"


def test_non_empty_map_requires_dlo():
    with pytest.raises(PolicyError, match="requires distributed layerwise offload"):
        build_policy({"vae": False}, mode="resident")
    # an empty map is fine in resident mode: that is the no-offload baseline
    assert build_policy({}, mode="resident").offload_enabled("vae") is False


def test_resident_layers_in_resident_mode_is_rejected():
    with pytest.raises(PolicyError, match="resident_layers requires"):
        build_policy(None, 2, "resident")


def test_unknown_mode_rejected():
    with pytest.raises(PolicyError, match="mode must be"):
        build_policy(None, 0, "sequential")


def test_resolution_order_own_entry_then_default_then_true():
    policy = build_policy({"text_encoder": True, "default": False})
    assert policy.offload_enabled("text_encoder") is True  # own entry beats default
    assert policy.source_of("text_encoder") == "explicit"
    assert policy.offload_enabled("vae") is False  # default
    assert policy.source_of("vae") == "default"
    no_default = build_policy({"text_encoder": False})
    assert no_default.offload_enabled("vae") is True  # neither → True
    assert no_default.source_of("vae") == "implicit"
    assert no_default.offload_enabled("text_encoder") is False


def test_dit_names_rejected_after_discovery_with_sorted_unknowns():
    policy = build_policy({"vae": False, "zeta": True, "transformer": False, "alpha": True})
    with pytest.raises(PolicyError) as err:
        policy.check_against(AUX, DITS, 6)
    message = str(err.value)
    assert "unknown auxiliary components: ['alpha', 'transformer', 'zeta']" in message
    assert "DLO always owns DiT offload" in message


def test_default_and_discovered_names_allowed():
    policy = build_policy({"default": False, "vae": True, "text_encoder_2": False})
    assert policy.check_against(AUX, DITS, 6) is None
    assert [policy.offload_enabled(n) for n in ("vae", "text_encoder_2", "text_encoder")] == [True, False, False]


@pytest.mark.parametrize("layers,ok", [(0, True), (6, True), (7, False)])
def test_resident_layers_bounded_by_dit_blocks(layers, ok):
    policy = build_policy(None, layers)
    if ok:
        policy.check_against(AUX, DITS, 6)
    else:
        with pytest.raises(PolicyError, match="between 0 and 6"):
            policy.check_against(AUX, DITS, 6)


@pytest.mark.parametrize("layers", [-1, "2", True])
def test_resident_layers_must_be_non_negative_int(layers):
    with pytest.raises(PolicyError, match="resident_layers"):
        build_policy(None, layers)


def test_edits_return_new_policies_and_json_roundtrips():
    base = build_policy({"vae": False})
    toggled = base.with_component("text_encoder", False).with_component("vae", None)
    assert base.dlo_offload_components == {"vae": False}
    assert toggled.dlo_offload_components == {"text_encoder": False}
    assert parse_components_json(toggled.components_json()) == {"text_encoder": False}
    assert base.with_resident_layers(3).resident_layers == 3


def test_cli_json_parse_errors():
    assert parse_components_json(None) is None
    with pytest.raises(PolicyError, match="not valid JSON"):
        parse_components_json("{text_encoder: false}")
    with pytest.raises(PolicyTypeError, match="got list"):
        parse_components_json('["vae"]')


def test_cli_json_duplicate_keys_and_deep_nesting_are_policy_errors():
    with pytest.raises(PolicyError) as err:
        parse_components_json('{"vae": true, "vae": false}')
    assert str(err.value) == "--dlo-offload-components has a duplicate key 'vae'"
    with pytest.raises(PolicyError, match="nested too deeply"):
        parse_components_json('{"vae": ' * 100_000)
