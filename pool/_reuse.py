"""Listed items decoded once while their encoding stays the same (issue 17).

Theory of operation: an upstream that says list_changed lists everything again, and when one of
its 5,000 tools changed, decoding the whole list gave 5,000 new objects, so everything derived
from them downstream (projections, canonical forms, encoded pages) was computed again for items
that did not change. `KnownItems` keeps one list's pages of the last complete listing: each
page's encoding, where each item lies in it, and the objects decoded from it.

A page that comes again is compared with the page at the same position of the last listing,
bytes against bytes (C comparisons, a block at a time): the items inside the common start and
the common end are the objects decoded then, and only the bytes between are parsed (`_delta`).
The common start is cut at the end of an item followed by one more equal byte, so the parser's
state there is the same in both encodings. The rest is decoded as a document of its own: the
page's head, one placeholder for the items before, the changed bytes, one placeholder for the
items after and the page's tail. That document is the page with each run of unchanged items
replaced by one value, so it parses as the page does; the common end counts only when the
second placeholder is the last item of the list, i.e. the unchanged items after it are where the
last listing had them. When there is no common start (the head changed, a first listing), the
page is split whole and its items looked up by their exact encoding among the last listing's.
Equal bytes decode to equal values, so the snapshot holds the same values as a full decode; only
their identity is kept, which is what lets the session side (session/_view.py,
session/_registry.py) skip the unchanged ones.

Only items the pool accepted count as known (`finish`): an item it left out is decoded again and
is `fresh` again next time (the pool checks it again). Only the last complete listing is kept,
so a failed listing leaves the table as it was.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from array import array
from typing import Any, NamedTuple, TypeVar

import msgspec

from mcpool.protocol import may_carry_own_meta, strip_own_meta

_any = msgspec.json.Decoder()
_items = msgspec.json.Decoder(list[msgspec.Raw])
# Per list field: a page's items as raw bytes and its cursor, and the same with the items as
# one raw array (to find where they lie).
_pages: dict[str, tuple[msgspec.json.Decoder[Any], msgspec.json.Decoder[Any]]] = {}
# Bytes compared at once while looking for where two encodings of a page part.
_BLOCK = 16384
_PLACEHOLDER = b"0"
_T = TypeVar("_T")


def _decode_item(key: bytes) -> Any:
    """One listed item decoded from its encoding, without the `_meta` keys that are mcpool's
    alone (DESIGN X9: protocol/_meta.py): once per new encoding, for every view of the entry
    (an unchanged item is the object decoded before, stripped then)."""
    item = _any.decode(key)
    if may_carry_own_meta(key, item=True):
        strip_own_meta(item, item=True)
    return item


def _page_decoders(field: str) -> tuple[msgspec.json.Decoder[Any], msgspec.json.Decoder[Any]]:
    found = _pages.get(field)
    if found is None:
        items = msgspec.defstruct(
            "Page", [(field, list[msgspec.Raw]), ("nextCursor", Any, None)], kw_only=True
        )
        whole = msgspec.defstruct(
            "PageArray", [(field, msgspec.Raw), ("nextCursor", Any, None)], kw_only=True
        )
        found = _pages[field] = (msgspec.json.Decoder(items), msgspec.json.Decoder(whole))
    return found


class _Page(NamedTuple):
    """One page as listed: its encoding, each item's offsets in it and encoding (to look the
    items up by when a page is split whole), its objects and cursor. Pages are immutable: the
    last listing's stay as they were until the next listing completes."""

    data: bytes
    # Offsets as machine integers ("q"): an array is copied and spliced without touching 5,000
    # int objects scattered over the heap (each touch of one a likely cache miss).
    starts: array[int]
    ends: array[int]
    # The items' encodings when the offsets are not known (else they are `data` at the offsets,
    # sliced when asked for: a list of 5,000 kept for each page cost a copy per relist).
    keys: list[bytes] | None
    # A tuple: a listing of one page is this very tuple (`list_all`), with no copy.
    items: tuple[Any, ...]
    cursor: Any


def _common_prefix(a: bytes, b: bytes) -> int:
    """How many leading bytes `a` and `b` share."""
    limit = min(len(a), len(b))
    other = memoryview(b)
    at = 0
    step = _BLOCK  # doubled after each equal block: a 530 KB page in 6 comparisons, not 33
    while at + step <= limit and a.startswith(other[at : at + step], at):
        at += step
        step *= 2
    while step > _BLOCK and at + step > limit:
        step //= 2  # (the end is near: the last blocks at the usual size)
    while at + step <= limit and a.startswith(other[at : at + step], at):
        at += step
    high = min(at + step, limit)
    while at < high:
        mid = (at + high + 1) // 2
        if a.startswith(other[at:mid], at):
            at = mid
        else:
            high = mid - 1
    return at


def _common_suffix(a: bytes, b: bytes, limit: int) -> int:
    """How many trailing bytes `a` and `b` share, at most `limit`."""
    la, lb = len(a), len(b)
    other = memoryview(b)
    size = 0
    while size + _BLOCK <= limit and a.endswith(
        other[lb - size - _BLOCK : lb - size], 0, la - size
    ):
        size += _BLOCK
    high = min(size + _BLOCK, limit)
    while size < high:
        mid = (size + high + 1) // 2
        if a.endswith(other[lb - mid : lb - size], 0, la - size):
            size = mid
        else:
            high = mid - 1
    return size


def _offsets(data: bytes, keys: list[bytes], start: int) -> tuple[array[int], array[int]]:
    """Where each of `keys` (consecutive items, separated only by commas and blanks, the first
    at or after `start`) lies in `data`. A JSON value starts with neither, so each item is the
    first match after the previous one."""
    starts: array[int] = array("q")
    ends: array[int] = array("q")
    find = data.find
    at = start
    for key in keys:
        at = find(key, at)
        starts.append(at)
        at += len(key)
        ends.append(at)
    return starts, ends


def _array_offsets(
    data: bytes, keys: list[bytes], at: int, size: int
) -> tuple[array[int], array[int]]:
    """Where the items `keys` of the array at `at` (`size` bytes) lie in `data`. An array as
    long as its items and one comma between each (compact JSON, what most servers send) has
    no blank anywhere, so its offsets are running sums (C passes); else each is searched."""
    lengths = list(map(len, keys))
    if size != 2 + sum(lengths) + max(len(keys) - 1, 0):
        return _offsets(data, keys, at + 1)
    ends = array(
        "q", itertools.accumulate(map(operator.add, lengths, itertools.repeat(1)), initial=at)
    )
    del ends[0]
    return array("q", map(operator.sub, ends, lengths)), ends


def spliced(old: tuple[_T, ...], first: int, last: int, middle: tuple[_T, ...]) -> tuple[_T, ...]:
    """`old` with items first..last replaced by `middle`. Slices concatenated: each unchanged
    item is referenced about three times (unpacked into a list, about five), and each reference
    is a write to an object somewhere on the heap, the main cost with 5,000 items (issue 17)."""
    return old[:first] + middle + old[last:]


def _keys(page: _Page, first: int, last: int) -> list[bytes]:
    """The encodings of items first..last of `page`."""
    if page.keys is not None:
        return page.keys[first:last]
    data = page.data
    return [data[a:b] for a, b in zip(page.starts[first:last], page.ends[first:last], strict=True)]


def _moved(old: array[int], first: int, last: int, middle: array[int], shift: int) -> array[int]:
    """`old` offsets with first..last replaced by `middle`, and the ones after them moved by
    `shift` (they move with the change)."""
    out = old[:]
    out[first:last] = middle
    if shift and last < len(old):
        out[len(out) - (len(old) - last) :] = array("q", map(shift.__add__, old[last:]))
    return out


class KnownItems:
    """One list's (tools/list, ...) decoded items of its last complete listing, by page."""

    __slots__ = ("_count", "_ends", "_kept", "_listed", "_next", "_pages", "_unaccepted", "fresh")

    def __init__(self) -> None:
        self._pages: list[_Page] = []  # the last complete listing's
        self._next: list[_Page] = []  # this listing's, so far
        # Ids of the objects in `_pages` the pool left out: decoded (and checked) again.
        self._unaccepted: set[int] = set()
        self._count = 0  # items this listing gave so far
        # What the last listing gave, when it is every item of `_pages` (see `encoded`).
        self._listed: tuple[Any, ...] | None = None
        # Per page of this listing: how many items at its start and end are the very objects
        # of the last listing's page at the same position, and whether all of them are.
        self._ends: list[tuple[int, int, bool]] = []
        # The listing before `_listed` and how many items both share at the start and the end
        # (see `kept`).
        self._kept: tuple[tuple[Any, ...], int, int] | None = None
        # This listing's items decoded anew (the others were accepted before: the caller need
        # not check them again).
        self.fresh: list[Any] = []

    def start(self) -> None:
        self._next = []
        self._ends = []
        self._count = 0
        self.fresh = []

    def decode(self, raw: msgspec.Raw, field: str) -> Any:
        """A page result as `list_all` reads it ({field: items, "nextCursor": ...}), with the
        items that were listed before as the objects decoded then; any other result (not an
        object, no `field` array) as `msgspec.json.decode` gives it."""
        data = bytes(raw)
        index = len(self._next)
        old = self._pages[index] if index < len(self._pages) else None
        page = None
        ends = (0, 0, False)
        if old is not None:
            delta = self._delta(old, data, field)
            if delta is not None:
                page, ends = delta
        if page is None:
            page = self._split(data, field)
            if page is None:
                return _any.decode(data)  # the caller says what is wrong with it
        elif self._unaccepted:
            page = self._recheck(page)
            ends = (0, 0, False)  # (rechecked items are new objects: told as none shared)
        self._next.append(page)
        self._ends.append(ends)
        self._count += len(page.items)
        return {field: page.items, "nextCursor": page.cursor}

    def _delta(
        self, old: _Page, data: bytes, field: str
    ) -> tuple[_Page, tuple[int, int, bool]] | None:
        """`data` as `old` with only the bytes between their common start and end parsed, and
        how many items at its start and end are `old`'s, and whether all are (`old` itself when
        the bytes are the same); None when they share no item at the start (the caller splits
        it whole)."""
        n = len(old.items)
        common = _common_prefix(data, old.data)
        if common == len(data) == len(old.data):
            return old, (n, 0, True)  # (told by the one pass that finds where they part)
        head = bisect.bisect_left(old.ends, common)  # items ending before the first difference
        if head == 0:
            return None
        shift = len(data) - len(old.data)
        rest = min(len(data), len(old.data)) - common
        tail = n - bisect.bisect_right(
            old.starts, len(old.data) - _common_suffix(data, old.data, rest)
        )
        cut = old.ends[head - 1]  # where the changed bytes begin, in both
        lead = data[: old.starts[0]] + _PLACEHOLDER
        decoder = _page_decoders(field)[0]
        parsed = None
        if tail:
            back = old.starts[n - tail] + shift  # where the unchanged end begins, in `data`
            after = old.ends[n - 1] + shift
            document = lead + data[cut:back] + _PLACEHOLDER + data[after:]
            try:
                parsed = decoder.decode(document)
            except msgspec.DecodeError:
                parsed = None
            found = getattr(parsed, field) if parsed is not None else []
            if len(found) < 2 or bytes(found[-1]) != _PLACEHOLDER:
                parsed, tail = None, 0  # the end is not where it was: parse it all
        if parsed is None:
            try:
                parsed = decoder.decode(lead + data[cut:])
            except msgspec.DecodeError:
                return None
        found = getattr(parsed, field)
        if not found or bytes(found[0]) != _PLACEHOLDER:
            return None
        keys = list(map(bytes, found[1 : len(found) - 1 if tail else len(found)]))
        starts, ends = _offsets(data, keys, cut)
        known = self._lookup(old, head, n - tail) if keys else {}
        middle = tuple([self._item(key, known) for key in keys])
        page = _Page(
            data,
            _moved(old.starts, head, n - tail, starts, shift),
            _moved(old.ends, head, n - tail, ends, shift),
            None,
            spliced(old.items, head, n - tail, middle),
            parsed.nextCursor,
        )
        return page, (head, tail, False)

    def _split(self, data: bytes, field: str) -> _Page | None:
        """`data` split whole; its items looked up among the last listing's, by encoding."""
        items_decoder, whole_decoder = _page_decoders(field)
        try:
            page = items_decoder.decode(data)
        except msgspec.ValidationError:
            return None
        keys = list(map(bytes, getattr(page, field)))
        # Compact JSON (what most servers send): the array is its items joined by commas.
        joined = b"".join((b"[", b",".join(keys), b"]"))
        at = data.find(joined)
        if at < 0:  # blanks in it: found as the decoder sees it (one more pass)
            joined = bytes(getattr(whole_decoder.decode(data), field))
            at = data.find(joined)
        if at < 0 or data.find(joined, at + 1) >= 0:
            # Not found once (the array's text also elsewhere): no offsets, so next time this
            # page is split whole again.
            starts: array[int] = array("q")
            ends: array[int] = array("q")
        else:
            starts, ends = _array_offsets(data, keys, at, len(joined))
        known: dict[bytes, Any] = {}
        for listed in self._pages:
            known.update(self._lookup(listed, 0, len(listed.items)))
        decoded = list(map(known.get, keys))
        fresh = self.fresh
        for position in [i for i, found in enumerate(decoded) if found is None]:
            key = keys[position]
            found = known.get(key)
            if found is None:
                found = known[key] = _decode_item(key)
                fresh.append(found)
            decoded[position] = found
        if not starts and keys:
            # Never compared (no offsets): its encodings are kept to look its items up by.
            return _Page(b"", starts, ends, keys, tuple(decoded), page.nextCursor)
        return _Page(data, starts, ends, None, tuple(decoded), page.nextCursor)

    def _lookup(self, page: _Page, first: int, last: int) -> dict[bytes, Any]:
        """Items first..last of `page` by their encoding, the accepted ones only."""
        pairs = zip(_keys(page, first, last), page.items[first:last], strict=True)
        unaccepted = self._unaccepted
        if not unaccepted:
            return dict(pairs)
        return {key: item for key, item in pairs if id(item) not in unaccepted}

    def _item(self, key: bytes, known: dict[bytes, Any]) -> Any:
        found = known.get(key)
        if found is None:
            found = known[key] = _decode_item(key)
            self.fresh.append(found)
        return found

    def _recheck(self, page: _Page) -> _Page:
        """`page` with the items the pool left out last time decoded (and checked) again."""
        unaccepted = self._unaccepted
        again = [i for i, item in enumerate(page.items) if id(item) in unaccepted]
        if not again:
            return page
        items = list(page.items)
        for i in again:
            items[i] = _decode_item(_keys(page, i, i + 1)[0])
            self.fresh.append(items[i])
        return page._replace(items=tuple(items))

    def finish(self, accepted: tuple[Any, ...]) -> None:
        """The listing completed and these items were accepted: they are the known ones now."""
        before, self._listed, self._kept = self._listed, None, None
        if len(accepted) == self._count:
            self._unaccepted = set()  # every item was accepted (the common case)
            self._listed = accepted
            if before is not None:
                self._kept = (before, *self._shared_ends(len(self._pages)))
        else:
            keep = set(map(id, accepted))
            self._unaccepted = {
                id(item) for page in self._next for item in page.items if id(item) not in keep
            }
        self._pages = self._next
        self.start()

    def _shared_ends(self, pages_before: int) -> tuple[int, int]:
        """How many items at the start and at the end of this listing are the very objects of
        the last one's, from each page's: the pages kept whole, then the first (last) page not
        kept whole's own. The end counts only when both listings have as many pages (pages
        from the end are then the same pages)."""
        head = 0
        for (start, _, whole), page in zip(self._ends, self._next, strict=True):
            head += len(page.items) if whole else start
            if not whole:
                break
        tail = 0
        if head < self._count and len(self._next) == pages_before:
            for (_, end, whole), page in zip(
                reversed(self._ends), reversed(self._next), strict=True
            ):
                tail += len(page.items) if whole else end
                if not whole:
                    break
        return head, tail

    def kept(self, listed: tuple[Any, ...]) -> tuple[tuple[Any, ...], int, int] | None:
        """For `listed` (what the last listing gave, when every item was accepted): the
        listing before it (likewise) and how many items at the start and at the end of
        `listed` are the very objects at the same ends of that one (they never overlap);
        None when it is not that listing or the one before was not complete."""
        return self._kept if listed is self._listed else None

    def encoded(self, listed: tuple[Any, ...]) -> msgspec.Raw | None:
        """`listed` (what the last listing gave: every item of its pages) as a JSON array made
        of the pages' own bytes (one copy, no encoding; it decodes to equal values), or None
        when it is not that listing or a page's items were not located."""
        parts = self.encoded_parts(listed)
        return None if parts is None else msgspec.Raw(b"".join(parts))

    def encoded_parts(self, listed: tuple[Any, ...]) -> tuple[bytes | memoryview, ...] | None:
        """`encoded(listed)` as the pieces that make it, views of the pages' bytes (no copy:
        a writer writes them as they are)."""
        if listed is not self._listed or not all(p.starts for p in self._pages if p.items):
            return None
        parts: list[bytes | memoryview] = [b"["]
        for page in self._pages:
            if page.items:
                if len(parts) > 1:
                    parts.append(b",")
                parts.append(memoryview(page.data)[page.starts[0] : page.ends[-1]])
        parts.append(b"]")
        return tuple(parts)

    def __len__(self) -> int:
        return sum(len(page.items) for page in self._pages) - len(self._unaccepted)
