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

_any = msgspec.json.Decoder()
# Per list field: a page's items as raw bytes, and its cursor (all `list_all` reads of a page).
_pages: dict[str, msgspec.json.Decoder[Any]] = {}


def _page_decoder(field: str) -> msgspec.json.Decoder[Any]:
    found = _pages.get(field)
    if found is None:
        page = msgspec.defstruct(
            "Page",
            [(field, list[msgspec.Raw]), ("nextCursor", Any, None)],
            kw_only=True,
        )
        found = _pages[field] = msgspec.json.Decoder(page)
    return found


class KnownItems:
    """One list's (tools/list, ...) decoded items of its last complete listing, by encoding."""

    __slots__ = ("_by_raw", "_count", "_next", "fresh")

    def __init__(self) -> None:
        self._by_raw: dict[bytes, Any] = {}
        self._next: dict[bytes, Any] = {}  # this listing's, so far
        self._count = 0  # items this listing gave so far
        # This listing's items decoded anew (the others were accepted before: the caller need
        # not check them again).
        self.fresh: list[Any] = []

    def start(self) -> None:
        self._next = {}
        self._count = 0
        self.fresh = []

    def decode(self, raw: msgspec.Raw, field: str) -> Any:
        """A page result as `list_all` reads it ({field: items, "nextCursor": ...}), with the
        items that were listed before as the objects decoded then; any other result (not an
        object, no `field` array) as `msgspec.json.decode` gives it."""
        try:
            page = _page_decoder(field).decode(raw)
        except msgspec.ValidationError:
            return _any.decode(raw)  # the caller says what is wrong with it
        items: list[msgspec.Raw] = getattr(page, field)
        # Each step one C pass over the page; only the items not listed before decode.
        keys = list(map(bytes, items))
        decoded = list(map(self._by_raw.get, keys))
        for position in [i for i, found in enumerate(decoded) if found is None]:
            key = keys[position]
            found = self._next.get(key)
            if found is None:
                found = _any.decode(key)
                self.fresh.append(found)
            decoded[position] = found
        self._next.update(zip(keys, decoded, strict=True))
        self._count += len(decoded)
        return {field: decoded, "nextCursor": page.nextCursor}

    def finish(self, accepted: tuple[Any, ...]) -> None:
        """The listing completed and these items were accepted: they are the known ones now."""
        if len(accepted) == self._count:
            self._by_raw = self._next  # every item was accepted (the common case)
        else:
            keep = set(map(id, accepted))
            self._by_raw = {k: v for k, v in self._next.items() if id(v) in keep}
        self.start()

    def __len__(self) -> int:
        return len(self._by_raw)
