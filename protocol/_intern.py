"""Interning tables: one object per distinct value while something holds it (`WeakTable`), and
a table bounded by the bytes it holds (`ByteTable`). Each counts what it holds and how often it
was asked, so its owner can report it (`daemonctl status --json`: "interner").

They are owned: the daemon makes one `Interner` (session/_interner.py) of them and hands it to
the pool and its sessions; nothing here is a process-global.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class WeakTable(Generic[K, V]):
    """Values by key, each kept while something else holds it (a weak value)."""

    __slots__ = ("_table", "interned", "refs")

    def __init__(self) -> None:
        self._table: weakref.WeakValueDictionary[K, V] = weakref.WeakValueDictionary()
        # The weak references themselves, for a hot path's lookup: one dictionary lookup and
        # one call (the weak dictionary's own `get` is a Python frame more).
        self.refs: dict[K, Callable[[], V | None]] = self._table.data  # type: ignore[attr-defined]
        self.interned = 0  # values put, ever

    def get(self, key: K) -> V | None:
        ref = self.refs.get(key)
        return None if ref is None else ref()

    def put(self, key: K, value: V) -> V:
        self._table[key] = value
        self.interned += 1
        return value

    def intern(self, key: K, value: V) -> V:
        """The value held for `key`, else `value`, now held."""
        found = self.get(key)
        return self.put(key, value) if found is None else found

    def values(self) -> list[V]:
        return list(self._table.values())

    def clear(self) -> None:
        self._table.clear()

    def __len__(self) -> int:
        return len(self._table)

    def statistics(self) -> dict[str, int]:
        return {"entries": len(self._table), "interned": self.interned}


class ByteTable:
    """Bytes by bytes, bounded by the bytes held (keys and values): past `limit` it starts
    again (what it spares is recomputed, never more memory held)."""

    __slots__ = ("_table", "held", "interned", "limit", "resets")

    def __init__(self, limit: int) -> None:
        self._table: dict[bytes, bytes] = {}
        self.limit = limit
        self.held = 0
        self.interned = 0
        self.resets = 0

    def get(self, key: bytes) -> bytes | None:
        return self._table.get(key)

    def put(self, key: bytes, value: bytes) -> bytes:
        size = len(key) + len(value)
        if self.held + size > self.limit:
            self._table.clear()
            self.held = 0
            self.resets += 1
        self._table[key] = value
        self.held += size
        self.interned += 1
        return value

    def __len__(self) -> int:
        return len(self._table)

    def statistics(self) -> dict[str, int]:
        return {
            "entries": len(self._table),
            "interned": self.interned,
            "bytes": self.held,
            "limit": self.limit,
            "resets": self.resets,
        }
