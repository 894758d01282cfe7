"""What every room of a session shares: its state (assigned by `Session.__init__`), writing to the
client, answering it, closing, and how a fenced fault or dropped input is logged; and the view
lookups every request makes (`holds`, `_allows`, `_resource_view`).

A room of `Session` (session/_session.py): the rooms form one chain of base classes,
_core <- _forwarding <- _generations <- _requests <- _session, each using only what the rooms
below it define.
"""

from __future__ import annotations

import contextlib
import itertools
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import trio

from mcpool import __version__
from mcpool.pool import Pool
from mcpool.protocol import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    RESOURCE_NOT_FOUND,
    SESSION_CLOSING,
    McpoolError,
    Message,
    error_response,
    response,
)

from ._cursors import CursorBook
from ._eras import MODERN, Batch, modern_result
from ._flight import SessionLog, Writer, _InFlight, _Listen, _Relayed, request_id
from ._input import is_ours
from ._login_notice import LoginDesk
from ._registry import RegistryGeneration, Route, empty_generation
from ._view import SessionView

if TYPE_CHECKING:
    from ._forwarding import _Resume
    from ._session import Session

SERVER_INFO: dict[str, Any] = {"name": "mcpool", "version": __version__}


_NO_PARKED: dict[Any, Any] = {}  # shared and never written: `_park` gives a session its own
_CLOSED_GENERATION = empty_generation()  # what a closed session serves: nothing (never written)


class SessionCore:
    # Slots: a daemon holds one Session per attached window, many of them idle.
    __slots__ = (
        "__weakref__",  # what a leak hunt (and its test) watches a closed session with
        "_backlog",
        "_batch",
        "_budget_settings",
        "_dirty",
        "_dropped",
        "_hold_timer",
        "_holding",
        "_log",
        "_log_enabled",
        "_login_told",
        "_notify_wake",
        "_notifying",
        "_parked",
        "_reconciling",
        "_relay_ids",
        "_signature",
        "_views_known",
        "_walks",
        "attached_at",
        "client_capabilities",
        "client_info",
        "close_reason",
        "closed",
        "cursors",
        "cwd",
        "era",
        "id",
        "inflight",
        "initialize_answered",
        "initialized",
        "last_error",
        "listens",
        "log_level",
        "logins",
        "lossy_dropped",
        "name",
        "name_budget",
        "notifications_sent",
        "on_close",
        "out",
        "page_size",
        "pending_kinds",
        "pool",
        "protocol_version",
        "ready",
        "registry",
        "registry_errors",
        "relayed",
        "request_headers",
        "settings_generation",
        "spawn",
        "subscriptions",
        "views",
    )

    # The session's state, assigned by `Session.__init__` (session/_session.py); declared
    # here so that each room is checked against it.
    id: str
    name: str
    cwd: str | None
    pool: Pool
    out: Writer
    page_size: int
    _log: SessionLog
    # Whether a line of this level would be kept (formatting skipped when not).
    _log_enabled: Callable[[str], bool]
    attached_at: float
    views: dict[str, SessionView]
    name_budget: Any
    _budget_settings: tuple[int | None, int | None]
    registry: RegistryGeneration
    _signature: tuple[Any, ...]
    ready: bool
    _views_known: bool
    _backlog: list[tuple[Message, Batch | None]]
    initialize_answered: bool
    initialized: bool
    protocol_version: str | None
    client_capabilities: dict[str, Any]
    client_info: dict[str, Any]
    inflight: dict[Any, _InFlight]
    pending_kinds: set[str]
    _notify_wake: trio.Event
    spawn: Callable[[Callable[[], Awaitable[None]]], None] | None
    _notifying: bool
    settings_generation: int
    _reconciling: bool
    _dirty: bool
    last_error: str | None
    registry_errors: dict[str, str]
    subscriptions: set[str]
    log_level: str | None
    closed: bool
    close_reason: str | None
    on_close: Callable[[Session], None] | None
    notifications_sent: int
    lossy_dropped: int
    relayed: dict[str, _Relayed]
    _relay_ids: itertools.count[int]
    era: str | None
    request_headers: dict[str, str] | None
    listens: dict[Any, _Listen]
    _batch: Batch | None
    _dropped: set[str]
    _parked: dict[Any, _Resume]
    _holding: list[_InFlight]
    _hold_timer: bool
    logins: LoginDesk | None
    cursors: CursorBook[tuple[dict[str, Any], ...]]
    _walks: tuple[int, ...]  # numbers of the lists this session's cursors name
    # Servers told to need a login (issue 28) -> whether the elicitation for it failed.
    _login_told: dict[str, bool]

    def release_all(self) -> None:
        for view in self.views.values():
            if view.handle is not None:
                self.pool.release(view.handle)

    def holds(self, view: SessionView) -> bool:
        """S8: whether `view` is still this session's, on a handle it holds. The generation
        being served may predate a settings change that removed, disabled or replaced its
        server (while new entries start, or when a part was rejected)."""
        handle = view.handle
        return handle is not None and not handle.released and self.views.get(view.name) is view

    def _allows(self, route: Route | None) -> Route | None:
        """S8: `route` when the session's current policy and handles allow it, else None: a
        removed, disabled or filtered item is as unknown as one never listed."""
        if route is None:
            return None
        view = route.view
        handle = view.handle  # `holds`, inlined: this runs on every call
        if handle is None or handle.released or self.views.get(view.name) is not view:
            return None
        return route if view.key.allows(route.upstream_name) else None

    def refusal(self, route: Route) -> str | None:
        """Why a call or get routed by `route` (a route of the served generation) is refused
        now, or None when it goes through: `_allows`, with its reason. While a reload waits for
        new servers the generation served predates the settings (S7, S8), and what they no
        longer allow is still listed until it is published (`daemonctl tools` says so)."""
        view = route.view
        if not self.holds(view):
            return (
                f"server '{view.name}' is no longer this session's (removed, disabled or "
                "replaced in its settings); still listed until the reload ends"
            )
        allowed, rule = view.key.explain(route.upstream_name)
        if not allowed:
            return f"hidden by policy ({rule}); still listed until the reload ends"
        return None

    def send(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            self.out.write(data)
        except Exception as exc:
            self.close(str(exc))

    def send_lossy(self, data: bytes) -> None:
        """Send a message that may be dropped (log, progress: X8) when the client is not
        reading fast enough; each drop counted (`daemonctl sessions`), the first logged."""
        if self.closed:
            return
        try:
            sent = self.out.write_lossy(data)
        except Exception as exc:  # (a writer whose lossy write is a plain write)
            self.close(str(exc))
            return
        if not sent:
            self.lossy_dropped += 1
            if self.lossy_dropped == 1:
                self._log(
                    f"session {self.id}: its client is not reading fast enough; log and "
                    "progress messages for it are dropped while it is behind (counted in "
                    "`daemonctl sessions`)",
                    "info",
                )

    def send_parts(self, parts: Sequence[bytes]) -> None:
        """`send(b"".join(parts))`, the parts written as they are (`Writer.write_parts`)."""
        if self.closed:
            return
        try:
            self.out.write_parts(parts)
        except Exception as exc:
            self.close(str(exc))

    def reply(self, msg_id: Any, data: bytes) -> None:
        """Send the answer to the client request being handled now (a batch member's answer
        joins its batch, which is sent whole once every member is answered)."""
        self.deliver(self._batch, data)

    def deliver(self, batch: Batch | None, data: bytes) -> None:
        """Send one answer, or add it to the batch its request came in."""
        if batch is not None:
            whole = batch.add(data)
            if whole is None:
                return
            data = whole
        self.send(data)

    def send_error(self, msg_id: Any, exc: McpoolError) -> None:
        obj = exc.to_error_object()
        self.reply(msg_id, error_response(msg_id, obj.code, obj.message, obj.data))

    def send_result(self, msg: Message, result: dict[str, Any]) -> None:
        """Answer a request mcpool serves itself, shaped for the session's era."""
        method = msg.method if isinstance(msg.method, str) else ""
        if self.era is MODERN:
            result = modern_result(method, result, SERVER_INFO)
        self.reply(request_id(msg), response(request_id(msg), result))

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        self._answer_unfinished(reason)
        for flight in list(self._holding):
            self._let_go_held(flight, "the session that owned this request disconnected", reason)
        for relay in self.relayed.values():
            relay.upstream.respond_error(
                relay.upstream_id,
                SESSION_CLOSING,
                "the session that owned this request disconnected",
                {"reason": reason},
            )
        self.relayed.clear()
        self.listens.clear()
        self.release_all()
        self._notify_wake.set()
        on_close, self.on_close = self.on_close, None
        if on_close is not None:
            on_close(cast("Session", self))  # every room is part of a Session
        self._let_go()

    def _let_go(self) -> None:
        """A closed session lets go of its views and generation, which point back at it: a
        reference cycle that kept the session, its views, handles and generations (hundreds of
        objects) until a full collection, rare in the daemon (it freezes its heap and collects
        the young generation seldom). Its released handles let go of the views in the pool
        (`PoolEntry.let_go`)."""
        self.views = {}
        self.registry = _CLOSED_GENERATION
        self._signature = ()
        # The connection's nursery (its notifier spawner): nothing is spawned for it any more.
        self.spawn = None

    def _answer_unfinished(self, reason: str) -> None:
        """Every request still waiting (forwarded, a listen stream, the backlog) gets a
        SESSION_CLOSING error, in one write; a client that can no longer read loses nothing
        it could have had, and one that can (SIGTERM, an oversized line) hears why."""
        closing = McpoolError(reason, message=f"Session closed: {reason}", code=SESSION_CLOSING)
        lines: list[bytes] = []

        def answer(msg_id: Any, batch: Batch | None) -> None:
            line = error_response(msg_id, closing.code, closing.message, closing.data)
            whole = batch.add(line) if batch is not None else line
            if whole is not None:
                lines.append(whole)

        for flight in list(self.inflight.values()):
            flight.cut(reason)
            flight.finish()
            answer(flight.client_id, flight.batch)
        self.inflight.clear()
        for listen_id in self.listens:
            answer(listen_id, None)
        for client_id, parked in self._parked.items():
            answer(client_id, parked.batch)
        self._parked = _NO_PARKED
        for msg, batch in self._backlog:
            if msg.is_request:
                answer(msg.id, batch)
        self._backlog.clear()
        if lines:
            with contextlib.suppress(Exception):  # the peer is gone: nobody to tell
                self.out.write(b"".join(lines))

    # -- calls held for a modern client's retry (session/_input.py) -----------------------------

    @property
    def awaiting_retry(self) -> bool:
        """Whether a held call waits for the client's retry (an HTTP endpoint keeps a one-POST
        session open for it)."""
        return any(f.held is not None and not f.held.waiting for f in self._holding)

    def holds_state(self, state: Any) -> bool:
        """Whether this session issued `state` for a held call still waiting for its retry."""
        return is_ours(state) and self._held_by(state) is not None

    def _held_by(self, state: Any) -> _InFlight | None:
        """The held call whose retry `state` names, if this session holds one."""
        return next((f for f in self._holding if f.held and f.held.state == state), None)

    def _held_answered(self, flight: _InFlight, msg: Message) -> None:
        """A held call's upstream answered it: the input requests still pending are moot (each
        gets an error, so the upstream never waits on them); kept for the retry when no request
        waits for the answer, else the call is no longer held."""
        held = flight.held
        assert held is not None
        self._refuse_asks(flight, "the call they were asked for has ended")
        if held.waiting:
            if flight in self._holding:
                self._holding.remove(flight)
        else:
            held.final = msg

    def _refuse_asks(self, flight: _InFlight, why: str, reason: str | None = None) -> None:
        held = flight.held
        if held is None:
            return
        asks, held.asks = held.asks, {}
        for ask in asks.values():
            flight.upstream.respond_error(
                ask.upstream_id,
                SESSION_CLOSING if reason is not None else INVALID_REQUEST,
                why,
                {"reason": reason if reason is not None else why, "session": self.id},
            )

    def _let_go_held(self, flight: _InFlight, why: str, reason: str) -> None:
        """Give up a held call no request waits for (a retry that never came, or the session
        closed): its upstream's pending input requests get an error and its call is cancelled."""
        if flight in self._holding:
            self._holding.remove(flight)
        self._refuse_asks(flight, why, reason)
        flight.cut(reason)
        flight.held = None
        flight.finish()

    def _fault(self, where: str, exc: BaseException) -> None:
        """An unexpected exception in session code run by a task others share: log it with
        its traceback and close this session only."""
        trace = "".join(traceback.format_exception(exc)).rstrip()
        self._log(f"session {self.id}: internal error in {where}; session closed\n{trace}")
        self.close(f"internal error in mcpool while handling {where} (see the daemon log)")

    def _drop(self, kind: str, why: str) -> None:
        """A message that cannot be acted on: logged once per kind and session (a client
        repeating it must not flood the daemon log), then dropped."""
        if kind not in self._dropped:
            self._dropped.add(kind)
            self._log(f"session {self.id}: dropped {kind}: {why} (further ones: not logged)")

    def _resource_view(self, uri: str) -> SessionView:
        gen = self.registry
        view = gen.resource_view(uri)
        if view is not None and self.holds(view):
            return view
        with_resources = [
            v for v in gen.views if self.holds(v) and "resources" in v.projection().capabilities
        ]
        if len(with_resources) == 1:
            return with_resources[0]
        raise McpoolError(
            f"no server of this session listed the resource {uri}",
            message="Resource not found",
            # The handshake era's code, or the modern era's (SEP-2164: invalid params).
            code=INVALID_PARAMS if self.era is MODERN else RESOURCE_NOT_FOUND,
            uri=uri,
        )
