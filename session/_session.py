"""One attached client: its views, its registry generation, routing and notifications.

Theory of operation: the daemon feeds each line the client sends to `Session.handle_line` and
gives the session an `out` writer. Everything here is synchronous except `apply_settings` (which
waits for new entries' first start) and the notifier task, so routing a call is: decode the
envelope, look the exposed name up in the one captured `RegistryGeneration`, rewrite name and
progress token, and write to the upstream's pipe — no task switch (S2: a request never mixes
two generations).

`initialize` is answered at once: it needs no upstream (L6), only the session's first
reconciliation, which leases its servers without waiting for any (so its instructions are those
of the servers already up). Until its first generation exists the session keeps the client's
other messages (ping aside) in a backlog, so its first tools/list sees its servers rather than an
empty list; that first generation is built once every new server is up or its entry's startup
budget is spent (`PoolOptions.startup_budget`), whichever comes first. A late server then
arrives like any other change: registry changes are published by one reference swap, compared
canonically per list kind, and announced by the notifier task: only changed kinds, never for
the first generation, only after `notifications/initialized`, coalesced while the socket has
unsent data (S5). A call, read or get routed to a server that is not up yet
(standby, or its first start still running) waits for that start (bounded by the start's own
timeout), parked on the entry; it is answered with an error naming the server if the start fails.

Both protocol eras are served on the same socket (DESIGN P1, `_eras`): a session's first
request decides its era. A 2026-07-28 session has no handshake; every request carries its
envelope, every result its `resultType`, and its list_changed and resources/updated travel on
the `subscriptions/listen` streams it opened (stamped with the stream's id) instead of
unsolicited. Results crossing eras (a modern session on a handshake-era upstream, or the other
way) are translated on their way back by a `ResultPlan`; a handshake-era session on a
handshake-era upstream builds none, so its tools/call answer is still passed through as bytes.

Input is typed at this boundary (`_params`): a request's params are decoded once into the dict
that is forwarded and converted into the method's Struct that mcpool reads, so a wrong type is
an invalid-params error to the sender naming the field, and a bad notification is dropped with
a log line. A request whose id is already in flight (or names an open listen stream) is refused;
a batch's answers are collected by the `Batch` each member carries, so duplicate ids, cancelled
members or members answered out of order never hang or mix batches.

Which tasks run session code, and how each is fenced (one failing session never takes down a
task that others depend on):
- the session's connection task (`Daemon._run_session`, or an HTTP request task) runs
  `handle_line`; `_handle` answers an unexpected exception in one request with an internal
  error (logged with its traceback) and the session goes on, and the daemon's per-connection
  fence ends only this connection for anything that escapes;
- an upstream's reader task, shared by every session of that server, runs `_InFlight.__call__`
  (a reply), `upstream_notification`, `server_request` and `views_changed` (a relist); each
  catches whatever it raises, logs it with its traceback and closes only this session
  (`_fault`), and `Upstream._dispatch` fences every callback once more;
- the notifier task runs inside the connection's nursery, under the same per-connection fence.

`close` answers every request still in flight (forwarded, listen streams, the backlog) with a
SESSION_CLOSING error naming the reason before the session lets go, so on SIGTERM every call
gets an answer while the client can still read one.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from mcpool.pool import Pool
from mcpool.protocol import Message

from ._core import _NO_PARKED
from ._cursors import CursorBook
from ._eras import Batch
from ._flight import SessionLog, Writer, _InFlight, _Listen, _no_log, _Relayed
from ._forwarding import _Resume
from ._login_notice import LoginDesk
from ._names import MAX_NAME
from ._registry import RegistryGeneration, empty_generation
from ._requests import SessionRequests
from ._view import SessionView

DEFAULT_PAGE_SIZE = 500  # most clients read one page; the SDK clients follow cursors


_session_ids = itertools.count(1)


def new_session_id() -> str:
    return f"s{next(_session_ids)}"


def _always(level: str) -> bool:
    return True


def _never(level: str) -> bool:
    return False


class Session(SessionRequests):
    __slots__ = ()  # SessionCore holds the slots

    def __init__(
        self,
        session_id: str,
        *,
        name: str,
        cwd: str | None,
        pool: Pool,
        out: Writer,
        page_size: int = DEFAULT_PAGE_SIZE,
        log: SessionLog | None = None,
        attached_at: float = 0.0,
        log_enabled: Callable[[str], bool] | None = None,
        logins: LoginDesk | None = None,
        cursors: CursorBook[tuple[dict[str, Any], ...]] | None = None,
    ) -> None:
        self.id = session_id
        self.name = name
        self.cwd = cwd
        self.pool = pool
        self.out = out
        self.page_size = page_size
        self._log: SessionLog = log if log is not None else _no_log
        self._log_enabled = log_enabled or (_never if log is None else _always)
        self.attached_at = attached_at
        self.views: dict[str, SessionView] = {}
        # The longest exposed name this session's client takes (session/_names.py): decided by
        # `set_name_budget` and again when the client says who it is.
        self.name_budget = MAX_NAME
        self._budget_settings: tuple[int | None, int | None] = (None, None)
        self.registry: RegistryGeneration = empty_generation()
        self._signature: tuple[Any, ...] = ()
        self.ready = False
        # The first reconciliation has leased the servers (initialize may be answered).
        self._views_known = False
        # Messages before the first generation, each with the batch it came in (if any).
        self._backlog: list[tuple[Message, Batch | None]] = []
        self.initialize_answered = False
        self.initialized = False
        self.protocol_version: str | None = None
        self.client_capabilities: dict[str, Any] = {}
        self.client_info: dict[str, Any] = {}
        self.inflight: dict[Any, _InFlight] = {}
        self.pending_kinds: set[str] = set()
        self._notify_wake = trio.Event()
        # With `spawn` set (the daemon's connections), a notifier task exists only while
        # notifications are pending; without it the owner runs `run_notifier()`.
        self.spawn: Callable[[Callable[[], Awaitable[None]]], None] | None = None
        self._notifying = False
        self.settings_generation = 0
        self._reconciling = False
        self._dirty = False
        self.last_error: str | None = None
        # Server -> why its part of the latest candidate was rejected (S3, S8); `last_error`
        # joins them for one-line displays.
        self.registry_errors: dict[str, str] = {}
        self.subscriptions: set[str] = set()
        self.log_level: str | None = None
        self.closed = False
        self.close_reason: str | None = None
        self.on_close: Callable[[Session], None] | None = None
        self.notifications_sent = 0
        # Log and progress messages dropped while its client was behind (`send_lossy`).
        self.lossy_dropped = 0
        self.relayed: dict[str, _Relayed] = {}
        self._relay_ids = itertools.count(1)
        # None until the first request decides it (P1): HANDSHAKE or MODERN.
        self.era: str | None = None
        # A 2026-07-28 HTTP request's headers (lowercase names), set by the endpoint for the
        # request's own session: a tools/call's Mcp-Param-* are checked against the tool it calls.
        self.request_headers: dict[str, str] | None = None
        self.listens: dict[Any, _Listen] = {}  # modern: open listen streams by request id
        # While a batch member is being handled: the batch its synchronous answer joins.
        self._batch: Batch | None = None
        self._dropped: set[str] = set()  # kinds of dropped input already logged (once each)
        # Requests waiting for their server's first start: client id -> its waiter (`_Resume`,
        # which holds its batch); a dict only once one waits (most sessions never have one).
        self._parked: dict[Any, _Resume] = _NO_PARKED
        # Modern calls held for the client's retry with its input (session/_input.py), and
        # whether the task that ends those whose retry never comes is running.
        self._holding: list[_InFlight] = []
        self._hold_timer = False
        # Where a login-needing server's login is started for the client (issue 28), if the
        # daemon gives one: the client that declared URL elicitation is asked to open it.
        self.logins: LoginDesk | None = logins
        self._login_told: dict[str, bool] = {}
        # The daemon's book of listed lists, shared by its sessions (pages are cached on shared
        # lists); a session made alone keeps its own.
        self.cursors = cursors if cursors is not None else CursorBook(trio.current_time)
        self._walks: tuple[int, ...] = ()
