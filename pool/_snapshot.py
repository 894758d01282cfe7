"""What an entry's upstream offers at one generation: an immutable `Snapshot`.

Its own module so that the entry (pool/_entry.py), which publishes snapshots, and the snapshot
store (pool/_snapshots.py), which keeps them across restarts, both read it without importing
each other.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Snapshot(msgspec.Struct, frozen=True, weakref=True):
    """What an entry's upstream offers, at one generation. Items are decoded upstream objects,
    shared by every view and never mutated (views clone what they change)."""

    generation: int
    available: bool = False
    tools: tuple[dict[str, Any], ...] = ()
    prompts: tuple[dict[str, Any], ...] = ()
    resources: tuple[dict[str, Any], ...] = ()
    resource_templates: tuple[dict[str, Any], ...] = ()
    instructions: str | None = None
    capabilities: dict[str, Any] = msgspec.field(default_factory=dict)
    # From the snapshot store (what the server offered last time), not yet this process's own
    # discovery: the process is still starting.
    cached: bool = False
    # What the upstream listed that could not be used (malformed items, left out), one line per
    # list ("tools/list: ..."): shown by `daemonctl status` and `servers --json` (issue 15, 8).
    notes: tuple[str, ...] = ()
