"""The daemon's pin book (issue 30 items 1-2): the `PinDesk` every session's catalog asks, the
owner of the pin files (daemon/_pinstore.py), and `daemonctl changes` and `daemonctl approve`.

Each settings file's server is judged (session/_pins.py) once per snapshot its entry publishes,
however many sessions project it: the state is kept beside a weak reference to the snapshot it
was made from. A definition's digest is kept while its item object lives across relists
(pool/_reuse.py keeps unchanged items' objects), so a relist of 5,000 tools hashes only what
changed. Only the servers judged lately are kept decoded (MAX_DECODED); the others are an entry
of an index (their count of pending changes) and their file, read when they are served again.
Files are written by `run`, in a thread, after each change, and once more at the end; a file
that cannot be read is named in the log and moved aside (never trusted, never silently
overwritten), and its server is pinned again from its next discovery.
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
from ._pinstore import BookKey

if TYPE_CHECKING:
    from mcpool.pool import Snapshot

# Warnings `daemonctl status` shows (the newest), beside the count of pending changes.
RECENT_WARNINGS = 20
# Servers whose pins are kept decoded in memory (the most recently judged); the others are read
# from their file when judged again: a daemon that has seen a thousand projects keeps a thousand
# index entries, not a thousand books of definitions.
MAX_DECODED = 64
# Servers pinned at most (settings file and name); past it, the least recently judged one is
# forgotten, its file removed (said in the log): pins grow with the projects seen, bounded too.
MAX_SERVERS = 4096
NO_SOURCE = ""  # the book key of a session's servers that come from no file


def pins_dir() -> Path:
    return _paths.state_dir() / "pins"


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
        self.path = path  # the folder; None: kept in memory only (a keeper made for a test)
        self._default_mode = default_mode
        self._log = log
        self._clock = clock
        # Decoded, least recently judged first; and the others (on disk), each with its count
        # of pending changes, in the same order.
        self.book: dict[BookKey, ServerPins] = {}
        self._index: dict[BookKey, int] = {}
        self._judged: dict[BookKey, _Judged] = {}
        # What the writer owes the disk: files to write (their bytes, taken when the book was
        # let go of, or None: take them from the book) and files to remove.
        self._unsaved: dict[BookKey, bytes | None] = {}
        self._removed: set[BookKey] = set()
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
        """The index of what the folder holds; a file that is not valid is moved aside. (The
        daemon's `run` does this in a thread, not on its way to serving: a server judged
        before is read from its own file, whether it is indexed yet or not.)"""
        if self.path is not None:
            self._indexed(*self._scan(self.path))

    def _scan(self, folder: Path) -> tuple[list[tuple[BookKey, int]], list[str]]:
        """What `folder` holds, oldest first, and what was said of the files set aside."""
        found, bad = _pinstore.index(folder)
        said = []
        for path, why in bad:
            if _pinstore.still_bad(path):  # (not rewritten since it was read)
                aside = path.with_name(f"{path.name}.unreadable-{int(self._clock())}")
                try:
                    os.replace(path, aside)
                    kept = f"moved to {aside}"
                except OSError as move:
                    kept = f"left as it is ({move.strerror})"
                said.append(
                    f"a pin file cannot be read: {why}; it is {kept}, and its server is pinned "
                    "again from its next discovery"
                )
        return [(key, pending) for key, pending, _ in found], said

    def _indexed(self, found: list[tuple[BookKey, int]], said: list[str]) -> None:
        for text in said:
            self._log("error", text)
        # Before what was judged meanwhile (newer), and not over it.
        index = {key: n for key, n in found if key not in self.book and key not in self._index}
        index.update(self._index)
        self._index = index
        self._retire()

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
        book = self._open(key)
        judgement = judge(book, server, items, resolved, self._clock(), digest_of=digest_of)
        if judgement.dirty:
            self._changed(key)
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
        self._retire()
        return state

    def _open(self, key: BookKey) -> ServerPins:
        """`key`'s pins, decoded (from what waits to be written, its file, or new), as the most
        recently judged."""
        pins = self.book.pop(key, None)
        if pins is None:
            pins = self._read(key)
        self._index.pop(key, None)
        self.book[key] = pins
        return pins

    def _read(self, key: BookKey) -> ServerPins:
        waiting = self._unsaved.get(key)
        try:
            if waiting is not None:
                return _pinstore.decode_server(waiting)
            if self.path is not None:
                found = _pinstore.read_server(self.path, key)
                if found is not None:
                    return found
        except (_pinstore.PinFileError, OSError) as exc:
            self._log(
                "error",
                f"the pins of server '{key[1]}' cannot be read: {exc}; it is pinned again from "
                "this discovery",
            )
        return ServerPins()

    def _retire(self) -> None:
        """Keep MAX_DECODED books decoded and MAX_SERVERS servers in all."""
        while len(self.book) > MAX_DECODED:
            key = next(iter(self.book))
            pins = self.book.pop(key)
            self._judged.pop(key, None)
            self._index[key] = len(pins.pending())
            if key in self._unsaved:  # (its bytes now: the book is let go of)
                self._unsaved[key] = _pinstore.encode_server(key, pins)
        while len(self.book) + len(self._index) > MAX_SERVERS and self._index:
            key = next(iter(self._index))
            del self._index[key]
            self._unsaved.pop(key, None)
            self._removed.add(key)
            self._due.set()
            self._log(
                "warning",
                f"pins of server '{key[1]}' ({key[0] or 'no settings file'}) forgotten: more "
                f"than {MAX_SERVERS} servers are pinned; it is pinned again when next served",
            )

    def _every_key(self) -> list[BookKey]:
        return sorted({*self.book, *self._index})

    # -- daemonctl -----------------------------------------------------------------------------

    def approve(self, server: str, names: list[str], source: str | None = None) -> list[Change]:
        """Re-pin `server`'s pending changes (all, or those of `names`) in every settings file
        (or in `source`); McpoolError when none is pending."""
        approved: list[Change] = []
        for key in self._every_key():
            path, name = key
            if name == server and (source is None or path == source):
                approved += approve(self._open(key), names)
        self._retire()
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
        for key in self.book:
            if key[1] == server and (source is None or key[0] == source):
                self._changed(key)
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
        for source, name in self._every_key():
            if server is not None and name != server:
                continue
            decoded = self.book.get((source, name))
            pins = decoded if decoded is not None else self._read((source, name))
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
            "folder": str(self.path) if self.path is not None else None,
            "servers": len(self.book) + len(self._index),
            "pending": sum(len(p.pending()) for p in self.book.values())
            + sum(self._index.values()),
            "warnings": [{"at": at, "text": text} for at, text in self.warnings],
        }

    # -- the file ------------------------------------------------------------------------------

    def _changed(self, key: BookKey) -> None:
        self._unsaved[key] = None
        self._removed.discard(key)
        self._due.set()

    def _owed(self) -> tuple[dict[BookKey, bytes], set[BookKey]]:
        """What is owed to the disk, as bytes taken now; forgotten as owed."""
        writes = {
            key: data if data is not None else _pinstore.encode_server(key, self.book[key])
            for key, data in self._unsaved.items()
            if data is not None or key in self.book
        }
        removes, self._unsaved, self._removed = self._removed, {}, set()
        return writes, removes

    def _owe_again(self, writes: dict[BookKey, bytes], removes: set[BookKey]) -> None:
        """What a write did not do is owed again, unless something newer is owed already."""
        for key, data in writes.items():
            self._unsaved.setdefault(key, data)
        self._removed |= removes - set(self._unsaved)

    def _write(self, writes: dict[BookKey, bytes], removes: set[BookKey]) -> None:
        assert self.path is not None
        for key, data in writes.items():
            _pinstore.write_server(self.path, key, data)
        for key in removes:
            _pinstore.remove_server(self.path, key)

    def save_now(self) -> None:
        if self.path is not None and (self._unsaved or self._removed):
            self._write(*self._owed())

    async def run(self) -> None:
        """The owner task of the pin files for the daemon's life: what changed is written (in
        a thread, from bytes taken here) after each change, and at the end."""
        try:
            if self.path is not None:
                self._indexed(*await trio.to_thread.run_sync(self._scan, self.path))
            while True:
                await self._due.wait()
                self._due = trio.Event()
                if self.path is None or not (self._unsaved or self._removed):
                    continue
                writes, removes = self._owed()
                try:
                    await trio.to_thread.run_sync(self._write, writes, removes)
                except OSError as exc:  # owed again: tried at the next change, and at the end
                    self._owe_again(writes, removes)
                    self._log("error", f"a pin file in {self.path} cannot be written: {exc}")
                except BaseException:
                    self._owe_again(writes, removes)
                    raise
        finally:
            try:
                self.save_now()
            except OSError as exc:
                self._log("error", f"a pin file in {self.path} cannot be written: {exc}")


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
