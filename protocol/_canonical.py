"""Canonical JSON for comparing registries and schemas (DESIGN S4).

Object keys are sorted recursively. Arrays keep their order, because order is meaning almost
everywhere (`default`, `examples`, `prefixItems`, a tool list); the exceptions are the JSON Schema
keywords whose arrays are sets: `required`, `type` and `enum`, sorted when every element is a
string (a mixed `enum` keeps its order rather than guess an ordering across types).

Those keywords are sorted only where they are keywords: in a schema object. A value is walked in
one of three modes. An *item* (a tool, prompt or resource as listed, or a list of them) is plain
data except its `inputSchema` and `outputSchema`, which are schemas. In a *schema*, the set
keywords are sorted and the subschema keywords (`properties` values, `items`, `allOf`, `not`,
`$defs` values...) are schemas again; every other keyword's value (`default`, `examples`,
`const`, an `enum`'s members, `_meta`, unknown keywords) is *data*, where nothing but object keys
is ever reordered. So a reordered `required` inside an input schema is no change, while the same
array under a `default`, an `examples` entry, a tool's `_meta` or its `annotations` is one.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["canonical", "canonical_bytes"]

_SET_KEYWORDS = frozenset({"required", "type", "enum"})
# Keywords whose value is one subschema (or, for `items` in draft-07's tuple form, a list of them).
_SUBSCHEMA = frozenset(
    {
        "items",
        "additionalItems",
        "contains",
        "additionalProperties",
        "propertyNames",
        "not",
        "if",
        "then",
        "else",
        "unevaluatedItems",
        "unevaluatedProperties",
        "contentSchema",
    }
)
_SUBSCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
# Keywords whose value maps names to subschemas (`dependencies`: a subschema or a name array).
_SUBSCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"}
)
# The keys of an MCP item that hold a JSON Schema.
_SCHEMA_ROOTS = frozenset({"inputSchema", "outputSchema"})

_ITEM, _SCHEMA, _DATA = 0, 1, 2

# order="sorted" sorts object keys while encoding, so canonical_bytes need not rebuild dicts in
# sorted order first (and leaves data that needs no array sorted as it is, uncopied).
_encoder = msgspec.json.Encoder(order="sorted")


def canonical(value: Any, *, schema: bool = False) -> Any:
    """A copy of `value` (an MCP item, or with `schema` a JSON Schema) with keys sorted
    recursively and the set keywords' arrays sorted in its schemas."""
    return _copy(value, _SCHEMA if schema else _ITEM, sort_keys=True)


def canonical_bytes(value: Any, *, schema: bool = False) -> bytes:
    """Compact JSON of canonical(value): equal bytes if and only if canonically equal."""
    return _encoder.encode(_copy(value, _SCHEMA if schema else _ITEM, sort_keys=False))


def _copy(value: Any, mode: int, *, sort_keys: bool) -> Any:
    if isinstance(value, dict):
        if mode == _DATA and not sort_keys:
            return value  # the encoder sorts the keys; nothing else changes in data
        keys = sorted(value) if sort_keys else value
        out: dict[Any, Any] = {}
        for key in keys:
            out[key] = _member(key, value[key], mode, sort_keys)
        return out
    if isinstance(value, list | tuple):
        if mode == _DATA and not sort_keys:
            return value
        # An item list holds items; a bare array in a schema position holds no keywords.
        inner = _ITEM if mode == _ITEM else _DATA
        return [_copy(item, inner, sort_keys=sort_keys) for item in value]
    return value


def _member(key: Any, item: Any, mode: int, sort_keys: bool) -> Any:
    """One member of an object walked in `mode`: how its value is walked."""
    if mode == _ITEM:
        return _copy(item, _SCHEMA if key in _SCHEMA_ROOTS else _DATA, sort_keys=sort_keys)
    if mode == _DATA:
        return _copy(item, _DATA, sort_keys=sort_keys)
    if key in _SET_KEYWORDS:
        if isinstance(item, list | tuple) and all(isinstance(x, str) for x in item):
            return sorted(item)
        return _copy(item, _DATA, sort_keys=sort_keys)
    if key in _SUBSCHEMA:
        if isinstance(item, list | tuple):  # `items` as a tuple: ordered subschemas
            return [_copy(s, _SCHEMA, sort_keys=sort_keys) for s in item]
        return _copy(item, _SCHEMA, sort_keys=sort_keys)
    if key in _SUBSCHEMA_LISTS and isinstance(item, list | tuple):
        return [_copy(s, _SCHEMA, sort_keys=sort_keys) for s in item]
    if key in _SUBSCHEMA_MAPS and isinstance(item, dict):
        names = sorted(item) if sort_keys else item
        return {
            name: _copy(item[name], _DATA if isinstance(item[name], list | tuple) else _SCHEMA,
                        sort_keys=sort_keys)
            for name in names
        }  # fmt: skip
    return _copy(item, _DATA, sort_keys=sort_keys)
