"""Tables made from the table before them by replacing a few entries (issue 17).

Theory of operation: when one tool of 5,000 changes, the session side derives each per-projection
table (canonical bytes by exposed name, validated names by folded name) from the previous
projection's. A copy of a 5,000-entry dict is a write to every one of its keys and values, 10,000
objects scattered over the heap, and its free later another; most of these tables are then only
read for the few entries that changed, by the next change. A `PatchedTable` keeps the table it
was made from and the entries that differ, and reads through them. It is made whole (one copy,
kept) only when it is asked for whole (compared, merged, iterated) or when the chain of tables it
reads through would grow past `MAX_DEPTH`, so a relist costs a copy only one time in `MAX_DEPTH`
and a lookup at most `MAX_DEPTH` small dict lookups.

Tables are immutable once made, as the dicts they replace were: a base is shared by every table
made from it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

_V = TypeVar("_V")

# Tables read through before one is made whole: each lookup of an unchanged entry walks them.
MAX_DEPTH = 8

_MISSING: Any = object()


class PatchedTable(Mapping[str, _V]):
    """`base` without the keys `gone` and with the entries `came` (which may reuse a gone key)."""

    __slots__ = ("_base", "_came", "_depth", "_gone", "_len", "_whole")
    _depth: int

    def __init__(
        self,
        base: Mapping[str, _V],
        gone: frozenset[str],
        came: dict[str, _V],
        size: int,
    ) -> None:
        self._whole: dict[str, _V] | None = None
        self._base = base
        self._gone = gone
        self._came = came
        self._len = size
        self._depth = base._depth + 1 if isinstance(base, PatchedTable) else 1
        if self._depth > MAX_DEPTH:
            self.whole()

    def get(self, key: str, default: Any = None) -> Any:
        table: Mapping[str, _V] = self
        while isinstance(table, PatchedTable):
            if table._whole is not None:
                return table._whole.get(key, default)
            found = table._came.get(key, _MISSING)
            if found is not _MISSING:
                return found
            if key in table._gone:
                return default
            table = table._base
        return table.get(key, default)

    def __getitem__(self, key: str) -> _V:
        found = self.get(key, _MISSING)
        if found is _MISSING:
            raise KeyError(key)
        return found  # type: ignore[no-any-return]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key, _MISSING) is not _MISSING

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[str]:
        return iter(self.whole())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PatchedTable):
            other = other.whole()
        return self.whole() == other

    __hash__ = None  # type: ignore[assignment]  # (as a dict's: a table is not a key)

    def whole(self) -> dict[str, _V]:
        """The table as one dict, made once: the nearest whole table it reads through copied,
        and the patches since applied in order (the tables between are not made whole)."""
        if self._whole is None:
            chain: list[PatchedTable[_V]] = []
            table: Mapping[str, _V] = self
            while isinstance(table, PatchedTable) and table._whole is None:
                chain.append(table)
                table = table._base
            # copy(), not dict(): a table patched before has deleted slots, and dict() of such
            # a dict inserts entry by entry (10x the C copy copy() still makes).
            out = whole(table).copy()
            for step in reversed(chain):
                for key in step._gone:
                    out.pop(key, None)
                out.update(step._came)
            self._whole = out
            # (The chain is no longer read: it may go, and a table made from this one reads
            # through one table, not this one's chain.)
            self._base, self._gone, self._came = out, frozenset(), {}
            self._depth = 0
        return self._whole


def whole(table: Mapping[str, _V]) -> dict[str, _V]:
    """`table` as a dict: itself when it is one."""
    return table.whole() if isinstance(table, PatchedTable) else table  # type: ignore[return-value]


def patched(
    table: Mapping[str, _V],
    gone: Iterable[str],
    came: Iterable[tuple[str, _V]],
    size: int,
) -> Mapping[str, _V] | None:
    """`table` without the keys `gone` and then with the entries `came`, when the result has
    `size` entries (else None: the caller computes it whole)."""
    removed = frozenset(gone)
    added = dict(came)
    kept = len(table) - sum(1 for key in removed if key in table)
    new = sum(1 for key in added if key in removed or key not in table)
    if kept + new != size:
        return None
    return PatchedTable(table, removed - added.keys(), added, size)


def patched_by(
    table: Mapping[str, _V],
    before: Iterable[Any],
    after: Iterable[Any],
    key: Callable[[Any], str],
    value: Callable[[Any], _V],
    size: int,
) -> Mapping[str, _V] | None:
    """`patched` for a table of one entry per item: the entries of the items `before` replaced
    by those of the items `after`, keyed by `key` of an item."""
    return patched(table, map(key, before), ((key(item), value(item)) for item in after), size)
