"""Remembered discoveries: what an entry's server offered last time, for a cold start.

Theory of operation: when an entry's discovery completes (and after each relist), the pool hands
a `StoredSnapshot` to the `SnapshotStore` it was built with; the store keeps one per transport
fingerprint. When the pool creates an entry for a fingerprint it has a stored snapshot for, the
entry publishes it at once as its first snapshot, flagged `cached`, so sessions list the server's
items before the process is up. The stored record names the server as it reported itself
(`serverInfo` name and version): when the live handshake reports another name or version, the
record is invalidated (dropped, logged) and the live discovery replaces it; either way the live
snapshot is published and the usual canonical comparison decides whether sessions hear
list_changed. The pool knows nothing of where or how records are kept (the daemon passes a store
over its cache folder; tests pass a dict).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import msgspec

from mcpool.protocol import strip_own_meta

from ._items import malformed_item
from ._snapshot import Snapshot

# A list already encoded as JSON: the pieces (the upstream's page bytes) that, joined, make it.
EncodedList = tuple[bytes | memoryview, ...]

# Bumped when the record's meaning changes: a record of another format is ignored, not decoded.
SNAPSHOT_FORMAT = 1


class StoredSnapshot(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One entry's last discovery as kept across daemon restarts (camelCase on disk)."""

    format: int = SNAPSHOT_FORMAT
    fingerprint: str
    server_name: str = msgspec.field(default="", name="serverName")
    server_version: str = msgspec.field(default="", name="serverVersion")
    era: str | None = None
    protocol_version: str | None = msgspec.field(default=None, name="protocolVersion")
    saved_at: float = msgspec.field(default=0.0, name="savedAt")  # wall clock
    # Tuples: a record made from a snapshot holds the snapshot's own (a list of 5,000 copied on
    # every list_changed was a pass over 5,000 scattered items, and a free).
    tools: tuple[dict[str, Any], ...] = ()
    prompts: tuple[dict[str, Any], ...] = ()
    resources: tuple[dict[str, Any], ...] = ()
    resource_templates: tuple[dict[str, Any], ...] = msgspec.field(
        default=(), name="resourceTemplates"
    )
    instructions: str | None = None
    capabilities: dict[str, Any] = msgspec.field(default_factory=dict)
    # What that discovery could not use (`Snapshot.notes`): a lazy server's discovery with any
    # is made again on its next start rather than served (pool/_pool.py `standby_basis`).
    notes: tuple[str, ...] = ()

    def same_content(self, other: StoredSnapshot) -> bool:
        """Equal but for when it was saved: no need to write it again."""
        return msgspec.structs.replace(self, saved_at=0.0) == msgspec.structs.replace(
            other, saved_at=0.0
        )


class SnapshotStore(Protocol):
    """Where the pool keeps discoveries. Implementations must never raise for a bad record
    (a corrupt or unreadable one is None, with a log line of their own)."""

    def load(self, fingerprint: str) -> StoredSnapshot | None: ...

    def save(
        self, record: StoredSnapshot, encoded: Mapping[str, EncodedList] | None = None
    ) -> None:
        """Keep `record`, now or soon, never holding up the caller (a file store hands it to a
        thread); `encoded`: some of its list fields (by attribute name) as JSON already (the
        pieces that, joined, make it), to be written as they are. Later saves and forgets of
        a fingerprint win over earlier ones."""

    def forget(self, fingerprint: str) -> None: ...

    def slow(self, fingerprint: str) -> bool:
        """Was this server, never seen up, not up within a first list's wait on an earlier
        run? (issue 28: it is not waited for again until it has been seen up.)"""
        ...

    def mark_slow(self, fingerprint: str, slow: bool) -> None:
        """Remember that (or, False: forget it once the server has been seen up)."""

    async def settled(self) -> None:
        """Once every save and forget asked for so far is done."""


class MemorySnapshotStore:
    """A store in a dict: tests, and a daemon run without a cache folder."""

    def __init__(self) -> None:
        self.records: dict[str, StoredSnapshot] = {}
        self.slow_ones: set[str] = set()

    def load(self, fingerprint: str) -> StoredSnapshot | None:
        return self.records.get(fingerprint)

    def save(
        self, record: StoredSnapshot, encoded: Mapping[str, EncodedList] | None = None
    ) -> None:
        self.records[record.fingerprint] = record

    def forget(self, fingerprint: str) -> None:
        self.records.pop(fingerprint, None)

    def slow(self, fingerprint: str) -> bool:
        return fingerprint in self.slow_ones

    def mark_slow(self, fingerprint: str, slow: bool) -> None:
        if slow:
            self.slow_ones.add(fingerprint)
        else:
            self.slow_ones.discard(fingerprint)

    async def settled(self) -> None:
        return


def server_identity(server_info: dict[str, Any]) -> tuple[str, str]:
    """(name, version) as the server reported them; a non-string is treated as absent."""
    name = server_info.get("name")
    version = server_info.get("version")
    return (name if isinstance(name, str) else "", version if isinstance(version, str) else "")


def invalidation(record: StoredSnapshot, server_info: dict[str, Any]) -> str | None:
    """Why a stored record no longer describes the server that answered, or None."""
    name, version = server_identity(server_info)
    if name != record.server_name:
        return f"the server's name changed ({record.server_name!r} -> {name!r})"
    if version != record.server_version:
        return f"the server's version changed ({record.server_version!r} -> {version!r})"
    return None


def to_record(
    snapshot: Snapshot,
    *,
    fingerprint: str,
    server_info: dict[str, Any],
    era: str | None,
    protocol_version: str | None,
    saved_at: float,
) -> StoredSnapshot:
    name, version = server_identity(server_info)
    return StoredSnapshot(
        fingerprint=fingerprint,
        server_name=name,
        server_version=version,
        era=era,
        protocol_version=protocol_version,
        saved_at=saved_at,
        tools=snapshot.tools,
        prompts=snapshot.prompts,
        resources=snapshot.resources,
        resource_templates=snapshot.resource_templates,
        instructions=snapshot.instructions,
        capabilities=snapshot.capabilities,
        notes=snapshot.notes,
    )


# A record's list fields and the names their lists have on the wire (`malformed_item`).
_RECORD_LISTS = (
    ("tools", "tools"),
    ("prompts", "prompts"),
    ("resources", "resources"),
    ("resource_templates", "resourceTemplates"),
)


def from_record(record: StoredSnapshot, generation: int) -> Snapshot:
    """The entry's first snapshot, from what the server offered last time (flagged cached).

    A record is a file anyone with the user's uid could have written: its items are checked
    as a live listing's are (an unusable one is left out) and lose mcpool's own `_meta` keys
    (DESIGN X9), and the record's own bytes were the upstream's."""
    lists = {attr: _usable(field, getattr(record, attr)) for attr, field in _RECORD_LISTS}
    notes = record.notes
    left_out = sum(len(getattr(record, attr)) - len(lists[attr]) for attr, _ in _RECORD_LISTS)
    if left_out:
        notes = (*notes, f"stored snapshot: {left_out} unusable item(s) left out")
    return Snapshot(
        generation=generation,
        available=True,
        cached=True,
        tools=lists["tools"],
        prompts=lists["prompts"],
        resources=lists["resources"],
        resource_templates=lists["resource_templates"],
        instructions=record.instructions,
        capabilities=record.capabilities,
        notes=notes,
    )


def _usable(field: str, items: tuple[Any, ...]) -> tuple[dict[str, Any], ...]:
    kept = tuple(i for i in items if malformed_item(field, i) is None)
    for item in kept:
        strip_own_meta(item, item=True)
    return kept
