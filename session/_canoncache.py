"""Canonical bytes of items that did not change, found by their encoding (issue 17).

Theory of operation: when one tool of a 5,000-tool server changes, the new snapshot's items are
new objects, and computing every item's canonical form again (a recursive sorted copy, then an
encoding) was most of the loop time of a list_changed. An item's compact encoding identifies
its value exactly, so equal encodings have equal canonical bytes: `canonical_of` encodes the item
(msgspec, one C call), and only an item not seen before pays for its canonical form. The table
is bounded by bytes held and simply cleared when full (the next change refills it).
"""

from __future__ import annotations

from typing import Any

import msgspec

from mcpool.protocol import canonical_bytes

# Held keys and values together stay under this; past it the table starts again (a busy server
# with large schemas then costs what it cost before the cache, never more memory).
MAX_CACHED_BYTES = 32 * 1024 * 1024

_encode = msgspec.json.Encoder().encode
_table: dict[bytes, bytes] = {}
_held = 0


def canonical_of(item: Any) -> bytes:
    """`canonical_bytes(item)`, computed once per distinct value."""
    global _held
    try:
        key = _encode(item)
    except (TypeError, ValueError, OverflowError):
        return canonical_bytes(item)  # not plain JSON: no key to find it by
    found = _table.get(key)
    if found is None:
        found = canonical_bytes(item)
        if _held + len(key) + len(found) > MAX_CACHED_BYTES:
            _table.clear()
            _held = 0
        _table[key] = found
        _held += len(key) + len(found)
    return found
