"""Canonical JSON for comparing registries and schemas (DESIGN S4).

Object keys are sorted recursively. Arrays keep their order, because order is meaning almost
everywhere (`default`, `examples`, `prefixItems`, a tool list); the exceptions are the JSON Schema
keywords whose arrays are sets: `required`, `type` and `enum`, sorted when every element is a
string (a mixed `enum` keeps its order rather than guess an ordering across types).
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["canonical", "canonical_bytes"]

_SET_KEYWORDS = frozenset({"required", "type", "enum"})

# order="sorted" sorts object keys while encoding, so canonical_bytes need not rebuild dicts in
# sorted order first.
_encoder = msgspec.json.Encoder(order="sorted")


def canonical(value: Any) -> Any:
    """A copy of `value` with keys sorted recursively and set-like keyword arrays sorted."""
    return _copy(value, sort_keys=True)


def canonical_bytes(value: Any) -> bytes:
    """Compact JSON of canonical(value): equal bytes if and only if canonically equal."""
    return _encoder.encode(_copy(value, sort_keys=False))


def _copy(value: Any, *, sort_keys: bool) -> Any:
    if isinstance(value, dict):
        keys = sorted(value) if sort_keys else value
        out: dict[Any, Any] = {}
        for key in keys:
            item = value[key]
            if (
                key in _SET_KEYWORDS
                and isinstance(item, list | tuple)
                and all(isinstance(x, str) for x in item)
            ):
                out[key] = sorted(item)
            else:
                out[key] = _copy(item, sort_keys=sort_keys)
        return out
    if isinstance(value, list | tuple):
        return [_copy(item, sort_keys=sort_keys) for item in value]
    return value
