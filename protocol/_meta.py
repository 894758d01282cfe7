"""mcpool's own `_meta` keys (DESIGN X9): written by the daemon alone, removed from upstreams.

A client reads `_meta["mcpool/trust"]`, `["mcpool/alwaysLoad"]` and `["mcpool/server"]` on a tool
as what the user's settings say about it, and `["anthropic/alwaysLoad"]` as whether to load it
eagerly, which mcpool sets from `alwaysLoadTools`. An upstream sending the same keys would speak
for the user, so they are removed from everything it sends before the daemon adds its own.

Where: every `_meta` object of a message, result or listed item, except inside the values that
are the server's data or schemas (`structuredContent`, `inputSchema`, `outputSchema`,
`requestedSchema`), where a `_meta` is an ordinary property a client never reads as ours; the
members of a `_meta` are data too (only its own keys are looked at). `anthropic/alwaysLoad`
only on a listed item's own `_meta` (it means nothing elsewhere).

Cost: callers test the encoded bytes first (`may_carry_own_meta`), so a message without any of
these keys is never decoded for it. The test allows for escapes: JSON may spell `mcpool/` as
`mcpool\\/` or any of its letters as `\\u00XX`, so it looks for `mcpool` and for `\\u00` (every
escape of an ASCII letter starts with it); a hostile upstream's escaped key still meets the walk.
The walk is a loop over an explicit stack, not recursion: a hostile value nested as deep as the
decoder allows cannot raise RecursionError here.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "OWN_META_PREFIX",
    "SETTINGS_META_KEYS",
    "may_carry_own_meta",
    "strip_own_meta",
    "without_own_meta",
]

OWN_META_PREFIX = "mcpool/"
# Keys outside mcpool's prefix that mcpool alone sets on a listed tool, from the user's settings.
SETTINGS_META_KEYS = ("anthropic/alwaysLoad",)
# Values that are a server's data or a JSON Schema, not protocol objects: never walked.
_DATA_KEYS = frozenset({"structuredContent", "inputSchema", "outputSchema", "requestedSchema"})

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


def may_carry_own_meta(data: bytes, *, item: bool = False) -> bool:
    """Whether `data` (JSON) may hold a key `strip_own_meta` removes: False means it surely
    does not (two or three C substring searches, no decoding)."""
    # `find`, not `in`: `bytes in bytes` first tries the needle as an integer and formats the
    # TypeError it gets, three times the cost of the search (on every relayed answer).
    return (
        data.find(b"mcpool") >= 0
        or data.find(b"\\u00") >= 0
        or (item and data.find(b"alwaysLoad") >= 0)
    )


def strip_own_meta(value: Any, *, item: bool = False) -> bool:
    """Remove, in place, every `mcpool/` key of every `_meta` object in `value` (a decoded
    message, result or listed item: fresh objects nothing else holds yet); with `item`, also
    the settings keys (`SETTINGS_META_KEYS`) of its own `_meta`. True when anything went."""
    removed = False
    if item and isinstance(value, dict):
        meta = value.get("_meta")
        if isinstance(meta, dict):
            for key in SETTINGS_META_KEYS:
                if key in meta:
                    del meta[key]
                    removed = True
    stack = [value] if value.__class__ in (dict, list) else []
    pop, push = stack.pop, stack.append
    while stack:
        node = pop()
        if node.__class__ is dict:
            for key, child in node.items():
                if key == "_meta":
                    if child.__class__ is dict:
                        own = [k for k in child if k.startswith(OWN_META_PREFIX)]
                        for k in own:
                            del child[k]
                        removed = removed or bool(own)
                elif key not in _DATA_KEYS and child.__class__ in (dict, list):
                    push(child)
        else:
            stack.extend(c for c in node if c.__class__ in (dict, list))
    return removed


def without_own_meta(data: bytes) -> bytes:
    """`data` (one encoded JSON value, a newline after it or not) without mcpool's own `_meta`
    keys: `data` itself when it has none (or does not decode: its reader says what is wrong),
    else re-encoded (ending as `data` did)."""
    if not may_carry_own_meta(data):
        return data
    try:
        value = _decoder.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return data
    if not strip_own_meta(value):
        return data
    out = _encoder.encode(value)
    return out + b"\n" if data.endswith(b"\n") else out
