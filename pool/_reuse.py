"""Listed items decoded once while their encoding stays the same (issue 17).

Theory of operation: an upstream that says list_changed lists everything again, and when one of
its 5,000 tools changed, decoding the whole list gave 5,000 new objects, so everything derived
from them downstream (projections, canonical forms, encoded pages) was computed again for items
that did not change. `KnownItems` keeps one list's items of the last complete listing by their
exact encoding: a page is decoded to its items' raw bytes (one C pass), and an item whose bytes
were listed before is the object decoded then. Equal bytes decode to equal values, so the
snapshot holds the same values as a full decode; only their identity is kept, which is what lets
the session side (session/_view.py, session/_registry.py) skip the unchanged ones.

Only items the pool accepted are kept (`finish`), and only from the last complete listing, so
the table is as large as the list itself and a failed listing leaves it as it was.
"""

from __future__ import annotations

from typing import Any

import msgspec

_fields = msgspec.json.Decoder(dict[str, msgspec.Raw])
_items = msgspec.json.Decoder(list[msgspec.Raw])
_any = msgspec.json.Decoder()


class KnownItems:
    """One list's (tools/list, ...) decoded items of its last complete listing, by encoding."""

    __slots__ = ("_by_raw", "_next", "reused")

    def __init__(self) -> None:
        self._by_raw: dict[bytes, Any] = {}
        self._next: dict[bytes, Any] = {}  # this listing's, so far
        # ids of this listing's items that were accepted before (held by `_by_raw`): the
        # caller need not check them again.
        self.reused: set[int] = set()

    def start(self) -> None:
        self._next = {}
        self.reused = set()

    def decode(self, raw: msgspec.Raw, field: str) -> Any:
        """A page result, as `msgspec.json.decode` gives it, with the `field` array's items
        that were listed before as the objects decoded then."""
        try:
            top = _fields.decode(raw)
        except msgspec.ValidationError:
            return _any.decode(raw)  # not an object: the caller says what is wrong with it
        out: dict[str, Any] = {}
        for name, value in top.items():
            if name != field:
                out[name] = _any.decode(value)
                continue
            try:
                items = _items.decode(value)
            except msgspec.ValidationError:
                out[name] = _any.decode(value)
                continue
            known, seen, reused = self._by_raw, self._next, self.reused
            decoded = []
            for item in items:
                key = bytes(item)
                found = known.get(key)
                if found is not None:
                    reused.add(id(found))
                else:
                    found = seen.get(key)
                    if found is None:
                        found = _any.decode(key)
                seen[key] = found
                decoded.append(found)
            out[name] = decoded
        return out

    def finish(self, accepted: tuple[Any, ...]) -> None:
        """The listing completed and these items were accepted: they are the known ones now."""
        keep = {id(item) for item in accepted}
        self._by_raw = {k: v for k, v in self._next.items() if id(v) in keep}
        self._next = {}
        self.reused = set()

    def __len__(self) -> int:
        return len(self._by_raw)
