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
  `handle_line`; `Requests._handle` answers an unexpected exception in one request with an internal
  error (logged with its traceback) and the session goes on, and the daemon's per-connection
  fence ends only this connection for anything that escapes;
- an upstream's reader task, shared by every session of that server, runs `_InFlight.__call__`
  (a reply), `upstream_notification`, `server_request` and `views_changed` (a relist); each
  catches whatever it raises, logs it with its traceback and closes only this session
  (`Session.fault`), and `Upstream._dispatch` fences every callback once more;
- the notifier task runs inside the connection's nursery, under the same per-connection fence.

`close` answers every request still in flight (forwarded, listen streams, the backlog) with a
SESSION_CLOSING error naming the reason before the session lets go, so on SIGTERM every call
gets an answer while the client can still read one.

The session is built of objects that each own their state, dependencies one way (the picture is in
docs/architecture.md): `Requests` (the method table, the backlog, page walks) reads the `Catalog`
(views, generations, settings, the notifier), forwards through the `Flights` (what is in flight
with the upstreams, and what they send the client) and answers through the `ClientLink` (the
client's protocol state and every write to it). `Session` builds them and is what the daemon, the
pool (as each view's `ViewOwner`) and the catalog (as its `CatalogOwner`) meet; those two, and
the link's and everyone's fault callbacks, hold it through a weak proxy, so nothing it owns
keeps it alive and a closed session needs no cycle broken by hand.
"""

from __future__ import annotations

import contextlib
import itertools
import traceback
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from msgspec import Raw, UnsetType

from mcpool.pool import Pool, Upstream
from mcpool.protocol import SESSION_CLOSING, McpoolError, Message

from ._catalog import Catalog
from ._cursors import CursorBook
from ._flight import _InFlight, _Listen
from ._flights import Flights
from ._interner import UNSHARED, Interner
from ._link import ClientLink, SessionLog, Writer, _no_log
from ._login_notice import LoginDesk
from ._observe import CallObserver
from ._pins import NO_PINS, PinDesk
from ._reconcile import Desired
from ._registry import RegistryGeneration, Route
from ._requests import NO_SEARCH, Requests
from ._toolsearch import ToolSearchSettings
from ._view import SessionView

DEFAULT_PAGE_SIZE = 500  # most clients read one page; the SDK clients follow cursors


_session_ids = itertools.count(1)


def new_session_id() -> str:
    return f"s{next(_session_ids)}"


def _always(level: str) -> bool:
    return True


def _never(level: str) -> bool:
    return False


class Session:
    """One attached client's session: builds its objects and is what the daemon meets."""

    # Slots: a daemon holds one Session per attached window, many of them idle.
    __slots__ = (
        "__weakref__",  # what a leak hunt (and its test) watches a closed session with
        "_log",
        "_observer",
        "attached_at",
        "catalog",
        "cwd",
        "flights",
        "handle_line",
        "id",
        "link",
        "name",
        "on_close",
        "requests",
    )

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
        interner: Interner | None = None,
        observer: CallObserver | None = None,
        pins: PinDesk = NO_PINS,
        tool_search: ToolSearchSettings | None = None,
    ) -> None:
        self.id = session_id
        self.name = name
        self.cwd = cwd
        self.attached_at = attached_at
        self._log: SessionLog = log if log is not None else _no_log
        self.on_close: Callable[[Session], None] | None = None
        # What the session owns meets it through a weak proxy: nothing below holds it strongly,
        # so a closed session, its views and handles go by reference counting alone (the daemon
        # freezes its heap and collects seldom) and no cycle is broken by hand on close.
        up: Session = weakref.proxy(self)

        def fault(where: str, exc: BaseException) -> None:
            with contextlib.suppress(ReferenceError):  # a session no one holds is past faults
                up.fault(where, exc)

        def broken(reason: str) -> None:
            with contextlib.suppress(ReferenceError):
                up.close(reason)

        self.link = ClientLink(session_id, out, self._log, broken)
        # The daemon's ledger, if any: the session's answered calls go on its tape.
        self._observer = observer
        self.flights = Flights(
            session_id,
            self.link,
            log=self._log,
            fault=fault,
            logins=logins,
            tape=observer.open_tape(session_id) if observer is not None else None,
            folder=cwd,
        )
        self.catalog = Catalog(
            session_id,
            pool,
            self.link,
            self.flights,
            up,
            log=self._log,
            log_enabled=log_enabled or (_never if log is None else _always),
            fault=fault,
            # The daemon's; a session made alone (tests, tools) shares the unshared one.
            interner=interner if interner is not None else UNSHARED,
            pins=pins,
        )
        # The daemon's book of listed lists, shared by its sessions (pages are cached on shared
        # lists); a session made alone keeps its own.
        self.requests = Requests(
            session_id,
            self.link,
            self.catalog,
            self.flights,
            cursors=cursors if cursors is not None else CursorBook(trio.current_time),
            page_size=page_size,
            log=self._log,
            tool_search=tool_search if tool_search is not None else NO_SEARCH,
        )
        # The daemon's connection task calls this for every line: bound once.
        self.handle_line: Callable[[bytes], None] = self.requests.handle_line

    # -- as its views (ViewOwner) and its catalog (CatalogOwner) meet it ------------------------

    def tool_search(self) -> dict[str, Any]:
        """`daemonctl sessions`: the session's search mode, whether it is on for what it is
        served now, and the definition bytes its lists did not send."""
        search = self.requests.search
        return {
            "mode": search.settings.mode,
            "on": self.requests.search_on(self.catalog.registry.tools),
            "spared_bytes": search.spared_bytes,
        }

    @property
    def name_budget(self) -> int:
        return self.catalog.name_budget

    def views_changed(self, reason: str = "upstream") -> None:
        self.catalog.views_changed(reason)

    def upstream_notification(
        self, view: SessionView, method: str, params: Raw | UnsetType
    ) -> None:
        self.flights.upstream_notification(view, method, params)

    def server_request(self, view: SessionView, upstream: Upstream, msg: Message) -> str | None:
        return self.flights.server_request(view, upstream, msg)

    def servers_leased(self) -> None:
        self.requests.answer_openers()

    def first_generation(self) -> None:
        self.requests.replay_backlog()

    def fault(self, where: str, exc: BaseException) -> None:
        """An unexpected exception in session code run by a task others share: log it with
        its traceback and close this session only."""
        trace = "".join(traceback.format_exception(exc)).rstrip()
        self._log(f"session {self.id}: internal error in {where}; session closed\n{trace}")
        self.close(f"internal error in mcpool while handling {where} (see the daemon log)")

    # -- as the daemon meets it -----------------------------------------------------------------

    def close(self, reason: str) -> None:
        """Every request still waiting (forwarded, a listen stream, parked, the backlog) gets a
        SESSION_CLOSING error naming `reason`, in one write (a client that can no longer read
        loses nothing it could have had, and one that can, on SIGTERM or an oversized line,
        hears why); then nothing an upstream waits on is left, the leases go, and the session
        lets go of what points back at it."""
        link = self.link
        if not link.shut(reason):
            return
        closing = McpoolError(reason, message=f"Session closed: {reason}", code=SESSION_CLOSING)
        link.write_last(
            self.flights.unfinished_lines(closing) + self.requests.backlog_lines(closing)
        )
        self.flights.close(reason)
        tape, self.flights.tape = self.flights.tape, None
        if tape is not None and self._observer is not None:
            self._observer.close_tape(tape)
        self.catalog.close()
        on_close, self.on_close = self.on_close, None
        if on_close is not None:
            on_close(self)
        self.spawn = None  # the connection's nursery: nothing is started for it any more

    def handle_message(self, msg: Message) -> None:
        self.requests.handle_message(msg)

    async def apply_settings(
        self, desired: dict[str, Desired], settings_generation: int
    ) -> list[tuple[str, str]]:
        return await self.catalog.apply_settings(desired, settings_generation)

    def set_name_budget(self, *, explicit: int | None, configured: int | None) -> None:
        self.catalog.set_name_budget(explicit=explicit, configured=configured)

    def rebuild(self, reason: str = "settings") -> None:
        self.catalog.rebuild(reason)

    async def run_notifier(self) -> None:
        await self.catalog.run_notifier()

    def release_all(self) -> None:
        self.catalog.release_all()

    def holds(self, view: SessionView) -> bool:
        return self.catalog.holds(view)

    def refusal(self, route: Route) -> str | None:
        return self.catalog.refusal(route)

    @property
    def awaiting_retry(self) -> bool:
        return self.flights.awaiting_retry

    def holds_state(self, state: Any) -> bool:
        return self.flights.holds_state(state)

    @property
    def spawn(self) -> Callable[[Callable[[], Awaitable[None]]], None] | None:
        return self.catalog.spawn

    @spawn.setter
    def spawn(self, spawn: Callable[[Callable[[], Awaitable[None]]], None] | None) -> None:
        """The connection's nursery: the notifier, a held call's timer and a login notice run
        there (without one, the owner runs `run_notifier()`)."""
        self.catalog.spawn = spawn
        self.flights.spawn = spawn

    @property
    def request_headers(self) -> dict[str, str] | None:
        return self.link.request_headers

    @request_headers.setter
    def request_headers(self, headers: dict[str, str] | None) -> None:
        self.link.request_headers = headers

    # -- read by the daemon's displays and the tests --------------------------------------------

    @property
    def pool(self) -> Pool:
        return self.catalog.pool

    @property
    def out(self) -> Writer:
        return self.link.out

    @property
    def views(self) -> dict[str, SessionView]:
        return self.catalog.views

    @property
    def registry(self) -> RegistryGeneration:
        return self.catalog.registry

    @property
    def registry_errors(self) -> dict[str, str]:
        return self.catalog.registry_errors

    @property
    def last_error(self) -> str | None:
        return self.catalog.last_error

    @property
    def ready(self) -> bool:
        return self.catalog.ready

    @property
    def settings_generation(self) -> int:
        return self.catalog.settings_generation

    @property
    def pending_kinds(self) -> set[str]:
        return self.catalog.pending_kinds

    @property
    def notifications_sent(self) -> int:
        return self.catalog.notifications_sent

    @property
    def era(self) -> str | None:
        return self.link.era

    @property
    def protocol_version(self) -> str | None:
        return self.link.protocol_version

    @property
    def client_capabilities(self) -> dict[str, Any]:
        return self.link.client_capabilities

    @property
    def client_info(self) -> dict[str, Any]:
        return self.link.client_info

    @property
    def log_level(self) -> str | None:
        return self.link.log_level

    @property
    def initialize_answered(self) -> bool:
        return self.link.initialize_answered

    @property
    def initialized(self) -> bool:
        return self.link.initialized

    @property
    def closed(self) -> bool:
        return self.link.closed

    @property
    def close_reason(self) -> str | None:
        return self.link.close_reason

    @property
    def lossy_dropped(self) -> int:
        return self.link.lossy_dropped

    @property
    def inflight(self) -> dict[Any, _InFlight]:
        return self.flights.inflight

    @property
    def listens(self) -> dict[Any, _Listen]:
        return self.flights.listens

    @property
    def subscriptions(self) -> set[str]:
        return self.flights.subscriptions

    @property
    def cursors(self) -> CursorBook[tuple[dict[str, Any], ...]]:
        return self.requests.cursors

    @property
    def page_size(self) -> int:
        return self.requests.page_size
