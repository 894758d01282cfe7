"""Change sets between two shared aggregates, computed once per pair (DESIGN S4, issue 17).

Theory of operation: sessions whose views project the same snapshots share one `Aggregate`
(session/_registry.py). When an upstream's list changes, every such session moves from the same
old aggregate to the same new one, and each used to compare the two canonical forms itself:
O(sessions x items) of loop time per change. The comparison depends only on the pair, so it is
made once and remembered, keyed weakly on both aggregates (it dies with either of them).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class _Canonical(Protocol):
    @property
    def canonical(self) -> dict[str, Any]: ...


# new aggregate -> {previous aggregate -> the kinds whose canonical form differs}
_changes: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, tuple[str, ...]]] = (
    weakref.WeakKeyDictionary()
)


def change_set(
    previous: _Canonical,
    new: _Canonical,
    kinds: Sequence[str],
    known: Mapping[str, bool] | None = None,
) -> tuple[str, ...]:
    """The kinds (of `kinds`, in that order) whose canonical form differs between the two;
    `known`: kinds already known equal (True) or not, by how one was made from the other."""
    if previous is new:
        return ()
    from_new = _changes.get(new)
    if from_new is None:
        from_new = _changes[new] = weakref.WeakKeyDictionary()
    found = from_new.get(previous)
    if found is None:
        same = known or {}
        found = tuple(
            k
            for k in kinds
            if not (same[k] if k in same else new.canonical[k] == previous.canonical[k])
        )
        from_new[previous] = found
    return found
