"""The settings files the daemon watches, reference-counted by the sessions that read them.

Theory of operation: the watched set is the daemon's config plus every attached session's
sources. Rebuilding it from every session on each attach and detach made a mass disconnect cost
O(sessions^2); `WatchedFiles` counts how many sessions read each file instead, so an attach or
detach costs O(its own sources), and says whether the set changed (only then is the watcher,
which stats every file to plan its folders, told).
"""

from __future__ import annotations

from collections.abc import Iterable


class WatchedFiles:
    __slots__ = ("_counts", "_pinned")

    def __init__(self, pinned: Iterable[str] = ()) -> None:
        self._pinned = frozenset(pinned)  # always watched (the daemon's own config)
        self._counts: dict[str, int] = {}

    def add(self, paths: Iterable[str]) -> bool:
        """A session reads these; True when the watched set grew."""
        grew = False
        for path in paths:
            count = self._counts.get(path, 0)
            self._counts[path] = count + 1
            grew = grew or (count == 0 and path not in self._pinned)
        return grew

    def remove(self, paths: Iterable[str]) -> set[str]:
        """A session no longer reads these; returns the files nobody watches any more."""
        gone: set[str] = set()
        for path in paths:
            count = self._counts.get(path, 0) - 1
            if count > 0:
                self._counts[path] = count
                continue
            self._counts.pop(path, None)
            if path not in self._pinned:
                gone.add(path)
        return gone

    def __contains__(self, path: object) -> bool:
        return path in self._pinned or path in self._counts

    def files(self) -> set[str]:
        return set(self._pinned) | self._counts.keys()
