"""The daemon's pin book (issue 30 items 1-2): the `PinDesk` every session's catalog asks, the
owner of `pins.json`, and `daemonctl changes` and `daemonctl approve`.

Each settings file's server is judged (session/_pins.py) once per snapshot its entry publishes,
however many sessions project it: the state is kept beside a weak reference to the snapshot it
was made from. A definition's digest is kept while its item object lives across relists
(pool/_reuse.py keeps unchanged items' objects), so a relist of 5,000 tools hashes only what
changed. The file is written by `run`, in a thread, after each change of the book, and once more
at the end; a file that cannot be read is named in the log and moved aside (never trusted, never
silently overwritten), and the daemon starts from an empty book.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio

from mcpool.pool import PinningMode
from mcpool.protocol import InvalidParams
from mcpool.session._pins import (
    UNPINNED,
    Change,
    PinState,
    ServerPins,
    Verdict,
    approve,
    digest,
    judge,
)

from . import _paths, _pinstore
from ._files import write_private
from ._pinstore import BookKey

if TYPE_CHECKING:
    from mcpool.pool import Snapshot

# Warnings `daemonctl status` shows (the newest), beside the count of pending changes.
RECENT_WARNINGS = 20
NO_SOURCE = ""  # the book key of a session's servers that come from no file


def pins_path() -> Path:
    return _paths.state_dir() / "pins.json"


class _Judged:
    """One book key's latest judgement: of which snapshot, under which mode, at which epoch."""

    __slots__ = ("digests", "epoch", "mode", "snapshot", "state")

    def __init__(
        self,
        snapshot: weakref.ref[Snapshot],
        mode: PinningMode,
        epoch: int,
        state: PinState,
        digests: dict[int, tuple[Mapping[str, Any], str]],
    ) -> None:
        self.snapshot = snapshot
        self.mode = mode
        self.epoch = epoch
        self.state = state
        self.digests = digests  # id(item) -> (item, digest): the items it judged


class PinKeeper:
    def __init__(
        self,
        path: Path | None,
        default_mode: Callable[[], PinningMode],
        log: Callable[[str, str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path  # None: kept in memory only (a daemon made for a test)
        self._default_mode = default_mode
        self._log = log
        self._clock = clock
        self.book: dict[BookKey, ServerPins] = {}
        self._judged: dict[BookKey, _Judged] = {}
        # Bumped by each approval: every cached judgement is made again.
        self._epoch = 0
        # Changes of the book counted, and the count the file holds: unequal, a write is due.
        self._changes = 0
        self._saved = 0
        self._due = trio.Event()
        self.warnings: collections.deque[tuple[float, str]] = collections.deque(
            maxlen=RECENT_WARNINGS
        )

    def load(self) -> None:
        if self.path is None:
            return
        try:
            self.book = _pinstore.load(self.path)
        except _pinstore.PinFileError as exc:
            aside = self.path.with_name(f"{self.path.name}.unreadable-{int(self._clock())}")
            try:
                os.replace(self.path, aside)
                kept = f"moved to {aside}"
            except OSError as move:
                kept = f"left as it is ({move.strerror})"
            self._log(
                "error",
                f"the pin file cannot be read: {exc}; it is {kept}, and every server is pinned "
                "again from its next discovery",
            )

    # -- PinDesk -------------------------------------------------------------------------------

    def state(
        self, source: str | None, server: str, mode: PinningMode | None, snapshot: Snapshot
    ) -> PinState:
        resolved = mode if mode is not None else self._default_mode()
        if resolved == "off":
            return UNPINNED
        key = (source or NO_SOURCE, server)
        last = self._judged.get(key)
        if (
            last is not None
            and last.snapshot() is snapshot
            and last.mode == resolved
            and last.epoch == self._epoch
        ):
            return last.state
        known = last.digests if last is not None else {}
        digests: dict[int, tuple[Mapping[str, Any], str]] = {}

        def digest_of(kind: str, item: Mapping[str, Any]) -> str:
            found = known.get(id(item))
            value = found[1] if found is not None and found[0] is item else digest(kind, item)
            digests[id(item)] = (item, value)
            return value

        items = [("tool", t) for t in snapshot.tools]
        items += [("prompt", p) for p in snapshot.prompts]
        book = self.book.setdefault(key, ServerPins())
        judgement = judge(book, server, items, resolved, self._clock(), digest_of=digest_of)
        if judgement.dirty:
            self._changed()
        for text in judgement.warnings:
            self._log("warning", text)
            self.warnings.append((self._clock(), text))
        pending = book.pending()
        changes = tuple(
            pending[k]
            for k, v in judgement.verdicts.items()
            if v is Verdict.CHANGED and k in pending
        )
        state = PinState(resolved, frozenset(name for _, name in judgement.held), changes)
        self._judged[key] = _Judged(weakref.ref(snapshot), resolved, self._epoch, state, digests)
        return state

    # -- daemonctl -----------------------------------------------------------------------------

    def approve(self, server: str, names: list[str], source: str | None = None) -> list[Change]:
        """Re-pin `server`'s pending changes (all, or those of `names`) in every settings file
        (or in `source`); McpoolError when none is pending."""
        approved: list[Change] = []
        for (path, name), pins in self.book.items():
            if name == server and (source is None or path == source):
                approved += approve(pins, names)
        if not approved:
            which = f" of {', '.join(names)}" if names else ""
            raise InvalidParams(
                f"server '{server}' has no pending change{which} to approve "
                "(`daemonctl changes` lists them)",
                server=server,
            )
        missing = sorted(set(names) - {c.name for c in approved})
        if missing:
            self._log("info", f"approve {server}: nothing pending for {', '.join(missing)}")
        self._epoch += 1
        self._changed()
        for change in approved:
            self._log(
                "info",
                f"server '{server}': the new definition of {change.kind} '{change.name}' is "
                "approved and pinned",
            )
        return approved

    def changes_json(self, server: str | None = None) -> list[dict[str, Any]]:
        """Pending and recent changes and additions, oldest first."""
        rows: list[dict[str, Any]] = []
        for (source, name), pins in sorted(self.book.items()):
            if server is not None and name != server:
                continue
            for c in pins.changes:
                rows.append(
                    {
                        "server": name,
                        "source": source or None,
                        "kind": c.kind,
                        "name": c.name,
                        "change": "changed",
                        "pending": c.pending,
                        "seen": c.seen,
                        "pinned_since": c.pinned.since,
                        "diff": c.diff(),
                    }
                )
            for a in pins.added:
                rows.append(
                    {
                        "server": name,
                        "source": source or None,
                        "kind": a.kind,
                        "name": a.name,
                        "change": "new",
                        "pending": False,
                        "seen": a.seen,
                    }
                )
        rows.sort(key=lambda r: r["seen"])
        return rows

    def status_json(self) -> dict[str, Any]:
        return {
            "mode": self._default_mode(),
            "file": str(self.path) if self.path is not None else None,
            "servers": len(self.book),
            "pending": sum(len(p.pending()) for p in self.book.values()),
            "warnings": [{"at": at, "text": text} for at, text in self.warnings],
        }

    # -- the file ------------------------------------------------------------------------------

    def _changed(self) -> None:
        self._changes += 1
        self._due.set()

    def save_now(self) -> None:
        if self.path is not None and self._saved != self._changes:
            changes = self._changes
            write_private(self.path, _pinstore.encode(self.book))
            self._saved = changes

    async def run(self) -> None:
        """The owner task of `pins.json` for the daemon's life: written (in a thread, from
        bytes taken here) after each change, and at the end."""
        try:
            while True:
                await self._due.wait()
                self._due = trio.Event()
                if self.path is None or self._saved == self._changes:
                    continue
                changes = self._changes
                data = _pinstore.encode(self.book)
                try:
                    await trio.to_thread.run_sync(write_private, self.path, data)
                except OSError as exc:  # tried again at the next change, and at the end
                    self._log("error", f"the pin file {self.path} cannot be written: {exc}")
                else:
                    self._saved = changes
        finally:
            try:
                self.save_now()
            except OSError as exc:
                self._log("error", f"the pin file {self.path} cannot be written: {exc}")


# -- daemonctl changes / approve ---------------------------------------------------------------


class AdminCalls(Protocol):
    def call(self, method: str, params: dict[str, Any]) -> Any: ...


def add_commands(add: Any) -> None:
    changes = add("changes", "tool and prompt definitions that changed since they were pinned")
    changes.add_argument("server", nargs="?", metavar="SERVER", help="only this server's")
    approve_cmd = add("approve", "serve a server's changed definitions, pinning them anew")
    approve_cmd.add_argument("server", metavar="SERVER")
    approve_cmd.add_argument("tools", nargs="*", metavar="TOOL", help="only these (default: all)")
    approve_cmd.add_argument("--file", help="only in this settings file (default: in every one)")


def render_changes(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no definition changed since it was pinned"
    out = []
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["seen"]))
        where = f" ({r['source']})" if r.get("source") else ""
        if r["change"] == "new":
            out.append(f"{when}  {r['server']}{where}: new {r['kind']} '{r['name']}' (pinned)")
            continue
        state = "PENDING: held or warned until approved" if r["pending"] else "closed"
        out.append(f"{when}  {r['server']}{where}: {r['kind']} '{r['name']}' changed, {state}")
        if r["pending"]:
            out.extend(f"    {line}" for line in r["diff"].splitlines())
    return "\n".join(out)


def cmd_changes(client: AdminCalls, args: argparse.Namespace, as_json: bool) -> int:
    rows = client.call("changes", {"server": args.server} if args.server else {})
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    else:
        sys.stdout.write(render_changes(rows) + "\n")
    return 0


def cmd_approve(client: AdminCalls, args: argparse.Namespace, as_json: bool) -> int:
    params: dict[str, Any] = {"server": args.server, "tools": list(args.tools)}
    if args.file:
        params["file"] = os.path.abspath(args.file)
    result = client.call("approve", params)
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        for row in result["approved"]:
            sys.stdout.write(f"{args.server}: {row['kind']} '{row['name']}' approved\n")
        sys.stdout.write(f"{result['sessions']} session(s) told\n")
    return 0
