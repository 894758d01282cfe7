"""Canonical bytes of items that did not change, found by their encoding (issue 17).

Theory of operation: when one tool of a 5,000-tool server changes, the new snapshot's items are
new objects, and computing every item's canonical form again (a recursive sorted copy, then an
encoding) was most of the loop time of a list_changed. An item's compact encoding identifies
its value exactly, so equal encodings have equal canonical bytes: `canonical_of` encodes the item
(msgspec, one C call), and only an item not seen before pays for its canonical form. The table
is the daemon's (`Interner.canonical`), bounded by bytes held and simply cleared when full (the
next change refills it).
"""

from __future__ import annotations

from typing import Any

import msgspec

from mcpool.protocol import ByteTable, canonical_bytes

_encode = msgspec.json.Encoder().encode


def canonical_of(item: Any, table: ByteTable) -> bytes:
    """`canonical_bytes(item)`, computed once per distinct value while `table` (the daemon's
    `Interner.canonical`, bounded by bytes) holds it."""
    try:
        key = _encode(item)
    except (TypeError, ValueError, OverflowError):
        return canonical_bytes(item)  # not plain JSON: no key to find it by
    found = table.get(key)
    if found is None:
        found = table.put(key, canonical_bytes(item))
    return found
