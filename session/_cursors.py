"""Page cursors that name the list they were cut from (issue 29 item 6).

A cursor is issued for one page boundary of one list: the immutable list object a session
served (its registry generation's aggregate for that kind and policy), and an offset into it.
A later page with that cursor is cut from the same list, so a walk never mixes two lists nor
skips an item a change moved; once the list is gone from the book (bounded in number and in
time), the cursor is refused with an error telling the client to list again, naming the
cursor. The book is an object the daemon owns and hands to its sessions (no process-global
table); `statistics()` says how much it holds.

Cursors are opaque to clients: `c:<list>:<offset>` in URL-safe base64, where `<list>` is a
number the book gave the list. A cursor the book never issued does not decode to one it knows
and is refused the same way.
"""

from __future__ import annotations

import base64
import binascii
import collections
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

# Lists kept for their cursors (the newest); a walk over a list older than this many served
# lists, or older than LIST_TTL, lists again.
MAX_LISTS = 1024
LIST_TTL = 300.0
MAX_CURSOR_CHARS = 256

L = TypeVar("L")

# List numbers are unique across books: a page cached on a shared list names its list by
# number, and no other book's list has that number.
_numbers = itertools.count(1)


class CursorError(ValueError):
    """The cursor names no list the book holds: the message says what to do."""


@dataclass(slots=True)
class _Kept(Generic[L]):
    number: int
    served: L
    at: float


class CursorBook(Generic[L]):
    def __init__(
        self,
        clock: Callable[[], float],
        *,
        max_lists: int = MAX_LISTS,
        ttl: float = LIST_TTL,
    ) -> None:
        self._clock = clock
        self._max = max_lists
        self._ttl = ttl
        self._by_number: collections.OrderedDict[int, _Kept[L]] = collections.OrderedDict()
        self._by_list: dict[int, int] = {}  # id(list) -> its number
        self.issued = 0
        self.refused = 0

    def number(self, served: L) -> int:
        """The number of `served` in the book, kept (and its time renewed) for its cursors."""
        number = self._by_list.get(id(served))
        kept = self._by_number.get(number) if number is not None else None
        if kept is None or kept.served is not served:
            number = next(_numbers)
            kept = _Kept(number, served, self._clock())
            self._by_number[number] = kept
            self._by_list[id(served)] = number
            self._trim()
        else:
            kept.at = self._clock()
            self._by_number.move_to_end(kept.number)
        return kept.number

    def cursor_at(self, number: int, offset: int) -> str:
        """The cursor of list `number` at `offset`."""
        self.issued += 1
        return base64.urlsafe_b64encode(f"c:{number}:{offset}".encode()).decode()

    def cursor(self, served: L, offset: int) -> str:
        """The cursor of `served` at `offset` (the list is kept for it)."""
        return self.cursor_at(self.number(served), offset)

    def page(self, cursor: object) -> tuple[L, int, int]:
        """The list `cursor` was cut from, the offset of its next page and the list's number."""
        number, offset = self._parse(cursor)
        kept = self._by_number.get(number)
        if kept is None or self._clock() - kept.at > self._ttl:
            self.refused += 1
            raise CursorError(
                f"cursor {str(cursor)[:64]!r} is from a list that changed or expired: "
                "list again from the start"
            )
        return kept.served, offset, number

    def lookup(self, cursor: object) -> tuple[L, int, int] | None:
        """`page` without the error, or the count of one (a fast path that leaves what it
        cannot serve to the general path, which says why)."""
        try:
            number, offset = self._decode(cursor)
        except (ValueError, UnicodeDecodeError, binascii.Error):
            return None
        kept = self._by_number.get(number)
        if kept is None or self._clock() - kept.at > self._ttl:
            return None
        return kept.served, offset, number

    @staticmethod
    def _decode(cursor: object) -> tuple[int, int]:
        if not isinstance(cursor, str) or len(cursor) > MAX_CURSOR_CHARS:
            raise ValueError("not a string of a cursor's size")
        tag, number, offset = base64.urlsafe_b64decode(cursor.encode()).decode().split(":")
        if tag != "c" or not number.isdigit() or not offset.isdigit():
            raise ValueError(tag)
        return int(number), int(offset)

    def _parse(self, cursor: object) -> tuple[int, int]:
        try:
            return self._decode(cursor)
        except (ValueError, UnicodeDecodeError, binascii.Error):
            self.refused += 1
            raise CursorError(
                f"invalid cursor {str(cursor)[:64]!r}: not a cursor mcpool issued"
            ) from None

    def _trim(self) -> None:
        now = self._clock()
        while self._by_number:
            oldest = next(iter(self._by_number.values()))
            if len(self._by_number) <= self._max and now - oldest.at <= self._ttl:
                break
            del self._by_number[oldest.number]
            if self._by_list.get(id(oldest.served)) == oldest.number:
                del self._by_list[id(oldest.served)]

    def statistics(self) -> dict[str, int]:
        return {"lists": len(self._by_number), "issued": self.issued, "refused": self.refused}
