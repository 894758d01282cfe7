from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from mcpool.protocol import canonical, canonical_bytes


def test_keys_sorted_recursively() -> None:
    value = {"b": {"z": 1, "a": 2}, "a": [{"y": 1, "x": 2}]}
    result = canonical(value)
    assert list(result) == ["a", "b"]
    assert list(result["b"]) == ["a", "z"]
    assert list(result["a"][0]) == ["x", "y"]
    assert canonical_bytes(value) == b'{"a":[{"x":2,"y":1}],"b":{"a":2,"z":1}}'
    assert canonical_bytes(value) == canonical_bytes(
        {"a": [{"x": 2, "y": 1}], "b": {"a": 2, "z": 1}}
    )


def test_required_type_enum_permutations_are_equal() -> None:
    a = {"type": ["string", "null"], "required": ["b", "a"], "enum": ["x", "y", "z"]}
    b = {"enum": ["z", "x", "y"], "required": ["a", "b"], "type": ["null", "string"]}
    assert canonical(a) == canonical(b)
    assert canonical_bytes(a) == canonical_bytes(b)
    assert canonical(a)["enum"] == ["x", "y", "z"]


def test_mixed_enum_keeps_order() -> None:
    a = {"enum": ["a", 1]}
    b = {"enum": [1, "a"]}
    assert canonical(a) == {"enum": ["a", 1]}
    assert canonical_bytes(a) != canonical_bytes(b)


def test_duplicates_are_significant() -> None:
    assert canonical_bytes({"required": ["a", "a"]}) != canonical_bytes({"required": ["a"]})


def test_default_and_examples_order_is_significant() -> None:
    assert canonical_bytes({"default": ["a", "b"]}) != canonical_bytes({"default": ["b", "a"]})
    assert canonical_bytes({"examples": ["a", "b"]}) != canonical_bytes({"examples": ["b", "a"]})
    assert canonical({"default": ["b", "a"]}) == {"default": ["b", "a"]}


def test_other_arrays_keep_order() -> None:
    tools_ab = {"tools": [{"name": "a"}, {"name": "b"}]}
    tools_ba = {"tools": [{"name": "b"}, {"name": "a"}]}
    assert canonical_bytes(tools_ab) != canonical_bytes(tools_ba)
    assert canonical_bytes(["b", "a"]) == b'["b","a"]'


def test_nested_schemas() -> None:
    a = {
        "name": "t",
        "inputSchema": {
            "type": "object",
            "required": ["path", "mode"],
            "properties": {
                "mode": {"type": ["string", "null"], "enum": ["r", "w"], "default": ["w", "r"]},
                "path": {"type": "string"},
                "items": {"type": "array", "items": {"required": ["y", "x"]}},
            },
        },
    }
    b = {
        "inputSchema": {
            "properties": {
                "items": {"items": {"required": ["x", "y"]}, "type": "array"},
                "path": {"type": "string"},
                "mode": {"default": ["w", "r"], "enum": ["w", "r"], "type": ["null", "string"]},
            },
            "required": ["mode", "path"],
            "type": "object",
        },
        "name": "t",
    }
    assert canonical(a) == canonical(b)
    assert canonical_bytes(a) == canonical_bytes(b)
    c: Any = copy.deepcopy(b)
    c["inputSchema"]["properties"]["mode"]["default"] = ["r", "w"]
    assert canonical_bytes(a) != canonical_bytes(c)


def test_a_property_named_like_a_keyword_is_still_a_schema() -> None:
    # "type" under "properties" holds a schema (an object), so only its own keys get sorted.
    value = {"properties": {"type": {"enum": ["b", "a"]}, "required": {"type": "string"}}}
    assert canonical(value) == {
        "properties": {"required": {"type": "string"}, "type": {"enum": ["a", "b"]}}
    }


def test_input_is_never_mutated() -> None:
    value: dict[str, Any] = {"b": 1, "required": ["z", "a"], "n": [{"type": ["b", "a"]}]}
    before = copy.deepcopy(value)
    canonical(value)
    canonical_bytes(value)
    assert value == before
    assert list(value) == ["b", "required", "n"]


def test_tuples_are_arrays() -> None:
    assert canonical({"required": ("b", "a"), "x": (1, 2)}) == {"required": ["a", "b"], "x": [1, 2]}


def test_canonical_bytes_matches_canonical() -> None:
    value = {"b": [{"type": ["z", "a"]}], "a": None}
    assert json.loads(canonical_bytes(value)) == canonical(value)


# Property tests --------------------------------------------------------------------------------

_KEYS = st.sampled_from(["type", "required", "enum", "default", "examples", "items", "a", "b"])
_scalars = st.none() | st.booleans() | st.integers(-100, 100) | st.text(max_size=4)
_json = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_KEYS, children, max_size=4),
    max_leaves=20,
)


def _permute(value: Any, rnd: Any) -> Any:
    """An equivalent value: dict insertion order shuffled, set-keyword string arrays shuffled."""
    if isinstance(value, dict):
        keys = list(value)
        rnd.shuffle(keys)
        out = {}
        for key in keys:
            item = value[key]
            if (
                key in ("type", "required", "enum")
                and isinstance(item, list)
                and all(isinstance(x, str) for x in item)
            ):
                item = list(item)
                rnd.shuffle(item)
                out[key] = item
            else:
                out[key] = _permute(item, rnd)
        return out
    if isinstance(value, list):
        return [_permute(item, rnd) for item in value]
    return value


@given(_json, st.randoms(use_true_random=False))
def test_equal_under_allowed_permutations(value: Any, rnd: Any) -> None:
    permuted = _permute(value, rnd)
    assert canonical(permuted) == canonical(value)
    assert canonical_bytes(permuted) == canonical_bytes(value)


@given(
    _json,
    st.lists(st.text(max_size=3), min_size=2, max_size=5, unique=True),
    st.sampled_from(["default", "examples", "items", "a"]),
)
def test_different_under_swapped_order_significant_array(
    schema: Any, array: list[str], key: str
) -> None:
    swapped = [array[1], array[0], *array[2:]]
    a = {"schema": schema, key: array}
    b = {"schema": schema, key: swapped}
    assert canonical_bytes(a) != canonical_bytes(b)
    assert canonical(a) != canonical(b)
