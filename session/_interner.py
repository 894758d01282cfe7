"""The daemon's interner: every table that shares one object among equal values, owned.

Sessions with one settings file share their captured settings, transport identities, policy
keys, projections and aggregates, and items that did not change keep their canonical bytes.
Each of those tables used to be a module's global, with no owner and no size anyone could
read. Now the daemon makes one `Interner`, hands `interner.pool` to its `Pool` and the interner
to every `Session` and to the settings it reads; `statistics()` is in `daemonctl status --json`
("interner"). Weak tables keep a value while something else holds it, so a closed session's
entries go with it, with nothing to clear by hand.
"""

from __future__ import annotations

from typing import Any

from mcpool.pool import UNSHARED_TABLES, PoolTables
from mcpool.protocol import ByteTable, WeakTable

# Canonical bytes of items held at once (keys and values together); past it the table starts
# again (a busy server with large schemas then costs what it cost before the table, never more
# memory).
MAX_CANONICAL_BYTES = 32 * 1024 * 1024


class Interner:
    __slots__ = (
        "aggregates",
        "canonical",
        "latest",
        "policies",
        "pool",
        "projections",
        "restricted",
    )

    def __init__(
        self, *, pool: PoolTables | None = None, canonical_bytes: int = MAX_CANONICAL_BYTES
    ) -> None:
        self.pool = pool if pool is not None else PoolTables()
        # The session tables' keys and values are typed where they are read (_policy, _view,
        # _registry): those modules take this one, so it cannot name their types without an
        # import circle.
        # PolicyFields -> PolicyKey: one key per distinct policy.
        self.policies: WeakTable[Any, Any] = WeakTable()
        # ProjectionKey -> Projection: per (entry, snapshot generation, policy, name, prefix,
        # budget).
        self.projections: WeakTable[Any, Any] = WeakTable()
        # LatestKey -> Projection: per (entry, policy, names), the latest, which the next
        # snapshot's builds on.
        self.latest: WeakTable[Any, Any] = WeakTable()
        # (Projection, PolicyKey) -> Projection: a rejected part's fallback narrowed by the
        # current filters.
        self.restricted: WeakTable[Any, Any] = WeakTable()
        # AggregateKey -> Aggregate: the served lists of one set of parts.
        self.aggregates: WeakTable[Any, Any] = WeakTable()
        self.canonical = ByteTable(canonical_bytes)

    def statistics(self) -> dict[str, dict[str, int]]:
        return {
            **self.pool.statistics(),
            "policies": self.policies.statistics(),
            "projections": self.projections.statistics(),
            "latest": self.latest.statistics(),
            "restricted": self.restricted.statistics(),
            "aggregates": self.aggregates.statistics(),
            "canonical": self.canonical.statistics(),
        }


# For a session or a settings read made alone (tests, tools); the daemon makes and hands its own
# (tests/daemon/test_interner.py checks that a daemon's sessions never reach this one).
UNSHARED = Interner(pool=UNSHARED_TABLES)
