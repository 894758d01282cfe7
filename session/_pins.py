"""Pins: the definition of each tool (and prompt) of a server as first served, and what to do
when a later discovery differs (issue 30). Pure: the daemon loads and saves the book
(daemon/_pinstore.py) and the session applies `judge`'s verdicts to what it serves.

A pin is the SHA-256 of a definition's canonical form (protocol/_canonical.py: keys sorted,
arrays in order but for `required`, `type` and `enum`) over what the model reads: name, title,
description, input and output schema, annotations (a prompt: name, title, description,
arguments). Pins are kept per settings file and server name: the same server configured in two
projects is pinned in each. The definition itself is kept beside its digest, so a change can be
shown as a diff.

`judge` compares a server's current items with its pins: an item never seen is NEW (pinned on
first sight); one equal to its pin is KEPT; one that differs is CHANGED, and what the session
does with it follows the pinning mode: "warn" serves the new definition and says so, "hold"
serves neither (until `daemonctl approve` re-pins it), "off" serves it and keeps no pins.
"""

from __future__ import annotations

import difflib
import enum
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from mcpool.pool import PinningMode
from mcpool.protocol import canonical_bytes

if TYPE_CHECKING:
    from mcpool.pool import Snapshot

DEFAULT_PINNING: PinningMode = "warn"
# What of a definition is pinned (what the model reads), by kind.
PINNED_FIELDS = {
    "tool": ("name", "title", "description", "inputSchema", "outputSchema", "annotations"),
    "prompt": ("name", "title", "description", "arguments"),
}
# Changes remembered per server for `daemonctl changes` (pending ones are never dropped).
RECENT_CHANGES = 50


class Verdict(enum.Enum):
    NEW = "new"
    KEPT = "kept"
    CHANGED = "changed"


def pinned_part(kind: str, item: Mapping[str, Any]) -> dict[str, Any]:
    return {k: item[k] for k in PINNED_FIELDS[kind] if k in item}


def digest(kind: str, item: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_bytes(pinned_part(kind, item), schema=True)).hexdigest()


@dataclass(frozen=True, slots=True)
class Pin:
    digest: str
    definition: dict[str, Any]  # the pinned part, as first served
    since: float  # when it was pinned (unix time)


@dataclass(slots=True)
class Change:
    """A definition that differs from its pin; pending until approved (or until the server
    serves the pinned definition again)."""

    kind: str
    name: str
    pinned: Pin
    current: dict[str, Any]
    current_digest: str
    seen: float
    pending: bool = True

    def diff(self) -> str:
        """A readable diff of the pinned and the current definition (description and schemas
        as pretty JSON, line by line)."""
        old = json.dumps(self.pinned.definition, indent=2, sort_keys=True).splitlines()
        new = json.dumps(self.current, indent=2, sort_keys=True).splitlines()
        return "\n".join(difflib.unified_diff(old, new, "pinned", "current", lineterm="", n=2))


@dataclass(frozen=True, slots=True)
class Added:
    """An item first seen on a server that was pinned already (listed by `daemonctl changes`:
    a server that grows a tool is a change the user may want to see, not one to hold)."""

    kind: str
    name: str
    seen: float


@dataclass(slots=True)
class ServerPins:
    """The pins of one server in one settings file."""

    pins: dict[tuple[str, str], Pin] = field(default_factory=dict)  # (kind, name) -> pin
    changes: list[Change] = field(default_factory=list)
    added: list[Added] = field(default_factory=list)  # the RECENT_CHANGES newest

    def pending(self) -> dict[tuple[str, str], Change]:
        return {(c.kind, c.name): c for c in self.changes if c.pending}


@dataclass(frozen=True, slots=True)
class Judgement:
    verdicts: dict[tuple[str, str], Verdict]
    held: frozenset[tuple[str, str]]  # not served (mode "hold", changed and not approved)
    warnings: tuple[str, ...]  # what to tell (log, status, the sessions that see the items)
    dirty: bool  # the book changed: save it


def judge(
    book: ServerPins,
    server: str,
    items: Iterable[tuple[str, Mapping[str, Any]]],
    mode: PinningMode,
    now: float,
    digest_of: Callable[[str, Mapping[str, Any]], str] = digest,
) -> Judgement:
    """Compare `items` ((kind, definition) pairs) with `book`, updating it: new items are
    pinned, new changes recorded, changes whose item is back to its pin closed."""
    if mode == "off":
        return Judgement({}, frozenset(), (), False)
    verdicts: dict[tuple[str, str], Verdict] = {}
    held: set[tuple[str, str]] = set()
    warnings: list[str] = []
    dirty = False
    pending = book.pending()
    first_sight = not book.pins  # the server's first discovery: nothing is "new" yet
    for kind, item in items:
        name = item.get("name")
        if not isinstance(name, str):
            continue
        key = (kind, name)
        current = digest_of(kind, item)
        pin = book.pins.get(key)
        if pin is None:
            book.pins[key] = Pin(current, pinned_part(kind, item), now)
            verdicts[key] = Verdict.NEW
            dirty = True
            if not first_sight:
                book.added.append(Added(kind, name, now))
            continue
        if pin.digest == current:
            verdicts[key] = Verdict.KEPT
            change = pending.get(key)
            if change is not None:  # the server went back to what was approved
                change.pending = False
                dirty = True
            continue
        verdicts[key] = Verdict.CHANGED
        change = pending.get(key)
        if change is None or change.current_digest != current:
            if change is not None:
                change.pending = False
            recorded = Change(kind, name, pin, pinned_part(kind, item), current, now)
            book.changes.append(recorded)
            dirty = True
            warnings.append(change_warning(server, recorded, mode))
        if mode == "hold":
            held.add(key)
    if len(book.changes) > RECENT_CHANGES:
        keep = [c for c in book.changes if c.pending]
        done = [c for c in book.changes if not c.pending]
        book.changes = [*done[-max(0, RECENT_CHANGES - len(keep)) :], *keep]
        book.changes.sort(key=lambda c: c.seen)
    del book.added[:-RECENT_CHANGES]
    return Judgement(verdicts, frozenset(held), tuple(warnings), dirty)


def approve(book: ServerPins, names: Iterable[str] = ()) -> list[Change]:
    """Re-pin the pending changes (all, or those of `names`); the changes approved."""
    wanted = set(names)
    approved = []
    for change in book.changes:
        if change.pending and (not wanted or change.name in wanted):
            book.pins[(change.kind, change.name)] = Pin(
                change.current_digest, change.current, change.seen
            )
            change.pending = False
            approved.append(change)
    return approved


@dataclass(frozen=True, slots=True)
class PinState:
    """What pinning makes of one server's snapshot for the views of one settings file: the
    names not served, and the changes pending among its items (each view tells its client of
    those it would show, once)."""

    mode: PinningMode
    held: frozenset[str]  # tool and prompt names (the views' policy filters both by name)
    changes: tuple[Change, ...]


UNPINNED = PinState("off", frozenset(), ())


class PinDesk(Protocol):
    """What a session's catalog asks about pins (the daemon's `PinKeeper`,
    daemon/_pinkeeper.py): the state of `server`'s `snapshot` as the settings file `source`
    pins it, under the server's own `mode` (None: the daemon's)."""

    def state(
        self, source: str | None, server: str, mode: PinningMode | None, snapshot: Snapshot
    ) -> PinState: ...


class _NoPins:
    """A session made alone (tests, tools): nothing is pinned."""

    def state(
        self, source: str | None, server: str, mode: PinningMode | None, snapshot: Snapshot
    ) -> PinState:
        return UNPINNED


NO_PINS: PinDesk = _NoPins()


def change_warning(server: str, change: Change, mode: PinningMode) -> str:
    """What a session's client is told of a change it would see (a warning log message)."""
    what = f"server '{server}' changed the definition of its {change.kind} '{change.name}'"
    if mode == "hold":
        return (
            f"{what} since it was pinned: it is held (not served) until `daemonctl approve "
            f"{server} {change.name}`; `daemonctl changes` shows the difference"
        )
    return (
        f"{what} since it was pinned; it is served as it is now (pinning: warn). "
        "`daemonctl changes` shows the difference"
    )
