"""What an entry's sessions share at its upstream, counted as it changes (P6, logging levels).

Theory of operation: a shared upstream logs at the most verbose level any of its sessions asked
for, and is subscribed to a resource while any session is. Recomputing either from every handle
made each detach cost O(sessions), so a mass disconnect cost O(sessions^2) of loop time. Instead
each entry keeps `SharedCounts`: how many of its handles asked for each level, and how many hold
each subscription. Handles update it when their level or subscriptions change and when they
join or leave the entry, so every read is O(levels) or O(1) whatever the number of sessions.
"""

from __future__ import annotations

from collections.abc import Iterable

# RFC 5424 severities as MCP names them, most verbose first (pool/_entry.py LOG_LEVELS).
_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


class SharedCounts:
    __slots__ = ("_levels", "_uris")

    def __init__(self) -> None:
        self._levels = [0] * len(_LEVELS)
        self._uris: dict[str, int] = {}

    # -- log levels ------------------------------------------------------------------------------

    def move_level(self, before: str | None, after: str | None) -> None:
        """One handle's level changed (None: none asked for, or the handle left/joined)."""
        if before in _LEVELS:
            self._levels[_LEVELS.index(before)] -= 1
        if after in _LEVELS:
            self._levels[_LEVELS.index(after)] += 1

    def effective_level(self) -> str | None:
        """The most verbose level any handle asked for."""
        for level, count in zip(_LEVELS, self._levels, strict=True):
            if count:
                return level
        return None

    # -- subscriptions ---------------------------------------------------------------------------

    def hold(self, uri: str) -> bool:
        """One more holder; True when it is the first (the upstream must be told)."""
        count = self._uris.get(uri, 0)
        self._uris[uri] = count + 1
        return count == 0

    def drop(self, uri: str) -> bool:
        """One holder fewer; True when it was the last (the upstream must be told)."""
        count = self._uris.get(uri, 0) - 1
        if count > 0:
            self._uris[uri] = count
            return False
        self._uris.pop(uri, None)
        return True

    def held(self, uri: str) -> bool:
        return uri in self._uris

    def uris(self) -> set[str]:
        return set(self._uris)

    # -- a handle joining or leaving -------------------------------------------------------------

    def join(self, level: str | None, uris: Iterable[str]) -> None:
        self.move_level(None, level)
        for uri in uris:
            self.hold(uri)

    def leave(self, level: str | None, uris: Iterable[str]) -> list[str]:
        """The handle's share goes; returns the URIs nobody holds any more."""
        self.move_level(level, None)
        return [uri for uri in uris if self.drop(uri)]
