"""Pool entries: explicit states, leases, snapshots, and the pure decisions about them.

Theory of operation: a `PoolEntry` is one upstream server as the pool knows it, under a frozen
`EntryKey` (`name::fingerprint`, or `name::unpooled-N` for session-scoped servers, I3). It has an
explicit `EntryState`, changed only through `transition()` and the table below, and a lease
count: every `Handle` handed out is a lease from the moment it is created (httpcore's "assigned
but not yet used" counts). Each entry publishes immutable `Snapshot`s with a generation number;
readers capture one reference per operation (S1), and nothing ever mutates a published one.

The drain timing (L2) is one pure function, `close_deadline()`, so MockClock tests drive it
without an upstream in sight.
"""

from __future__ import annotations

import collections
import enum
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import trio
from msgspec import Raw, UnsetType

from mcpool.protocol import Message

from ._reuse import KnownItems
from ._shared import SharedCounts
from ._snapshot import Snapshot
from ._spec import ServerSettings, TransportIdentity
from ._turns import Turns

if TYPE_CHECKING:
    from ._snapshots import StoredSnapshot
    from ._upstream import Upstream


class EntryState(enum.Enum):
    # `"start": "lazy"` with a known snapshot: served from it, no process until a request needs one.
    STANDBY = "standby"
    SPAWNING = "spawning"
    ACTIVE = "active"
    DRAINING = "draining"
    RESTARTING = "restarting"
    CRASH_LOOP = "crash-loop"
    NEEDS_LOGIN = "needs-login"  # an OAuth server waits for `daemonctl login` (issue 16)
    CLOSED = "closed"
    FAILED = "failed"


TERMINAL_STATES = frozenset({EntryState.CLOSED, EntryState.FAILED})

# Sessions whose cancelled calls an entry remembers (`PoolEntry.call_cut`): the newest ones.
MAX_CUT_CALLS = 256
# A cut call is taken to be over once its server has said nothing for this long (a server that
# honours the cancel stops at once) or its time limit passed; a flood keeps it going.
CUT_CALL_QUIET = 5.0

# RFC 5424 severities as MCP names them, most verbose first.
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


class EntryEvent(enum.Enum):
    READY = "ready"  # handshake and discovery done
    LEASED = "leased"  # refs went 0 -> 1
    IDLE = "idle"  # refs went 1 -> 0
    CRASHED = "crashed"  # the upstream exited or failed to start; a restart follows
    CRASH_LOOP = "crash-loop"  # too many failures in the window
    RESTART = "restart"  # a restart attempt begins (after backoff, or asked for)
    CLOSE = "close"  # drained, shut down, or the daemon stops
    GIVE_UP = "give-up"  # a failure with no restart (settings are invalid)
    NEEDS_LOGIN = "needs-login"  # the server refused us until the user logs in
    WAKE = "wake"  # a standby entry's process is needed (a call, a read, a get)


_S, _E = EntryState, EntryEvent
# (state, event) -> next state. A pair not listed is a no-op, never an error: e.g. LEASED while
# spawning leaves it spawning. READY settles on ACTIVE or DRAINING by the lease count (below).
TRANSITIONS: dict[tuple[EntryState, EntryEvent], EntryState] = {
    (_S.STANDBY, _E.WAKE): _S.SPAWNING,
    (_S.SPAWNING, _E.READY): _S.ACTIVE,
    (_S.RESTARTING, _E.READY): _S.ACTIVE,
    (_S.ACTIVE, _E.IDLE): _S.DRAINING,
    (_S.DRAINING, _E.LEASED): _S.ACTIVE,
    (_S.SPAWNING, _E.CRASHED): _S.RESTARTING,
    (_S.ACTIVE, _E.CRASHED): _S.RESTARTING,
    (_S.DRAINING, _E.CRASHED): _S.RESTARTING,
    (_S.RESTARTING, _E.CRASHED): _S.RESTARTING,
    (_S.SPAWNING, _E.CRASH_LOOP): _S.CRASH_LOOP,
    (_S.RESTARTING, _E.CRASH_LOOP): _S.CRASH_LOOP,
    (_S.ACTIVE, _E.CRASH_LOOP): _S.CRASH_LOOP,
    (_S.DRAINING, _E.CRASH_LOOP): _S.CRASH_LOOP,
    (_S.CRASH_LOOP, _E.RESTART): _S.RESTARTING,
    (_S.ACTIVE, _E.RESTART): _S.RESTARTING,
    (_S.DRAINING, _E.RESTART): _S.RESTARTING,
    **{(s, _E.NEEDS_LOGIN): _S.NEEDS_LOGIN for s in (_S.SPAWNING, _S.RESTARTING, _S.ACTIVE)},
    (_S.DRAINING, _E.NEEDS_LOGIN): _S.NEEDS_LOGIN,
    (_S.NEEDS_LOGIN, _E.RESTART): _S.RESTARTING,
    (_S.SPAWNING, _E.GIVE_UP): _S.FAILED,
    (_S.RESTARTING, _E.GIVE_UP): _S.FAILED,
    **{(s, _E.CLOSE): _S.CLOSED for s in EntryState if s not in TERMINAL_STATES},
}


def transition(state: EntryState, event: EntryEvent, *, leases: int) -> EntryState:
    nxt = TRANSITIONS.get((state, event), state)
    if nxt is EntryState.ACTIVE and event is EntryEvent.READY and leases == 0:
        return EntryState.DRAINING
    return nxt


def close_deadline(*, now: float, idle_since: float, drain_grace: float, max_idle: float) -> float:
    """When an entry that just became idle closes (L2).

    The drain grace counts from this idle moment; the max-idle cap counts from the first idle
    moment of the current idle stretch (`idle_since`), which attach/detach flapping does not
    reset (see `next_idle_since`).
    """
    return min(now + drain_grace, idle_since + max_idle)


def next_idle_since(
    *, now: float, idle_since: float | None, leased_since: float | None, drain_grace: float
) -> float:
    """The start of the idle stretch an entry enters now that its last lease went away.

    A lease held at least as long as the drain grace was real use and starts a new stretch;
    shorter ones (attach/detach flapping) keep the stretch that was already running.
    """
    if idle_since is None:
        return now
    if leased_since is not None and now - leased_since >= drain_grace:
        return now
    return idle_since


class EntryKey(msgspec.Struct, frozen=True):
    name: str
    discriminator: str  # the fingerprint, or "unpooled-N"

    @property
    def lifecycle_id(self) -> str:
        return f"{self.name}::{self.discriminator}"


# What a handle's listener is told, as an upstream notification of this (mcpool's own) method,
# when its entry needs the user's OAuth login: the session tells its client (issue 28).
LOGIN_NEEDED = "mcpool/needs-login"


class EntryListener(Protocol):
    """The opaque view callback a handle carries (the pool knows nothing else of sessions)."""

    def snapshot_changed(self, entry: PoolEntry) -> None: ...

    def upstream_notification(
        self, entry: PoolEntry, method: str, params: Raw | UnsetType
    ) -> None: ...

    def server_request(self, entry: PoolEntry, upstream: Upstream, msg: Message) -> str | None:
        """Relay a server-to-client request; None when relayed, else why not (an error)."""
        ...


class _NoListener:
    """The listener of a released handle nothing reaches any more (`PoolEntry.let_go`): were
    anything to, it would be dropped; and the handle no longer keeps its session alive."""

    __slots__ = ()

    def snapshot_changed(self, entry: PoolEntry) -> None:
        pass

    def upstream_notification(self, entry: PoolEntry, method: str, params: Raw | UnsetType) -> None:
        pass

    def server_request(self, entry: PoolEntry, upstream: Upstream, msg: Message) -> str | None:
        return "the session that held this lease has gone"


NO_LISTENER: EntryListener = _NoListener()

_NO_URIS: frozenset[str] = frozenset()


class Handle:
    """One session's lease on one entry. Identity and settings are captured copies (I2)."""

    __slots__ = (
        "__weakref__",  # what a leak hunt (and its test) watches a released handle with
        "_log_level",
        "entry",
        "handle_id",
        "identity",
        "in_flight",
        "listener",
        "progress_out",
        "released",
        "session_id",
        "settings",
        "subscriptions",
    )

    def __init__(
        self,
        entry: PoolEntry,
        session_id: str,
        identity: TransportIdentity,
        settings: ServerSettings,
        listener: EntryListener,
    ) -> None:
        self.entry = entry
        self.session_id = session_id
        self.identity = identity
        self.settings = settings
        self.listener = listener
        self.released = False
        # Requests of this session now at the upstream: how server-to-client requests from a
        # shared handshake-era upstream find their session (P5).
        self.in_flight = 0
        # Its entries in entry.progress_routes (its calls out with a progress token): only
        # those still reach it once it is released (`PoolEntry.let_go`).
        self.progress_out = 0
        self._log_level: str | None = None
        # A set only once the session subscribes to something (most never do).
        self.subscriptions: set[str] | frozenset[str] = _NO_URIS
        # Its key in entry.handles while it holds a lease there (PoolEntry.add_handle); only
        # then does it count in the entry's shared level and subscriptions.
        self.handle_id: int | None = None

    @property
    def log_level(self) -> str | None:
        return self._log_level

    @log_level.setter
    def log_level(self, level: str | None) -> None:
        if self.handle_id is not None:
            self.entry.shared.move_level(self._log_level, level)
        self._log_level = level

    @property
    def lifecycle_id(self) -> str:
        return self.entry.key.lifecycle_id


def no_retry() -> None:
    """An entry's `retry_unrouted` while no connection's events are there (pool/_pool.py)."""


class PoolEntry:
    def __init__(
        self, key: EntryKey, identity: TransportIdentity, settings: ServerSettings
    ) -> None:
        self.key = key
        self.identity = identity
        self.settings = settings
        self.state = EntryState.SPAWNING
        self.handles: dict[int, Handle] = {}
        # The member handles' levels and subscriptions, counted (O(1) detach, pool/_shared.py).
        self.shared = SharedCounts()
        self.snapshot = Snapshot(generation=0)
        # Per list method: its items of the last listing by encoding, so a relist keeps the
        # unchanged ones' objects (pool/_reuse.py).
        self.known_items: collections.defaultdict[str, KnownItems] = collections.defaultdict(
            KnownItems
        )
        self.upstream: Upstream | None = None
        self.ready = trio.Event()  # set after the first attempt, successful or not
        self.closing = False
        self.close_reason: str | None = None
        # The scope of a start-up in progress: closing the entry cancels it (L4 still applies).
        self.starting: trio.CancelScope | None = None
        self.restarts = 0
        self.last_error: str | None = None
        self.failures: list[float] = []
        # Crash-loop bookkeeping (trio time): when the cooldown retry is due (None when not in
        # crash-loop), whether the entry has crash-looped since it last stayed up, and when the
        # current connection became ready.
        self.retry_at: float | None = None
        self.crash_looped = False
        self.up_since: float | None = None
        self.idle_since: float | None = None
        self.leased_since: float | None = None
        self.deadline = math.inf
        self.deadline_moved = trio.Event()
        self.restart_requested = trio.Event()
        self.state_changed = trio.Event()  # set (and replaced) on every transition
        self.closed = trio.Event()
        self.progress_routes: dict[str, tuple[Handle, Any]] = {}
        self._next_progress = 1
        # Sessions whose calls were cancelled at the upstream while it may still be working
        # on them (`call_cut`): session id -> (until when, at the latest) in trio time. What
        # a stdio server sends meanwhile is still theirs (X8: pool/_pool.py `log_audience`).
        self.cut_calls: dict[str, tuple[float, float]] = {}
        # Log and progress messages no session could be shown (theirs has gone): dropped.
        self.dropped_notifications = 0
        self.stderr_history: list[str] = []
        self.era: str | None = None  # the era the last connection found (P1: cached per entry)
        self.needs_login = False  # the last connection ended for want of an OAuth login
        self.cannot_start = False  # ...for a reason no retry fixes (protocol CannotStart)
        # The record this entry's snapshot store holds for it (loaded or last saved).
        self.stored: StoredSnapshot | None = None
        # L6: how long a session's first list waits for this entry's first start (trio time).
        self.startup_deadline = -math.inf
        # Never seen up, and not up within a first list's wait on this or an earlier run: no
        # first list waits for it again until it has been up (issue 28; the snapshot store
        # remembers it across runs).
        self.known_slow = False
        self.wake_requested = trio.Event()  # STANDBY: set when a request needs the process
        # Requests parked until the first start attempt ends: called with None once the
        # upstream is up, else with why not (the attempt failed or the entry closed).
        self.waiters: list[Callable[[str | None], None]] = []
        # Calls from different sessions taken in turn once the server has asked a client
        # something, and its requests no session owns yet (issue 29 item 3, pool/_turns.py).
        self.turns = Turns()
        # Set by the connection's events (pool/_pool.py): routes what `turns.unrouted` holds.
        self.retry_unrouted: Callable[[], None] = no_retry

    @property
    def name(self) -> str:
        return self.key.name

    @property
    def lifecycle_id(self) -> str:
        return self.key.lifecycle_id

    @property
    def leases(self) -> int:
        return len(self.handles)

    def fire(self, event: EntryEvent) -> None:
        self.state = transition(self.state, event, leases=self.leases)
        self.state_changed.set()
        self.state_changed = trio.Event()

    def move_deadline(self, deadline: float) -> None:
        self.deadline = deadline
        self.deadline_moved.set()
        self.deadline_moved = trio.Event()

    @property
    def starting_up(self) -> bool:
        """Not up yet, and a request may wait for it: standby, or its first start in progress
        (a restarting or crash-looped entry fails requests at once instead, L3)."""
        return self.upstream is None and self.state in (EntryState.STANDBY, EntryState.SPAWNING)

    def when_up(self, waiter: Callable[[str | None], None]) -> None:
        """Park a request until the upstream is up (a standby entry is woken for it)."""
        self.waiters.append(waiter)
        if self.state is EntryState.STANDBY:
            self.wake_requested.set()

    def settle_waiters(self, error: str | None) -> None:
        """The start attempt ended: run what was parked (each waiter fences itself)."""
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            waiter(error)

    def busy_sessions(self) -> set[str]:
        """The sessions with requests at the upstream now."""
        return {h.session_id for h in self.handles.values() if h.in_flight}

    def may_send(self, session_id: str) -> bool:
        """May this session's request go to the upstream now (`Turns`)? Always, until the
        server has asked a client something."""
        return self.turns.may_go(session_id, self.busy_sessions())

    def calls_ended(self) -> None:
        """A handle's last request at the upstream ended (only called once `turns.on`): what
        was held for want of an owner may have one now, and the next session may go."""
        if self.turns.unrouted:
            self.retry_unrouted()
        while True:
            go = self.turns.passed(self.busy_sessions())
            if not go:
                return
            self.turns.resuming = True
            try:
                for waiter in go:
                    waiter(None)  # each fences itself; a stale one (its session gone) does nothing
            finally:
                self.turns.resuming = False

    def publish(self, snapshot: Snapshot) -> None:
        """Install a new snapshot (one reference swap) and tell every view."""
        self.snapshot = snapshot
        for handle in list(self.handles.values()):
            handle.listener.snapshot_changed(self)

    # -- shared upstream state (P6, logging levels) ----------------------------------------------

    def add_handle(self, handle_id: int, handle: Handle) -> None:
        """A lease: the handle joins, and its level and subscriptions count from now."""
        handle.handle_id = handle_id
        self.handles[handle_id] = handle
        self.shared.join(handle.log_level, handle.subscriptions)

    def remove_handle(self, handle: Handle) -> list[str]:
        """The lease ends; returns the URIs no member holds any more (to unsubscribe)."""
        if handle.handle_id is None or self.handles.get(handle.handle_id) is not handle:
            return []
        del self.handles[handle.handle_id]
        handle.handle_id = None
        return self.shared.leave(handle.log_level, handle.subscriptions)

    def subscribe(self, handle: Handle, uri: str) -> bool:
        """Reference-count a resource subscription; True when the upstream must be told."""
        if uri in handle.subscriptions:
            return False  # held already: counted once per handle
        if not isinstance(handle.subscriptions, set):
            handle.subscriptions = set()
        handle.subscriptions.add(uri)
        if handle.handle_id is None:
            return not self.shared.held(uri)
        return self.shared.hold(uri)

    def unsubscribe(self, handle: Handle, uri: str) -> bool:
        """True when this was the last subscriber and the upstream must be told."""
        if uri not in handle.subscriptions or not isinstance(handle.subscriptions, set):
            return not self.shared.held(uri)
        handle.subscriptions.discard(uri)
        if handle.handle_id is None:
            return not self.shared.held(uri)
        return self.shared.drop(uri)

    def subscribed_uris(self) -> set[str]:
        return self.shared.uris()

    def effective_log_level(self) -> str | None:
        """The most verbose level any session asked for (each session filters its own)."""
        return self.shared.effective_level()

    def call_cut(self, handle: Handle, upstream: Upstream) -> None:
        """A call of `handle`'s session was cancelled at `upstream`, which may go on with it
        (cancelling is advisory): remembered until the server has been quiet CUT_CALL_QUIET
        seconds (`heard`), at most the call's time limit (the newest MAX_CUT_CALLS sessions)."""
        if upstream is not self.upstream:
            return  # (an earlier connection's: nothing of it reaches us any more)
        now = trio.current_time()
        limit = now + upstream.request_timeout
        cut = self.cut_calls
        cut.pop(handle.session_id, None)
        cut[handle.session_id] = (min(limit, now + CUT_CALL_QUIET), limit)
        if len(cut) > MAX_CUT_CALLS:
            del cut[next(iter(cut))]

    def cut_sessions(self, now: float) -> dict[str, tuple[float, float]]:
        """`cut_calls` without those that are over."""
        cut = self.cut_calls
        if cut:
            for session_id in [s for s, (until, _) in cut.items() if until <= now]:
                del cut[session_id]
        return cut

    def heard(self, now: float) -> None:
        """The server sent something while calls were cut: they may still be at work."""
        cut = self.cut_calls
        for session_id, (_, limit) in cut.items():
            cut[session_id] = (min(limit, now + CUT_CALL_QUIET), limit)

    def register_progress(self, handle: Handle, token: Any) -> str:
        """P3: a token unique on this upstream, mapped back to the session's own token."""
        upstream_token = f"mcpool-{self._next_progress}"
        self._next_progress += 1
        self.progress_routes[upstream_token] = (handle, token)
        handle.progress_out += 1
        return upstream_token

    def unregister_progress(self, upstream_token: str) -> None:
        route = self.progress_routes.pop(upstream_token, None)
        if route is not None:
            handle = route[0]
            handle.progress_out -= 1
            if handle.released:
                self.let_go(handle)

    def let_go(self, handle: Handle) -> None:
        """A released handle's listener is needed only by the progress routes of its calls
        still out (nothing else reaches a handle that left `handles`); once none is left, it
        points at NO_LISTENER. A session's view and its handle point at each other (and the
        view at its session): a reference cycle that would keep a closed session, or a view a
        reconciliation let go, alive until a full collection."""
        if not handle.progress_out:  # (a count: a release passes over no other route)
            handle.listener = NO_LISTENER
