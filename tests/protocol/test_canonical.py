from __future__ import annotations

import copy
import json
from typing import Any

import pytest
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
    assert canonical(a, schema=True) == canonical(b, schema=True)
    assert canonical_bytes(a, schema=True) == canonical_bytes(b, schema=True)
    assert canonical(a, schema=True)["enum"] == ["x", "y", "z"]


def test_mixed_enum_keeps_order() -> None:
    a = {"enum": ["a", 1]}
    b = {"enum": [1, "a"]}
    assert canonical(a, schema=True) == {"enum": ["a", 1]}
    assert canonical_bytes(a, schema=True) != canonical_bytes(b, schema=True)


def test_duplicates_are_significant() -> None:
    assert canonical_bytes({"required": ["a", "a"]}, schema=True) != canonical_bytes(
        {"required": ["a"]}, schema=True
    )


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
    assert canonical(value, schema=True) == {
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
    assert canonical({"required": ("b", "a"), "x": (1, 2)}, schema=True) == {
        "required": ["a", "b"],
        "x": [1, 2],
    }


def test_canonical_bytes_matches_canonical() -> None:
    value = {"b": [{"type": ["z", "a"]}], "a": None}
    assert json.loads(canonical_bytes(value)) == canonical(value)


def test_set_keywords_sort_only_inside_schemas_of_an_item() -> None:
    # Issue 15.10: a `required`, `type` or `enum` key inside data is data, not a keyword.
    def item(order: list[str]) -> dict[str, Any]:
        return {
            "name": "t",
            "inputSchema": {"type": "object", "required": ["a", "b"]},
            "_meta": {"required": order},
        }

    assert canonical_bytes(item(["x", "y"])) != canonical_bytes(item(["y", "x"]))
    assert canonical_bytes({"annotations": {"type": ["a", "b"]}}) != canonical_bytes(
        {"annotations": {"type": ["b", "a"]}}
    )
    # A bare object is an item, not a schema: its top-level `required` is data too.
    assert canonical_bytes({"required": ["a", "b"]}) != canonical_bytes({"required": ["b", "a"]})
    assert canonical({"name": "t", "outputSchema": {"required": ["b", "a"]}}) == {
        "name": "t",
        "outputSchema": {"required": ["a", "b"]},
    }


@pytest.mark.parametrize("where", ["default", "examples", "const", "x-custom"])
def test_keyword_named_keys_inside_schema_data_keep_their_arrays(where: str) -> None:
    def schema(order: list[str]) -> dict[str, Any]:
        data = {"type": order, "required": order, "enum": order}
        return {"type": "object", "properties": {"p": {"type": "object", where: data}}}

    a = {"name": "t", "inputSchema": schema(["x", "y"])}
    b = {"name": "t", "inputSchema": schema(["y", "x"])}
    assert canonical_bytes(a) != canonical_bytes(b)
    assert canonical(b)["inputSchema"]["properties"]["p"][where]["type"] == ["y", "x"]


def test_subschema_keywords_are_schemas() -> None:
    def schema(order: list[str]) -> dict[str, Any]:
        sub = {"type": order, "required": order, "enum": order}
        return {
            "items": sub,
            "prefixItems": [sub],
            "anyOf": [sub, {"not": sub}],
            "additionalProperties": sub,
            "$defs": {"d": sub},
            "patternProperties": {"^x": sub},
            "if": sub,
            "then": sub,
            "else": sub,
        }

    assert canonical_bytes(schema(["x", "y"]), schema=True) == canonical_bytes(
        schema(["y", "x"]), schema=True
    )
    # `dependencies` names arrays (data) or schemas.
    a = {"dependencies": {"p": ["x", "y"], "q": {"required": ["x", "y"]}}}
    b = {"dependencies": {"p": ["y", "x"], "q": {"required": ["y", "x"]}}}
    c = {"dependencies": {"p": ["x", "y"], "q": {"required": ["y", "x"]}}}
    assert canonical_bytes(a, schema=True) != canonical_bytes(b, schema=True)
    assert canonical_bytes(a, schema=True) == canonical_bytes(c, schema=True)


# Property tests --------------------------------------------------------------------------------

_NAMES = st.sampled_from(["a", "b", "c", "type", "required", "enum", "default"])
_strings = st.lists(st.sampled_from(["s", "t", "u", "v"]), min_size=0, max_size=4, unique=True)
_scalars = st.none() | st.booleans() | st.integers(-100, 100) | st.text(max_size=4)
# Data that looks like schema keywords: what must never be reordered.
_data = st.recursive(
    _scalars | _strings,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(["type", "required", "enum", "x"]), children, max_size=3)
    ),
    max_leaves=5,
)


def _schema_strategy() -> st.SearchStrategy[dict[str, Any]]:
    leaf = st.fixed_dictionaries(
        {},
        optional={
            "type": _strings,
            "required": _strings,
            "enum": _strings,
            "default": _data,
            "examples": st.lists(_data, max_size=3),
            "const": _data,
        },
    )
    return st.recursive(
        leaf,
        lambda children: st.fixed_dictionaries(
            {},
            optional={
                "type": _strings,
                "required": _strings,
                "properties": st.dictionaries(_NAMES, children, max_size=3),
                "items": children,
                "anyOf": st.lists(children, max_size=3),
                "default": _data,
            },
        ),
        max_leaves=4,
    )


_SCHEMAS = _schema_strategy()


def _shuffled_keys(value: dict[str, Any], rnd: Any) -> list[str]:
    keys = list(value)
    rnd.shuffle(keys)
    return keys


def _permute_data(value: Any, rnd: Any) -> Any:
    if isinstance(value, dict):
        return {k: _permute_data(value[k], rnd) for k in _shuffled_keys(value, rnd)}
    if isinstance(value, list):
        return [_permute_data(x, rnd) for x in value]
    return value


def _permute_schema(schema: dict[str, Any], rnd: Any) -> dict[str, Any]:
    """An equivalent schema: key order shuffled, the set keywords' string arrays shuffled."""
    out: dict[str, Any] = {}
    for key in _shuffled_keys(schema, rnd):
        item = schema[key]
        if key in ("type", "required", "enum"):
            item = list(item)
            rnd.shuffle(item)
        elif key == "properties":
            item = {k: _permute_schema(item[k], rnd) for k in _shuffled_keys(item, rnd)}
        elif key == "items":
            item = _permute_schema(item, rnd)
        elif key == "anyOf":
            item = [_permute_schema(s, rnd) for s in item]
        else:
            item = _permute_data(item, rnd)
        out[key] = item
    return out


@given(_SCHEMAS, st.randoms(use_true_random=False))
def test_equal_under_allowed_permutations(schema: dict[str, Any], rnd: Any) -> None:
    tool = {"name": "t", "inputSchema": schema, "_meta": {"k": 1}}
    permuted = {"_meta": {"k": 1}, "inputSchema": _permute_schema(schema, rnd), "name": "t"}
    assert canonical(permuted) == canonical(tool)
    assert canonical_bytes(permuted) == canonical_bytes(tool)


@given(
    _SCHEMAS,
    st.lists(st.text(max_size=3), min_size=2, max_size=5, unique=True),
    st.sampled_from(["default", "examples", "const", "_meta", "annotations"]),
    st.sampled_from(["type", "required", "enum", "x"]),
)
def test_different_under_swapped_order_significant_array(
    schema: dict[str, Any], array: list[str], where: str, key: str
) -> None:
    swapped = [array[1], array[0], *array[2:]]

    def tool(values: list[str]) -> dict[str, Any]:
        data = {key: values}
        if where in ("_meta", "annotations"):
            return {"name": "t", "inputSchema": schema, where: data}
        return {"name": "t", "inputSchema": {**schema, where: data}}

    assert canonical_bytes(tool(array)) != canonical_bytes(tool(swapped))
    assert canonical(tool(array)) != canonical(tool(swapped))
