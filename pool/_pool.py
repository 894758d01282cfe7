"""The pool: upstream servers keyed by transport identity, shared by every session.

Theory of operation: `Pool` keeps `PoolEntry`s in a dict under their frozen `EntryKey`. All
bookkeeping (find-or-create on acquire, lease counting, drain deadlines) happens in plain
synchronous code, which under trio cannot be interrupted, so it needs no lock; concurrent
acquires of one key therefore find the same entry and spawn one process (L1). Each entry has one
supervisor task in the pool's nursery that owns its upstream connection for its whole life:
spawn, handshake, discover, publish snapshots, restart with backoff after a crash (L3), and close
when the drain deadline passes (L2) or the pool closes. Identity checks (`current is entry`)
guard every eviction, because one key outlives many entries.
"""

from __future__ import annotations

import collections
import itertools
import math
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import msgspec
import trio
from msgspec import UNSET, Raw, UnsetType

from mcpool.protocol import (
    INVALID_PARAMS,
    SESSION_CLOSING,
    CannotStart,
    McpoolError,
    Message,
    decode_params,
)

from ._entry import (
    LOGIN_NEEDED,
    TERMINAL_STATES,
    EntryEvent,
    EntryKey,
    EntryListener,
    EntryState,
    Handle,
    PoolEntry,
    close_deadline,
    next_idle_since,
    no_retry,
)
from ._eras import MODERN, MODERN_ONLY
from ._guardian import Guardian
from ._items import json_type, malformed_item, malformed_note
from ._oauth import needs_login, oauth_failure
from ._reuse import KnownItems
from ._snapshot import Snapshot
from ._snapshots import (
    EncodedList,
    SnapshotStore,
    from_record,
    invalidation,
    to_record,
)
from ._spec import (
    PoolTables,
    ServerSettings,
    TransportIdentity,
    capture_settings,
    intern_identity,
)
from ._turns import MAX_UNROUTED, Verdict, attribute
from ._upstream import DEFAULT_REQUEST_TIMEOUT, StdioUpstream, Upstream

DEFAULT_DRAIN_GRACE = 30.0
DEFAULT_MAX_IDLE = 300.0
DEFAULT_SPAWN_TIMEOUT = 30.0  # `timeout` setting absent: spawn + handshake + discovery bound
BACKOFF_INITIAL = 1.0
BACKOFF_MAX = 30.0
CRASH_LOOP_FAILURES = 5
CRASH_LOOP_WINDOW = 120.0
# A crash-looped local server is tried again after this long on its own (a fixed binary or a
# dependency that came back is picked up), and at most once per `backoff_max` when a session
# attaches to it: rare enough that a server that is still broken costs one spawn per cooldown.
CRASH_LOOP_COOLDOWN = 300.0
MAX_LIST_PAGES = 1000  # a server paginating past this is looping on its cursor
ENTRY_CLOSE_BOUND = 10.0  # L4's three steps take at most ~6 s; this bounds a pathological one
SNAPSHOTS_SETTLE_BOUND = 2.0  # the snapshot writes asked for before shutdown: a local disk takes ms
# A drained entry waits for its requests in flight at most their time limit plus this: the
# connection's own timer answers each by then; the slack only covers that timer's wake-up.
IN_FLIGHT_SLACK = 1.0
# L6: a session's first list waits at most this for its servers' first start, then is served what
# is ready (late servers arrive by list_changed). Codex gives up on a server after about 1 s.
DEFAULT_STARTUP_BUDGET = 1.5
DEFAULT_LIST_ONCE_BUDGET = 8.0  # issue 28: under Codex's own 10 s
# Last discoveries of lazy servers kept in memory: one per identity a user ran recently.
KNOWN_SNAPSHOTS = 256


class PoolOptions(msgspec.Struct, kw_only=True):
    drain_grace: float = DEFAULT_DRAIN_GRACE
    max_idle: float = DEFAULT_MAX_IDLE
    max_line: int = 16 * 1024 * 1024
    backoff_initial: float = BACKOFF_INITIAL
    backoff_max: float = BACKOFF_MAX
    crash_loop_failures: int = CRASH_LOOP_FAILURES
    crash_loop_window: float = CRASH_LOOP_WINDOW
    crash_loop_cooldown: float = CRASH_LOOP_COOLDOWN
    # Bounds each request to an upstream whose entry sets no `timeout` of its own.
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    startup_budget: float = DEFAULT_STARTUP_BUDGET
    # Issue 28: a list-once client's first list waits this long for a server never seen up;
    # one not up within it is remembered slow (`known_slow`). `list_once_clients`: more such
    # clients, by a part of their clientInfo name (session/_clients.py knows Codex and Qwen).
    list_once_budget: float = DEFAULT_LIST_ONCE_BUDGET
    list_once_clients: tuple[str, ...] = ()


class RefreshRejected(McpoolError):
    """R4: refresh of a released handle or of a handle on a terminal entry."""

    code = INVALID_PARAMS
    default_message = "Refresh rejected"


def backoff_delay(failures: int, *, initial: float, maximum: float, rng: random.Random) -> float:
    """Exponential backoff with jitter: initial * 2^(n-1), capped, scaled by 0.5..1.0."""
    base = min(maximum, initial * 2.0 ** max(0, failures - 1))
    return base * (0.5 + rng.random() / 2)


def is_crash_loop(failure_times: list[float], *, now: float, window: float, limit: int) -> bool:
    return sum(1 for t in failure_times if now - t <= window) >= limit


class AfterFailure(NamedTuple):
    """What to do once an entry's connection failed (`after_failure`)."""

    event: EntryEvent  # GIVE_UP, NEEDS_LOGIN, CRASH_LOOP or CRASHED
    failures: list[float]  # the failure times still in the crash-loop window, this one last
    crash_looped: bool
    # Seconds to rest before the next start (a restart request cuts it short); inf: no start
    # until a restart is asked for (given up, or waiting for the user's login).
    rest: float


def after_failure(
    *,
    now: float,
    failures: list[float],
    up_since: float | None,
    crash_looped: bool,
    cannot_start: bool,
    needs_login: bool,
    stdio: bool,
    options: PoolOptions,
    rng: random.Random,
) -> AfterFailure:
    """The restart decision, pure: a failure no retry fixes gives up; one that needs a login
    waits for it; a local server that keeps dying rests for the cooldown (and one that fails
    again after such a retry goes straight back); anything else is retried after the backoff
    (a remote server that is down is waited for at the backoff cap). `rng` jitters the
    backoff, and is drawn from for a backoff only."""
    window = options.crash_loop_window
    if up_since is not None and now - up_since >= window:
        # It stayed up: whatever crash-looped it before is history.
        failures, crash_looped = [], False
    failures = [t for t in [*failures, now] if now - t <= window]
    if cannot_start:
        return AfterFailure(EntryEvent.GIVE_UP, failures, crash_looped, math.inf)
    if needs_login:
        return AfterFailure(EntryEvent.NEEDS_LOGIN, failures, crash_looped, math.inf)
    if stdio and (
        crash_looped
        or is_crash_loop(failures, now=now, window=window, limit=options.crash_loop_failures)
    ):
        return AfterFailure(EntryEvent.CRASH_LOOP, failures, True, options.crash_loop_cooldown)
    rest = backoff_delay(
        len(failures), initial=options.backoff_initial, maximum=options.backoff_max, rng=rng
    )
    return AfterFailure(EntryEvent.CRASHED, failures, crash_looped, rest)


def attach_retry_due(failure_times: list[float], *, now: float, interval: float) -> bool:
    """Whether a session attaching to a crash-looped entry makes it try again now: at most once
    per `interval` (the backoff cap) since its last failure, so attaches cannot spawn-storm."""
    return not failure_times or now - failure_times[-1] >= interval


def default_upstream_factory(identity: TransportIdentity, events: Any, **options: Any) -> Upstream:
    """The connection class for an identity's transport. The HTTP module (and its client
    library) is imported only when an HTTP or SSE server is actually started."""
    if identity.kind in ("http", "sse"):
        from ._http import HttpUpstream

        return HttpUpstream(identity, events, **options)
    return StdioUpstream(identity, events, **options)


class Pool:
    def __init__(
        self,
        nursery: trio.Nursery,
        options: PoolOptions | None = None,
        *,
        guardian: Guardian | None = None,
        rng: random.Random | None = None,
        upstream_factory: Callable[..., Upstream] | None = None,
        log: Callable[..., None] | None = None,
        snapshots: SnapshotStore | None = None,
        tables: PoolTables | None = None,
    ) -> None:
        self._nursery = nursery
        # The daemon's interning tables for settings and identities (its `Interner`'s).
        self.tables = tables if tables is not None else PoolTables()
        # Discoveries kept across daemon restarts (None: none kept).
        self._snapshots = snapshots
        self._options = options or PoolOptions()
        self._guardian = guardian
        self._rng = rng or random.Random()
        self._entries: dict[EntryKey, PoolEntry] = {}
        self._unpooled = itertools.count(1)
        self._handle_ids = itertools.count(1)
        self._upstream_factory = upstream_factory or default_upstream_factory
        self._closing = False
        self.log: Callable[..., None] = log or (lambda *_a, **_k: None)
        self._advised: set[str] = set()  # servers whose routing advice was logged (once each)
        # Every connection that exists, started or still starting: what `kill_all` reaches.
        self._connections: dict[PoolEntry, Upstream] = {}
        # Each identity's last discovery, surviving its entry (insertion order: oldest first).
        self._known: dict[EntryKey, Snapshot] = {}
        # The era each transport fingerprint was last found to speak (live or stored), the
        # newest KNOWN_SNAPSHOTS: what `known_era` answers without reading the store again.
        self._eras: dict[str, str] = {}

    @property
    def options(self) -> PoolOptions:
        return self._options

    @options.setter
    def options(self, options: PoolOptions) -> None:
        """New daemon options: a changed request time limit applies to running upstreams too
        (to requests sent from now on)."""
        self._options = options
        for entry in self._entries.values():
            if entry.upstream is not None:
                entry.upstream.request_timeout = self._request_timeout(entry)

    def _request_timeout(self, entry: PoolEntry) -> float:
        """The entry's `timeout` (milliseconds, as gemini-cli) bounds each of its requests;
        without one, the daemon's `requestTimeout`."""
        ms = entry.identity.timeout
        return ms / 1000.0 if ms else self._options.request_timeout

    # -- queries -------------------------------------------------------------------------------

    def entries(self) -> list[PoolEntry]:
        return list(self._entries.values())

    def get(self, key: EntryKey) -> PoolEntry | None:
        return self._entries.get(key)

    # -- last known discoveries (L6) -----------------------------------------------------------

    def last_snapshot(self, entry: PoolEntry) -> Snapshot | None:
        """The one place an entry's last known discovery comes from before its process runs."""
        return self._known.get(entry.key)

    def _remember(self, entry: PoolEntry, snapshot: Snapshot) -> None:
        # Only lazy servers are served from memory before they run: a daemon churning through
        # many eager identities keeps nothing for them.
        if not snapshot.available or entry.settings.start != "lazy":
            return
        self._known.pop(entry.key, None)
        self._known[entry.key] = snapshot
        while len(self._known) > KNOWN_SNAPSHOTS:
            del self._known[next(iter(self._known))]

    # -- leases --------------------------------------------------------------------------------

    def known_era(self, identity: TransportIdentity) -> str | None:
        """The era `identity`'s server was last found to speak (issue 29 item 1): its live
        entry's, or what its stored discovery says; None when it was never seen."""
        fingerprint = identity.unpinned.fingerprint
        found = self._eras.get(fingerprint)
        if found is not None:
            return found
        if self._snapshots is None:
            return None
        try:
            record = self._snapshots.load(fingerprint)
        except Exception:  # a store must not raise; one that does knows nothing
            return None
        if record is not None and record.era is not None:
            return self._note_era(fingerprint, record.era)
        return None

    def _note_era(self, fingerprint: str, era: str | None) -> str | None:
        """Remember `era` for `fingerprint` (the newest KNOWN_SNAPSHOTS); what is known."""
        if era is None:
            return None
        if era == MODERN and self._eras.get(fingerprint) == MODERN_ONLY:
            era = MODERN_ONLY  # (what its refused handshake connection showed stays known)
        self._eras.pop(fingerprint, None)
        self._eras[fingerprint] = era
        while len(self._eras) > KNOWN_SNAPSHOTS:
            del self._eras[next(iter(self._eras))]
        return era

    def in_era(self, identity: TransportIdentity, version: str) -> TransportIdentity:
        """`identity` pinned to the handshake revision `version`: the connection a dual-era
        server's sessions of that revision share (another entry than the unpinned one)."""
        return intern_identity(msgspec.structs.replace(identity, era_pin=version), self.tables)

    def lease(
        self,
        identity: TransportIdentity,
        settings: ServerSettings,
        session_id: str,
        listener: EntryListener,
        *,
        log_level: str | None = None,
        subscriptions: Iterable[str] = (),
    ) -> Handle:
        """Synchronous part of acquire: find or create the entry and take a lease (L1).

        `log_level` and `subscriptions`: what the session asked of this server before, on the
        connection this lease replaces (issue 29 item 5). They join the entry's shared level and
        subscriptions with the lease; a running upstream is told what that changes now, one
        that starts later by `_restore_shared_state`, as after a restart or a crash: one path."""
        if self._closing:
            raise McpoolError(
                "the daemon is shutting down", message="Session closing", code=SESSION_CLOSING
            )
        if identity.scope == "session":
            key = EntryKey(identity.name, f"unpooled-{next(self._unpooled)}")
        else:
            key = EntryKey(identity.name, identity.fingerprint)
        entry = self._entries.get(key)
        if entry is None or entry.state in TERMINAL_STATES or entry.closing:
            entry = PoolEntry(key, identity, capture_settings(settings, self.tables))
            entry.startup_deadline = trio.current_time() + self.options.startup_budget
            # A server seen before starts from its stored discovery (flagged cached).
            self._start_from_store(entry)
            if entry.stored is None and self._snapshots is not None:
                entry.known_slow = self._snapshots.slow(identity.fingerprint)
            if entry.settings.start == "lazy":
                known = self.last_snapshot(entry)
                if known is not None and standby_basis(known) and not standby_basis(entry.snapshot):
                    entry.snapshot = msgspec.structs.replace(
                        known, generation=entry.snapshot.generation + 1
                    )
                # Only a whole discovery is served without a process; an empty or garbled
                # one is made again now (its lists, if stored, are served meanwhile).
                if standby_basis(entry.snapshot):
                    # Served from what it offered last time; started when a request needs it.
                    entry.state = EntryState.STANDBY
                    self._remember(entry, entry.snapshot)
                    entry.ready.set()
            self._entries[key] = entry
            self._nursery.start_soon(self._supervise, entry)
        elif entry.state is EntryState.CRASH_LOOP and attach_retry_due(
            entry.failures, now=trio.current_time(), interval=self.options.backoff_max
        ):
            # A session attaching is a reason to look again (the server may have been fixed);
            # it waits for this attempt as for a first start.
            self.log(
                "info", f"server '{entry.name}': retrying after crash-loop (a session attached)"
            )
            entry.ready = trio.Event()
            entry.startup_deadline = trio.current_time() + self.options.startup_budget
            entry.restart_requested.set()
        handle = Handle(
            entry, session_id, identity, capture_settings(settings, self.tables), listener
        )
        handle.log_level = log_level
        carried = set(subscriptions)
        if carried:
            handle.subscriptions = carried
        level_before = entry.effective_log_level()
        unheld = [uri for uri in sorted(carried) if not entry.shared.held(uri)]
        was_idle = entry.leases == 0
        entry.add_handle(next(self._handle_ids), handle)
        upstream = entry.upstream
        if upstream is not None and upstream.alive:
            level = entry.effective_log_level()
            _tell_shared_state(upstream, level if level != level_before else None, unheld)
        if was_idle:
            entry.leased_since = trio.current_time()
            entry.move_deadline(math.inf)
            entry.fire(EntryEvent.LEASED)
        return handle

    async def _watch_first_start(self, entry: PoolEntry) -> None:
        """A server never seen up that is not up within the list-once budget is remembered
        slow (whoever waited for it): no first list waits for it again until it has been up."""
        await trio.sleep(self.options.list_once_budget)
        # Still in its first start: slow. One that failed (and is retried) is not slow, and a
        # first list does not wait for it in any case (its `ready` is set).
        if entry.up_since is None and not entry.closing and entry.state is EntryState.SPAWNING:
            self.note_not_up(entry)

    def note_not_up(self, entry: PoolEntry) -> None:
        """A session's first list went on without `entry` (its wait ran out): a server never
        seen up is remembered as slow, and no first list waits for it until it has been up."""
        if entry.stored is None and entry.up_since is None and not entry.known_slow:
            entry.known_slow = True
            if self._snapshots is not None:
                self._snapshots.mark_slow(entry.identity.fingerprint, True)

    def _start_from_store(self, entry: PoolEntry) -> None:
        """A new entry whose server was seen before: its last discovery is its first snapshot
        (flagged cached), and sessions waiting for it go on at once."""
        if self._snapshots is None:
            return
        try:
            record = self._snapshots.load(entry.identity.fingerprint)
            if record is None or record.fingerprint != entry.identity.fingerprint:
                return
            snapshot = from_record(record, entry.snapshot.generation + 1)
        except Exception as exc:
            # A store must not raise for a bad record; one that does costs this entry its
            # cache, never the session acquiring it (this runs in that session's task).
            self.log(
                "warning",
                f"server '{entry.name}': stored snapshot ignored: {_describe(exc)}",
                server=entry.name,
            )
            return
        entry.stored = record
        entry.snapshot = snapshot
        self._note_era(entry.identity.fingerprint, record.era)
        entry.ready.set()

    def _store_snapshot(self, entry: PoolEntry, upstream: Upstream, snapshot: Snapshot) -> None:
        """Keep a live discovery for the next cold start (written off the supervisor's path)."""
        store = self._snapshots
        if store is None or not snapshot.available:
            return
        record = to_record(
            snapshot,
            fingerprint=entry.identity.fingerprint,
            server_info=upstream.server_info,
            era=upstream.era,
            protocol_version=upstream.protocol_version,
            saved_at=time.time(),
        )
        if entry.stored is not None and entry.stored.same_content(record):
            return
        entry.stored = record
        # A 5,000-tool list re-encoded on every list_changed cost more loop time than its
        # relist: the lists whose pages are the snapshot's go as the upstream's own bytes (as
        # views of them: each 605 KB copy was about 0.25 ms of loop time).
        encoded: dict[str, EncodedList] = {}
        for field, method in _STORED_LISTS:
            parts = entry.known_items[method].encoded_parts(getattr(snapshot, field))
            if parts is not None:
                encoded[field] = parts
        # Handed on, not awaited (the store writes it in order, off the loop). The relist
        # must never see a store's failure: the cache is an optimisation.
        try:
            store.save(record, encoded)
        except Exception as exc:
            self.log("warning", f"snapshot not saved: {_describe(exc)}")

    def _check_stored(self, entry: PoolEntry, upstream: Upstream) -> None:
        """After the handshake: a stored record of another server name or version is dropped."""
        record = entry.stored
        if record is None or self._snapshots is None:
            return
        why = invalidation(record, upstream.server_info)
        if why is not None:
            self.log(
                "info",
                f"server '{entry.name}': stored snapshot invalidated: {why}",
                server=entry.name,
            )
            entry.stored = None
            self._snapshots.forget(entry.identity.fingerprint)

    async def acquire(
        self,
        identity: TransportIdentity,
        settings: ServerSettings,
        session_id: str,
        listener: EntryListener,
    ) -> Handle:
        """Lease an entry and wait for its first start attempt (success or failure)."""
        handle = self.lease(identity, settings, session_id, listener)
        await handle.entry.ready.wait()
        return handle

    def release(self, handle: Handle, *, replaced: bool = False) -> None:
        """Give a lease back. `replaced`: the session now uses other transport settings for
        this server; an entry left with no lease and none of this session's calls in flight
        then closes at once (an edit storm must not leave a process per edit for the drain
        grace, which exists for a session that detaches and re-attaches with the same
        settings)."""
        if handle.released:
            return
        handle.released = True
        entry = handle.entry
        level_before = entry.effective_log_level()
        unheld = entry.remove_handle(handle)  # O(1): counts, not a pass over the handles
        entry.let_go(handle)
        if entry.turns.on:
            for waiter in entry.turns.left(handle):
                waiter(f"server '{entry.name}' was removed from the session")
            entry.calls_ended()
        upstream = entry.upstream
        if upstream is not None and upstream.alive:
            for uri in unheld:
                upstream.send_request("resources/unsubscribe", _json({"uri": uri}), _ignore)
            level = entry.effective_log_level()
            if level is not None and level != level_before:
                upstream.send_request("logging/setLevel", _json({"level": level}), _ignore)
        if entry.leases == 0 and entry.state in TERMINAL_STATES and entry.identity.era_pin:
            # A dual-era server's handshake connection that failed is no server of the user's
            # to show as failed: its sessions went back to the modern one (issue 29 item 1).
            self._close_entry(entry, "its era was refused")
            return
        if entry.leases == 0 and entry.state not in TERMINAL_STATES:
            now = trio.current_time()
            entry.idle_since = next_idle_since(
                now=now,
                idle_since=entry.idle_since,
                leased_since=entry.leased_since,
                drain_grace=self.options.drain_grace,
            )
            entry.leased_since = None
            entry.fire(EntryEvent.IDLE)
            # Only this session's own calls can be in flight (it was the last lease); the
            # daemon's bookkeeping requests (unsubscribe above) need no answer.
            if replaced and handle.in_flight == 0:
                self._close_entry(entry, "replaced")
                return
            entry.move_deadline(
                close_deadline(
                    now=now,
                    idle_since=entry.idle_since,
                    drain_grace=self.options.drain_grace,
                    max_idle=self.options.max_idle,
                )
            )

    def refresh(self, handle: Handle, settings: ServerSettings) -> None:
        """R2-R5: a same-identity settings change; the handle keeps its lease and its entry."""
        if handle.released:
            raise RefreshRejected(
                f"server '{handle.identity.name}': refresh of a released handle",
                server=handle.identity.name,
            )
        if handle.entry.state in TERMINAL_STATES:
            raise RefreshRejected(
                f"server '{handle.identity.name}': refresh of a {handle.entry.state.value} entry",
                server=handle.identity.name,
                state=handle.entry.state.value,
            )
        handle.settings = capture_settings(settings, self.tables)

    def restart(self, name: str) -> list[PoolEntry]:
        """Restart every live entry of that server now, without backoff (R6 keeps teardown).
        A standby entry has no process to restart: it starts now, and its discovery replaces
        the one it was served from (what a user asking for a restart wants to see)."""
        hit = [e for e in self._entries.values() if e.name == name]
        for entry in hit:
            if entry.state is EntryState.STANDBY:
                entry.wake_requested.set()
            else:
                self.restart_entry(entry)
        return [e for e in hit if e.state not in TERMINAL_STATES]

    def restart_entry(self, entry: PoolEntry) -> None:
        if entry.state not in TERMINAL_STATES:
            entry.failures.clear()
            entry.crash_looped = False
            entry.last_error = None
            entry.era = None  # an explicit restart detects the era afresh
            entry.restart_requested.set()
            if entry.upstream is not None:
                entry.upstream.request_close("restart requested")

    def kill_all(self) -> None:
        """Past the shutdown bound: SIGKILL every upstream process group now, those still
        starting (spawned, handshake or discovery not done) included (L5)."""
        for upstream in list(self._connections.values()):
            upstream.kill()

    async def aclose(self) -> None:
        """Close every entry (L4 each), bounded."""
        self._closing = True
        for entry in self._entries.values():
            self._close_entry(entry, "the daemon is shutting down")
        # Not shielded: the caller bounds shutdown (and shields it) as a whole.
        with trio.move_on_after(ENTRY_CLOSE_BOUND):
            for entry in list(self._entries.values()):
                await entry.closed.wait()
        if self._snapshots is not None:
            with trio.move_on_after(SNAPSHOTS_SETTLE_BOUND):
                await self._snapshots.settled()

    def _close_entry(self, entry: PoolEntry, reason: str) -> None:
        entry.closing = True
        entry.close_reason = reason
        entry.move_deadline(-math.inf)
        entry.restart_requested.set()
        entry.wake_requested.set()
        if entry.upstream is not None:
            entry.upstream.request_close(reason)
        if entry.starting is not None:
            entry.starting.cancel()  # still spawning: stop the start-up, the process closes

    # -- the supervisor ------------------------------------------------------------------------

    async def _supervise(self, entry: PoolEntry) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._drain_timer, entry)
                if entry.stored is None and not entry.known_slow:
                    # Within the entry's own nursery: it ends with the entry, holding nothing.
                    nursery.start_soon(self._watch_first_start, entry)
                await self._connection_loop(entry)
                nursery.cancel_scope.cancel()
        finally:
            entry.fire(EntryEvent.CLOSE)
            entry.upstream = None
            if self._entries.get(entry.key) is entry:
                del self._entries[entry.key]
            entry.ready.set()
            entry.settle_waiters(f"server '{entry.name}' closed ({entry.close_reason or 'closed'})")
            entry.closed.set()
            if entry.snapshot.available:
                entry.publish(Snapshot(generation=entry.snapshot.generation + 1))

    async def _drain_timer(self, entry: PoolEntry) -> None:
        while True:
            moved = entry.deadline_moved
            with trio.move_on_at(entry.deadline):
                await moved.wait()
                continue
            if entry.leases == 0 or entry.closing:
                upstream = entry.upstream
                if upstream is not None and upstream.in_flight and not entry.closing:
                    # L7: requests in flight end first (each within its time limit); a session
                    # leasing the entry meanwhile keeps it (the loop looks again).
                    self.log(
                        "info",
                        f"server '{entry.name}': drained; closing once its "
                        f"{upstream.in_flight} request(s) in flight end",
                        server=entry.name,
                    )
                    with trio.move_on_after(upstream.request_timeout + IN_FLIGHT_SLACK):
                        await upstream.wait_settled()
                    if entry.leases and not entry.closing:
                        continue
                self._close_entry(entry, "drained")
                return
            entry.move_deadline(math.inf)

    async def _connection_loop(self, entry: PoolEntry) -> None:
        if entry.state is EntryState.STANDBY:
            await entry.wake_requested.wait()  # a request needs the process (or it closes)
            if entry.closing:
                return
            entry.fire(EntryEvent.WAKE)
        while not entry.closing:
            entry.restart_requested = trio.Event()
            error = await self._run_once(entry)
            if entry.closing:
                return
            if error is None and entry.restart_requested.is_set():
                entry.restarts += 1
                entry.fire(EntryEvent.RESTART)
                continue
            now = trio.current_time()
            decision = after_failure(
                now=now,
                failures=entry.failures,
                up_since=entry.up_since,
                crash_looped=entry.crash_looped,
                cannot_start=entry.cannot_start,
                needs_login=entry.needs_login,
                stdio=entry.identity.kind == "stdio",
                options=self.options,
                rng=self._rng,
            )
            entry.failures, entry.crash_looped = decision.failures, decision.crash_looped
            entry.last_error = error or "exited"
            started = entry.up_since is not None
            self.log(
                "warning",
                f"server '{entry.name}' {'stopped' if started else 'failed to start'}: "
                f"{entry.last_error}",
                server=entry.name,
            )
            entry.ready.set()
            entry.settle_waiters(f"server '{entry.name}' failed to start: {entry.last_error}")
            entry.fire(decision.event)
            if decision.event is EntryEvent.GIVE_UP:
                # Failed, with the reason, until closed (closing sets restart_requested; a
                # restart of a failed one does not end this wait).
                while not entry.closing:
                    await entry.restart_requested.wait()
                    entry.restart_requested = trio.Event()
                return
            if decision.event is EntryEvent.NEEDS_LOGIN:
                for handle in list(entry.handles.values()):  # their sessions tell their clients
                    handle.listener.upstream_notification(entry, LOGIN_NEEDED, UNSET)
                await entry.restart_requested.wait()
            else:
                if decision.event is EntryEvent.CRASH_LOOP:
                    entry.retry_at = now + decision.rest
                with trio.move_on_at(now + decision.rest):
                    await entry.restart_requested.wait()
                entry.retry_at = None
            if entry.closing:
                return
            entry.restarts += 1
            entry.fire(EntryEvent.RESTART)

    async def _run_once(self, entry: PoolEntry) -> str | None:
        """One connection's life. Returns None after a clean close, else why it failed."""
        timeout = _start_timeout(entry)
        events = _EntryEvents(self, entry)
        upstream = self._upstream_factory(
            entry.identity,
            events,
            guardian=self._guardian,
            max_line=self.options.max_line,
            handshake_timeout=timeout,
            # What the daemon answers roots/list with: never one session's folders on a shared
            # server; a workspace entry's sessions share their roots (they are in its key).
            roots=tuple(entry.settings.roots) or entry.identity.roots,
        )
        events.upstream = upstream
        self._connections[entry] = upstream
        upstream.known_era = entry.era
        upstream.request_timeout = self._request_timeout(entry)
        failure: str | None = None
        entry.up_since = None
        entry.needs_login = False
        try:
            async with trio.open_nursery() as nursery:
                # Closing the entry while it starts (`_close_entry`) cancels this scope.
                with trio.CancelScope() as entry.starting:
                    with trio.fail_after(timeout):
                        await nursery.start(upstream.run)
                        self._check_stored(entry, upstream)
                        snapshot = await discover(
                            upstream, entry.snapshot.generation + 1, timeout, entry.known_items
                        )
                entry.starting = None
                if entry.closing:
                    upstream.request_close(entry.close_reason or "closed")
                    return None
                entry.up_since = trio.current_time()
                entry.upstream = upstream
                if entry.known_slow:  # seen up: first lists wait for it again
                    entry.known_slow = False
                    if self._snapshots is not None:
                        self._snapshots.mark_slow(entry.identity.fingerprint, False)
                entry.era = upstream.era
                self._note_era(entry.identity.fingerprint, upstream.era)
                entry.last_error = None
                _restore_shared_state(entry, upstream)
                entry.fire(EntryEvent.READY)
                for note in snapshot.notes:
                    self.log("warning", f"server '{entry.name}': {note}", server=entry.name)
                entry.publish(snapshot)
                self._remember(entry, snapshot)
                entry.ready.set()
                self._store_snapshot(entry, upstream, snapshot)
                entry.settle_waiters(None)
                events.started(nursery)
        except Exception as exc:
            entry.needs_login = needs_login(upstream, exc)
            entry.cannot_start = _contains(exc, CannotStart)
            if entry.identity.era_pin is not None and upstream.protocol_version is None:
                # Refused in the handshake era (or gone before it): the server speaks only
                # the modern one, and its sessions go back to that connection.
                self._note_era(entry.identity.unpinned.fingerprint, MODERN_ONLY)
                entry.cannot_start = True
            if _contains(exc, trio.TooSlowError):
                failure = f"did not start within {timeout:g} s"
            else:
                # An OAuth step that failed is why, whatever the requests it closed said.
                failure = oauth_failure(upstream) or _describe(exc)
        finally:
            entry.starting = None
            entry.upstream = None
            entry.cut_calls.clear()  # the calls cut at that connection ended with it
            if self._connections.get(entry) is upstream:
                del self._connections[entry]
            entry.stderr_history = list(upstream.stderr_tail)
            # The connection is over (its reader and relists ended with its nursery): the sink
            # lets go of it, or the two (a cycle) would keep the connection, and a closed entry
            # with it, alive until a full collection.
            events.closed()
        if failure is None and upstream.closed_reason not in (
            None,
            "restart requested",
            "drained",
            "replaced",
            "the daemon is shutting down",
        ):
            failure = f"{upstream.closed_reason}"
            entry.needs_login = needs_login(upstream, None)
        if failure is not None:
            # An error may quote a header or env value (h11: "Illegal header value b'...'").
            failure = entry.identity.redact(_with_exit_details(failure, upstream))
        if entry.snapshot.available:
            entry.publish(Snapshot(generation=entry.snapshot.generation + 1))
        return failure


def standby_basis(snapshot: Snapshot) -> bool:
    """Whether a lazy server's last discovery is one to serve without starting it (STANDBY):
    it listed something and left nothing out. An empty or garbled discovery (a server that was
    not ready, or answered a list with something else) is made again on its next start."""
    return (
        snapshot.available
        and not snapshot.notes
        and bool(
            snapshot.tools or snapshot.prompts or snapshot.resources or snapshot.resource_templates
        )
    )


def _start_timeout(entry: PoolEntry) -> float:
    """The entry's `timeout` setting, which bounds a start and each relist."""
    return entry.identity.timeout / 1000.0 if entry.identity.timeout else DEFAULT_SPAWN_TIMEOUT


def _with_exit_details(failure: str, upstream: Upstream) -> str:
    """Say how the process ended and what it last said: the first thing a user needs."""
    details = []
    if upstream.exit_status is not None and "status" not in failure:
        details.append(f"exit status {upstream.exit_status}")
    tail = [line for line in upstream.stderr_tail if line.strip()]
    if tail and not tail[-1].endswith(failure):  # (a note of ours may say it already)
        details.append(f"stderr: {tail[-1][:300]}")
    return f"{failure} ({'; '.join(details)})" if details else failure


def _contains(exc: BaseException, kind: type[BaseException]) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_contains(e, kind) for e in exc.exceptions)
    return isinstance(exc, kind)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    if isinstance(exc, McpoolError):
        return exc.reason
    return f"{type(exc).__name__}: {exc}"


async def list_all(
    upstream: Upstream,
    method: str,
    field: str,
    timeout: float,
    notes: list[str] | None = None,
    known: KnownItems | None = None,
) -> tuple[dict[str, Any], ...]:
    """Every page of a list. Malformed items are left out, and said so in `notes` (one line
    for this list), never silently. With `known` (the entry's items of this list's last
    listing), items whose encoding did not change are the objects listed then (issue 17)."""
    # Each page's items that were kept, and how many in all.
    kept: list[Sequence[dict[str, Any]]] = []
    count = 0
    problems: list[str] = []
    unread: list[str] = []  # answers that were no page at all (nothing of them listed)
    cursor: str | None = None
    # Items are decoded by a `KnownItems` always, a table of this listing alone when the
    # caller keeps none: it is where mcpool's own `_meta` keys are removed (DESIGN X9).
    table = known if known is not None else KnownItems()
    table.start()

    def decode(raw: msgspec.Raw) -> Any:
        return table.decode(raw, field)

    for _ in range(MAX_LIST_PAGES):
        params: dict[str, Any] = {"cursor": cursor} if cursor else {}
        result = await upstream.call(method, params, timeout=timeout, decode_result=decode)
        if isinstance(result, dict):
            page = result.get(field)
            if isinstance(page, list | tuple):  # (a tuple: `known`'s own items)
                # Items accepted by the last listing, unchanged, need no check again.
                fresh, table.fresh = table.fresh, []
                if not any(malformed_item(field, item) for item in fresh):
                    kept.append(page)
                    count += len(page)
                else:
                    good: list[dict[str, Any]] = []
                    for item in page:
                        why = malformed_item(field, item)
                        if why is None:
                            good.append(item)
                        else:
                            at = count + len(good) + len(problems) + 1
                            problems.append(f"item {at}: {why}")
                    kept.append(good)
                    count += len(good)
            else:
                unread.append(f"a page whose {field} is {json_type(page)}, not an array")
            nxt = result.get("nextCursor")
            cursor = nxt if isinstance(nxt, str) and nxt else None
        else:
            unread.append(f"an answer that is {json_type(result)}, not a page")
            cursor = None
        if cursor is None:
            break
    if problems and notes is not None:
        notes.append(malformed_note(method, problems))
    if unread and notes is not None:
        notes.append(f"{method}: {'; '.join(unread)}: nothing of it listed")
    if len(kept) == 1:
        # One page (the common case): its tuple, with no list in between (a pass over 5,000
        # scattered items fewer, and a free), or `known`'s own (no copy at all).
        listed = tuple(kept[0])
    else:
        items: list[dict[str, Any]] = []
        for part in kept:
            items.extend(part)
        listed = tuple(items)
    table.finish(listed)
    return listed


async def discover(
    upstream: Upstream,
    generation: int,
    timeout: float,
    known: collections.defaultdict[str, KnownItems] | None = None,
) -> Snapshot:
    """Every list the upstream offers; `known`: the entry's items by list (`list_all`)."""
    caps = upstream.server_capabilities
    lists = known if known is not None else collections.defaultdict(KnownItems)
    empty: tuple[dict[str, Any], ...] = ()
    tools = prompts = resources = templates = empty
    notes: list[str] = []
    if "tools" in caps:
        tools = await list_all(upstream, "tools/list", "tools", timeout, notes, lists["tools/list"])
    if "prompts" in caps:
        prompts = await list_all(
            upstream, "prompts/list", "prompts", timeout, notes, lists["prompts/list"]
        )
    if "resources" in caps:
        resources = await list_all(
            upstream, "resources/list", "resources", timeout, notes, lists["resources/list"]
        )
        try:
            templates = await list_all(
                upstream,
                "resources/templates/list",
                "resourceTemplates",
                timeout,
                notes,
                lists["resources/templates/list"],
            )
        except McpoolError:
            templates = empty  # optional: some servers list resources but not templates
    return Snapshot(
        generation=generation,
        available=True,
        tools=tools,
        prompts=prompts,
        resources=resources,
        resource_templates=templates,
        instructions=upstream.instructions,
        capabilities=caps,
        notes=tuple(notes),
    )


def log_audience(
    handles: Sequence[Handle],
    *,
    related: Handle | None,
    stdio: bool,
    cut: Mapping[str, object],
) -> tuple[Handle, ...]:
    """Who is shown an upstream's log message (DESIGN X8; pure): the handles it goes to, each
    as a lossy message; none when it belongs to a session no longer here, or to nobody (then
    it is dropped and counted, never shown to another session).

    A message that belongs to a call goes to that call's session alone. HTTP: a message on
    the response stream of a session's request is that session's (`related`: dropped when it
    is gone); one on the GET stream is unattributable. stdio: the sessions with calls
    at the server now, and those whose calls were cut there (`cut`: cancelled, or their
    session closed, while the server may still be at them: `PoolEntry.call_cut`), are who it
    belongs to: one of them (a session that is still here gets it), or several (it goes to
    those still here: the one it belongs to is among them); `cut` is keyed by session id. An
    unattributable message (stdio with no session's call at the server, the HTTP GET stream)
    goes to every session of the server: only as a lossy message, which never cuts anyone.
    """
    if related is not None:
        return (related,) if any(h is related for h in handles) else ()
    if not stdio:
        return tuple(handles)
    owners = {h.session_id for h in handles if h.in_flight > 0}
    if cut:
        owners.update(cut)
    if not owners:
        return tuple(handles)
    return tuple(h for h in handles if h.session_id in owners)


_LIST_CHANGED = {
    "notifications/tools/list_changed": ("tools", "tools/list", "tools"),
    "notifications/prompts/list_changed": ("prompts", "prompts/list", "prompts"),
    "notifications/resources/list_changed": ("resources", "resources/list", "resources"),
}


class _EntryEvents:
    """The connection's event sink: relists on list_changed, routes progress, fans out the rest."""

    def __init__(self, pool: Pool, entry: PoolEntry) -> None:
        self.pool = pool
        self.entry = entry
        self.upstream: Upstream | None = None
        self.nursery: trio.Nursery | None = None
        self._relisting: dict[str, bool] = {}  # kind -> another relist wanted while one runs
        # list_changed that arrived during discovery: relisted once the first snapshot is out.
        self._deferred: list[tuple[str, str, str]] = []
        self._retry_due: float | None = None  # when held server requests are looked at again

    def started(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        # This connection's events route what waits for an owner (the entry outlives them).
        self.entry.retry_unrouted = self.retry_unrouted
        deferred, self._deferred = self._deferred, []
        for spec in deferred:
            self._schedule_relist(*spec)

    def closed(self) -> None:
        """The connection ended: nothing is relisted for it any more."""
        self.upstream = None
        self.nursery = None
        self._deferred = []
        # Held for want of an owner: their call ended with the connection. And the entry lets
        # go of these events (a cycle through the entry, else, that only the collector ends).
        self.entry.turns.unrouted.clear()
        self.entry.retry_unrouted = no_retry

    def on_notification(self, method: str, params: Raw | UnsetType) -> None:
        entry = self.entry
        if method == "notifications/progress":
            decoded = _decode_params(params)
            route = entry.progress_routes.get(str(decoded.get("progressToken")))
            if route is None:
                # Its call is over, or its session gone: never anyone else's (X8).
                entry.dropped_notifications += 1
                return
            handle, token = route
            decoded["progressToken"] = token
            handle.listener.upstream_notification(entry, method, Raw(msgspec.json.encode(decoded)))
            return
        spec = _LIST_CHANGED.get(method)
        if spec is not None:
            self._schedule_relist(*spec)
            return
        handles = list(entry.handles.values())
        if method == "notifications/message":
            cut: Mapping[str, object] = entry.cut_calls
            if cut:
                now = trio.current_time()
                cut = entry.cut_sessions(now)
                entry.heard(now)  # a flood keeps the calls it belongs to going
            audience = log_audience(
                handles,
                related=getattr(self.upstream, "related_handle", None),
                stdio=entry.identity.kind == "stdio",
                cut=cut,
            )
            if not audience:
                entry.dropped_notifications += 1
            for handle in audience:
                handle.listener.upstream_notification(entry, method, params)
            return
        for handle in handles:
            handle.listener.upstream_notification(entry, method, params)

    def on_server_request(self, upstream: Upstream, msg: Message) -> None:
        """P5: a request from the upstream goes to the session that owns it; one that may be
        several sessions' waits until it is one's; one that is nobody's is refused
        (pool/_turns.py)."""
        entry = self.entry
        handles = list(entry.handles.values())
        # An HTTP upstream knows which request's stream the message came on (P5).
        related = getattr(upstream, "related_handle", None)
        if related is not None and any(h is related for h in handles):
            self._deliver(related, upstream, msg)
            return
        if entry.identity.scope == "session" and len(handles) == 1:
            self._deliver(handles[0], upstream, msg)
            return
        if entry.identity.kind == "stdio" and not entry.turns.on:
            # From now on calls from different sessions go in turn, so each request it sends
            # has one owner (pool/_turns.py).
            entry.turns.on = True
            self.pool.log(
                "info",
                f"server '{entry.name}' asks its clients things during calls: calls to it "
                "from different sessions now go in turn",
                server=entry.name,
            )
        self._attribute(upstream, msg, handles, held=False)

    def _attribute(
        self, upstream: Upstream, msg: Message, handles: list[Handle], *, held: bool
    ) -> bool:
        """Route, hold or refuse one server request; True once it is no longer held."""
        entry = self.entry
        cut = entry.cut_sessions(trio.current_time()) if entry.cut_calls else {}
        verdict, owner, reason = attribute(handles, cut)
        if verdict is Verdict.HOLD and entry.identity.kind == "stdio":
            if held or len(entry.turns.unrouted) < MAX_UNROUTED:
                if not held:
                    entry.turns.unrouted.append((upstream, msg))
                self._retry_when_cut_ends(cut)
                return False
            reason = f"{MAX_UNROUTED} requests from it already wait for their session"
        if owner is not None:
            self._deliver(owner, upstream, msg)
            return True
        if entry.name not in self.pool._advised:
            self.pool._advised.add(entry.name)
            self.pool.log(
                "warning",
                f"server '{entry.name}' sent {msg.method} that no session owns ({reason})",
                server=entry.name,
            )
        upstream.respond_error(
            msg.id,
            INVALID_PARAMS,
            f"mcpool cannot route {msg.method} from server '{entry.name}' to a session",
            {"server": entry.name, "reason": reason},
        )
        return True

    def retry_unrouted(self) -> None:
        """Calls ended (or cut ones went quiet): the held requests that have one owner now go."""
        entry = self.entry
        waiting, entry.turns.unrouted = entry.turns.unrouted, []
        handles = list(entry.handles.values())
        for upstream, msg in waiting:
            if not upstream.alive or upstream is not entry.upstream:
                continue  # its connection is gone, and its call with it
            if not self._attribute(upstream, msg, handles, held=True):
                entry.turns.unrouted.append((upstream, msg))

    def _retry_when_cut_ends(self, cut: Mapping[str, tuple[float, float]]) -> None:
        """A held request that a cut call may own is looked at again when that cut is over
        (no call's end may come: the other session's call may be waiting on this request)."""
        if not cut or self.nursery is None:
            return
        when = min(until for until, _ in cut.values())
        if self._retry_due is None or when < self._retry_due:
            self._retry_due = when  # one timer at a time: the earliest wanted
            self.nursery.start_soon(self._retry_at, when)

    async def _retry_at(self, when: float) -> None:
        await trio.sleep_until(when)
        if self._retry_due != when:
            return  # an earlier one was wanted since, and has run
        self._retry_due = None
        if self.entry.turns.unrouted:
            self.retry_unrouted()

    def _deliver(self, owner: Handle, upstream: Upstream, msg: Message) -> None:
        refusal = owner.listener.server_request(self.entry, upstream, msg)
        if refusal is not None:
            upstream.respond_error(
                msg.id, INVALID_PARAMS, refusal, {"server": self.entry.name, "reason": refusal}
            )

    def _schedule_relist(self, kind: str, method: str, field: str) -> None:
        if kind in self._relisting:
            self._relisting[kind] = True
            return
        if self.nursery is None or self.upstream is None:
            if (kind, method, field) not in self._deferred:
                self._deferred.append((kind, method, field))
            return
        self._relisting[kind] = False
        self.nursery.start_soon(self._relist, kind, method, field)

    async def _relist(self, kind: str, method: str, field: str) -> None:
        upstream = self.upstream
        assert upstream is not None
        timeout = _start_timeout(self.entry)
        try:
            while True:
                self._relisting[kind] = False
                notes: list[str] = []
                try:
                    known = self.entry.known_items
                    items = await list_all(upstream, method, field, timeout, notes, known[method])
                    templates = None
                    if kind == "resources":
                        try:
                            templates = await list_all(
                                upstream,
                                "resources/templates/list",
                                "resourceTemplates",
                                timeout,
                                notes,
                                known["resources/templates/list"],
                            )
                        except McpoolError:
                            templates = None
                except McpoolError:
                    return
                if self.entry.upstream is not upstream:
                    return
                snap = self.entry.snapshot
                # This list's notes replace its old ones; the other lists' stay.
                relisted = (
                    (method, "resources/templates/list") if kind == "resources" else (method,)
                )
                kept = [n for n in snap.notes if not n.startswith(tuple(f"{m}:" for m in relisted))]
                changes: dict[str, Any] = {field: items, "notes": (*kept, *notes)}
                if templates is not None:
                    changes["resource_templates"] = templates
                for note in notes:
                    if note not in snap.notes:
                        self.pool.log("warning", f"server '{self.entry.name}': {note}")
                fresh = msgspec.structs.replace(snap, generation=snap.generation + 1, **changes)
                self.entry.publish(fresh)
                self.pool._remember(self.entry, fresh)
                self.pool._store_snapshot(self.entry, upstream, fresh)
                if not self._relisting.get(kind):
                    return
        finally:
            self._relisting.pop(kind, None)


# A snapshot's list fields and the methods that list them (`KnownItems.encoded`).
_STORED_LISTS = (
    ("tools", "tools/list"),
    ("prompts", "prompts/list"),
    ("resources", "resources/list"),
    ("resource_templates", "resources/templates/list"),
)


def _json(value: Any) -> bytes:
    return msgspec.json.encode(value)


def _ignore(msg: Message) -> None:
    pass


def _restore_shared_state(entry: PoolEntry, upstream: Upstream) -> None:
    """After a (re)start: the level and subscriptions the sessions asked for apply again."""
    _tell_shared_state(upstream, entry.effective_log_level(), sorted(entry.subscribed_uris()))


def _tell_shared_state(upstream: Upstream, level: str | None, uris: Iterable[str]) -> None:
    """The upstream is told the level and subscriptions its sessions hold (None: no change)."""
    if level is not None:
        upstream.send_request("logging/setLevel", _json({"level": level}), _ignore)
    for uri in uris:
        upstream.send_request("resources/subscribe", _json({"uri": uri}), _ignore)


def _decode_params(params: Raw | UnsetType) -> dict[str, Any]:
    """An upstream's notification params; a malformed one is treated as empty, not fatal."""
    try:
        return decode_params(params)
    except McpoolError:
        return {}


__all__ = [
    "EntryListener",
    "EntryState",
    "Handle",
    "Pool",
    "PoolEntry",
    "PoolOptions",
    "RefreshRejected",
    "Snapshot",
]
