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

import base64
import contextlib
import itertools
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec
import trio
from msgspec import UNSET, Raw, UnsetType

from mcpool import __version__
from mcpool.pool import Handle, Pool, Upstream
from mcpool.protocol import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    META_SUBSCRIPTION_ID,
    RESOURCE_NOT_FOUND,
    SESSION_CLOSING,
    InvalidParams,
    InvalidRequest,
    JsonRpcId,
    McpoolError,
    Message,
    MethodNotFound,
    RawErrorResponse,
    Request,
    Response,
    UpstreamUnavailable,
    decode,
    decode_params,
    encode,
    error_response,
    negotiate,
    notification,
    response,
)

from . import _params
from ._eras import (
    HANDSHAKE,
    LIST_FLAGS,
    MODERN,
    Batch,
    ResultPlan,
    check_envelope,
    discover_result,
    honored_filter,
    initialize_refused,
    modern_result,
    opens_modern,
    plan_for,
    strip_envelope,
    translate_error,
    translate_result,
)
from ._names import MAX_NAME, name_budget
from ._reconcile import ActionKind, Desired, Held, reconcile
from ._registry import (
    LIST_KINDS,
    CandidateRejected,
    RegistryGeneration,
    Route,
    build_candidate,
    empty_generation,
)
from ._view import SessionView

DEFAULT_PAGE_SIZE = 500  # most clients read one page; the SDK clients follow cursors

SERVER_CAPABILITIES: dict[str, Any] = {
    "tools": {"listChanged": True},
    "prompts": {"listChanged": True},
    "resources": {"listChanged": True, "subscribe": True},
    "logging": {},
    "completions": {},
}

LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")

SERVER_INFO: dict[str, Any] = {"name": "mcpool", "version": __version__}

_encoder = msgspec.json.Encoder()


class SessionLog(Protocol):
    """Where a session's log lines go (the daemon's journal): text, then a level name."""

    def __call__(self, text: str, level: str = "warning") -> None: ...


def _no_log(text: str, level: str = "warning") -> None:
    pass


class Writer(Protocol):
    """What the session writes to (the daemon gives it an `FdWriter`)."""

    @property
    def buffered(self) -> int: ...

    def write(self, data: bytes) -> None: ...

    async def wait_drained(self) -> None: ...


class _InFlight:
    """One forwarded request: the reply callback, and what cancelling it needs."""

    __slots__ = (
        "batch",
        "client_id",
        "entry",
        "handle",
        "params",
        "plan",
        "progress",
        "rounds",
        "session",
        "uid",
        "upstream",
    )

    def __init__(
        self, session: Session, client_id: Any, handle: Handle, upstream: Upstream
    ) -> None:
        self.session = session
        self.client_id = client_id
        self.handle = handle
        self.entry = handle.entry
        self.upstream = upstream
        self.uid = 0
        self.progress: str | None = None
        self.plan: ResultPlan | None = None  # None: the answer's bytes go back untouched
        # A handshake-era session's request to a modern upstream: what was sent, kept so an
        # input_required answer can be retried with the client's input (`_InputRound`).
        self.params: dict[str, Any] | None = None
        self.rounds = 0
        self.batch: Batch | None = session._batch  # the batch this request came in, if any
        handle.in_flight += 1

    def finish(self) -> None:
        """Forget this request (answered, cancelled, or the session closed); idempotent."""
        s = self.session
        if s.inflight.get(self.client_id) is self:
            del s.inflight[self.client_id]
        if self.progress is not None:
            self.entry.unregister_progress(self.progress)
            self.progress = None
        if self.uid >= 0:
            self.handle.in_flight -= 1
            self.uid = -1

    def __call__(self, msg: Message) -> None:
        # Runs in the upstream's reader task, which every session of that server shares: an
        # unexpected failure here closes this session only (see the module docstring).
        s = self.session
        try:
            self.finish()
            if s.closed:
                return
            plan = self.plan
            if msg.error is not UNSET:
                error = msg.error
                wrong = _params.malformed_error(error)  # the error path only: off the hot path
                if wrong is not None:
                    bad = McpoolError(
                        f"server '{self.entry.name}' answered with a malformed error: {wrong}",
                        message=f"Malformed error from server '{self.entry.name}'",
                        server=self.entry.name,
                    )
                    error = Raw(_encoder.encode(bad.to_error_object()))
                elif plan is not None:
                    error = Raw(translate_error(bytes(error), plan, session_modern=s.era is MODERN))
                line = _encoder.encode(RawErrorResponse("2.0", self.client_id, error)) + b"\n"
            else:
                result = msg.result if msg.result is not UNSET else Raw(b"{}")
                if self.params is not None and b"input_required" in bytes(result):
                    decoded = msgspec.json.decode(bytes(result))
                    if isinstance(decoded, dict) and decoded.get("resultType") == "input_required":
                        refusal = _InputRound.start(self, decoded)
                        if refusal is None:
                            return  # the client is asked; the retry answers it
                        obj = refusal.to_error_object()
                        s.deliver(
                            self.batch,
                            error_response(self.client_id, obj.code, obj.message, obj.data),
                        )
                        return
                if plan is not None:
                    try:
                        result = Raw(translate_result(bytes(result), plan))
                    except McpoolError as exc:
                        obj = exc.to_error_object()
                        line = error_response(self.client_id, obj.code, obj.message, obj.data)
                        s.deliver(self.batch, line)
                        return
                line = _encoder.encode(Response("2.0", self.client_id, result)) + b"\n"
            if self.batch is None:
                s.send(line)  # the hot path: no batch is ever waiting on a handshake-era call
            else:
                s.deliver(self.batch, line)
        except Exception as exc:
            s._fault(f"the answer from server '{self.entry.name}'", exc)


# Methods 2026-07-28 removed (its changelog): unknown methods in a modern session, on every
# transport (`initialize` has its own answer, `initialize_refused`).
_REMOVED_AT_MODERN = frozenset(
    {"ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"}
)


def request_id(msg: Message) -> JsonRpcId:
    """The id of a message already known to be a request."""
    assert isinstance(msg.id, int | str)
    return msg.id


class _Relayed:
    """A request an upstream sent to this session's client, awaiting the client's answer."""

    __slots__ = ("progress_token", "upstream", "upstream_id")

    def __init__(self, upstream: Upstream, upstream_id: Any, progress_token: Any) -> None:
        self.upstream = upstream
        self.upstream_id = upstream_id
        self.progress_token = progress_token


# A modern upstream asking a handshake-era session for input again and again is looping.
MAX_INPUT_ROUNDS = 8


class _InputRound:
    """A modern upstream answered a handshake-era session's request with `input_required`
    (issue 15, point 4): each of its input requests goes to the client as the server-to-client
    request it stands for (sampling, elicitation, roots), and once all are answered the original
    request is sent again with `inputResponses` and the echoed `requestState`, its answer going
    to the client as the answer to its request. The client's answers arrive through `relayed`
    as any relayed request's do: this object is their `upstream` (`respond_raw`/`respond_error`).
    """

    __slots__ = ("flight", "pending", "responses", "state")

    def __init__(self, flight: _InFlight, state: Any) -> None:
        self.flight = flight
        self.state = state
        self.responses: dict[str, Any] = {}
        self.pending: set[str] = set()

    @staticmethod
    def start(flight: _InFlight, result: dict[str, Any]) -> McpoolError | None:
        """Ask the client; None when asked, else the error its request is answered with."""
        s = flight.session
        name = flight.entry.name
        requests = result.get("inputRequests") or {}
        if not isinstance(requests, dict) or flight.rounds >= MAX_INPUT_ROUNDS:
            why = (
                "a malformed inputRequests"
                if not isinstance(requests, dict)
                else (f"more than {MAX_INPUT_ROUNDS} rounds of input requests")
            )
            return McpoolError(f"server '{name}' sent {why}", server=name)
        asks: list[tuple[str, str, Any]] = []
        for key, req in requests.items():
            method = req.get("method") if isinstance(req, dict) else None
            capability = _CLIENT_CAPABILITY.get(method) if isinstance(method, str) else None
            if capability is None:
                return McpoolError(
                    f"server '{name}' asked for input mcpool cannot relay: {method!r}",
                    server=name,
                )
            if capability not in s.client_capabilities:
                return McpoolError(
                    f"server '{name}' asked for {method}; the session does not support it "
                    f"(no {capability} capability)",
                    server=name,
                )
            asks.append((str(key), str(method), req.get("params", UNSET)))
        if not asks and result.get("requestState") is None:
            return McpoolError(f"server '{name}' sent an empty input_required result", server=name)
        round_ = _InputRound(flight, result.get("requestState"))
        # Listed as in flight meanwhile (at no upstream: uid -1), so the client can cancel it.
        s.inflight[flight.client_id] = flight
        for key, method, params in asks:
            round_.pending.add(key)
            downstream_id = f"mcpool-{next(s._relay_ids)}"
            s.relayed[downstream_id] = _Relayed(round_, key, None)  # type: ignore[arg-type]
            raw = UNSET if params is UNSET else Raw(_encoder.encode(params))
            s.send(encode(Request("2.0", downstream_id, method, raw)))
        if not asks:
            round_.retry()
        return None

    # What `_client_response` calls on a relay's upstream.

    def respond_raw(self, key: str, result: Raw | UnsetType, error: Raw | UnsetType) -> None:
        if key not in self.pending or self.flight.session.closed:
            return
        if error is not UNSET:
            self.pending.clear()
            s = self.flight.session
            if not self._still_wanted():
                return
            line = _encoder.encode(RawErrorResponse("2.0", self.flight.client_id, error)) + b"\n"
            s.deliver(self.flight.batch, line)
            return
        self.pending.discard(key)
        self.responses[key] = msgspec.json.decode(bytes(result)) if result is not UNSET else {}
        if not self.pending:
            self.retry()

    def respond_error(self, key: str, code: int, message: str, data: Any = UNSET) -> None:
        obj: dict[str, Any] = {"code": code, "message": message}
        if data is not UNSET:
            obj["data"] = data
        self.respond_raw(key, UNSET, Raw(_encoder.encode(obj)))

    def _still_wanted(self) -> bool:
        """Whether the client still waits for its request (not cancelled, session open); it
        stops being listed as in flight either way."""
        s = self.flight.session
        if s.closed or s.inflight.get(self.flight.client_id) is not self.flight:
            return False
        del s.inflight[self.flight.client_id]
        return True

    def retry(self) -> None:
        old = self.flight
        s = old.session
        if old.params is None or not self._still_wanted():
            return
        params = {
            k: v for k, v in old.params.items() if k not in ("inputResponses", "requestState")
        }
        if self.responses:
            params["inputResponses"] = self.responses
        if self.state is not None:
            params["requestState"] = self.state
        upstream = old.entry.upstream
        if upstream is None or not upstream.alive or old.handle.released:
            err = UpstreamUnavailable(
                old.entry.name, f"server '{old.entry.name}' went away while the client answered"
            )
            obj = err.to_error_object()
            s.deliver(old.batch, error_response(old.client_id, obj.code, obj.message, obj.data))
            return
        flight = _InFlight(s, old.client_id, old.handle, upstream)
        flight.plan, flight.params, flight.rounds = old.plan, params, old.rounds + 1
        flight.batch = old.batch
        s.inflight[old.client_id] = flight
        try:
            method = old.plan.method if old.plan is not None else "tools/call"
            flight.uid = upstream.send_request(method, _encoder.encode(params), flight)
        except BaseException:
            flight.finish()
            raise


class _Listen:
    """One `subscriptions/listen` stream a modern client opened: what it wants to hear about."""

    __slots__ = ("kinds", "uris")

    def __init__(self, kinds: frozenset[str], uris: frozenset[str]) -> None:
        self.kinds = kinds
        self.uris = uris


_CLIENT_CAPABILITY = {
    "sampling/createMessage": "sampling",
    "elicitation/create": "elicitation",
    "roots/list": "roots",
}


def _cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"o:{offset}".encode()).decode()


def _offset(cursor: Any) -> int:
    try:
        tag, off = base64.urlsafe_b64decode(str(cursor).encode()).decode().split(":")
        if tag != "o":
            raise ValueError(tag)
        value = int(off)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidParams("invalid cursor: not a cursor mcpool issued") from exc
    if value < 0:
        raise InvalidParams("invalid cursor: negative offset")
    return value


_NO_PARKED: dict[Any, Any] = {}  # shared and never written: `_park` gives a session its own


class Session:
    # Slots: a daemon holds one Session per attached window, many of them idle.
    __slots__ = (
        "_backlog",
        "_batch",
        "_budget_settings",
        "_dirty",
        "_dropped",
        "_log",
        "_notify_wake",
        "_notifying",
        "_parked",
        "_reconciling",
        "_relay_ids",
        "_signature",
        "_views_known",
        "attached_at",
        "client_capabilities",
        "client_info",
        "close_reason",
        "closed",
        "cwd",
        "era",
        "id",
        "inflight",
        "initialize_answered",
        "initialized",
        "last_error",
        "listens",
        "log_level",
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
        "settings_generation",
        "spawn",
        "subscriptions",
        "views",
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
    ) -> None:
        self.id = session_id
        self.name = name
        self.cwd = cwd
        self.pool = pool
        self.out = out
        self.page_size = page_size
        self._log: SessionLog = log if log is not None else _no_log
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
        self.relayed: dict[str, _Relayed] = {}
        self._relay_ids = itertools.count(1)
        # None until the first request decides it (P1): HANDSHAKE or MODERN.
        self.era: str | None = None
        self.listens: dict[Any, _Listen] = {}  # modern: open listen streams by request id
        # While a batch member is being handled: the batch its synchronous answer joins.
        self._batch: Batch | None = None
        self._dropped: set[str] = set()  # kinds of dropped input already logged (once each)
        # Requests waiting for their server's first start: client id -> (waiter, batch); a
        # dict only once one waits (most sessions never have one).
        self._parked: dict[Any, tuple[Callable[[str | None], None], Batch | None]] = _NO_PARKED

    # -- settings ------------------------------------------------------------------------------

    def held(self) -> dict[str, Held]:
        out = {}
        for name, view in self.views.items():
            h = view.handle
            assert h is not None
            usable = not h.released and h.entry.state.value not in ("closed", "failed")
            out[name] = Held(h.identity, view.key, view.prefix, view.source, usable)
        return out

    async def apply_settings(
        self, desired: dict[str, Desired], settings_generation: int
    ) -> list[tuple[str, str]]:
        """Reconcile this session's handles with `desired` (R1-R6). Returns (server, action)."""
        if settings_generation < self.settings_generation:
            # S6: a newer generation is already installed
            self._log(
                f"session {self.id}: settings generation {settings_generation} discarded: "
                f"generation {self.settings_generation} is already installed"
            )
            return []
        self._reconciling = True
        report: list[tuple[str, str]] = []
        new_views: dict[str, SessionView] = {}
        replay = False
        waiting: list[Handle] = []
        try:
            for action in reconcile(desired, self.held()):
                report.append((action.name, action.kind.value))
                old = self.views.get(action.name)
                d = action.desired
                if action.kind is ActionKind.RELEASE:
                    assert old is not None
                    assert old.handle is not None
                    self.pool.release(old.handle)
                    replay = True
                    continue
                assert d is not None
                if action.kind is ActionKind.KEEP:
                    assert old is not None
                    new_views[d.name] = old
                elif action.kind is ActionKind.REFRESH:
                    assert old is not None
                    assert old.handle is not None
                    self.pool.refresh(old.handle, d.settings)
                    replay |= old.update(d.key, prefix=d.settings.prefix, source=d.source)
                    new_views[d.name] = old
                else:  # ACQUIRE, REPLACE
                    if old is not None and old.handle is not None:
                        # Replaced by other transport settings: closed at once if now unused.
                        self.pool.release(old.handle, replaced=True)
                    view = SessionView(
                        self, d.name, d.key, prefix=d.settings.prefix, source=d.source
                    )
                    view.handle = self.pool.lease(d.identity, d.settings, self.id, view)
                    waiting.append(view.handle)
                    new_views[d.name] = view
                    replay = True
            self.views = {name: new_views[name] for name in desired if name in new_views}
            if not self._views_known:
                self._views_known = True
                self._answer_initialize()
            # L6, S7: each new server is waited for within its entry's startup budget, never
            # longer; one still starting is named in the log and arrives by list_changed.
            for handle in waiting:
                with trio.move_on_at(handle.entry.startup_deadline):
                    await handle.entry.ready.wait()
            for handle in waiting:
                if not handle.entry.ready.is_set() and not handle.released:
                    self._log(
                        f"session {self.id}: server '{handle.identity.name}' is still starting "
                        f"({handle.entry.state.value}) after the startup budget; served without "
                        "it, its items follow by list_changed"
                    )
        finally:
            self._reconciling = False
        if self.closed or settings_generation < self.settings_generation:
            # S6: a newer settings generation was installed while this one waited for its
            # entries; its candidate is the one that counts, and nothing is notified for ours.
            if not self.closed:
                self._log(
                    f"session {self.id}: candidate of settings generation {settings_generation} "
                    f"discarded: generation {self.settings_generation} was installed while it "
                    "waited for its servers"
                )
            return report
        self.settings_generation = settings_generation
        if replay or self._dirty or not self.ready:
            self._dirty = False
            self.rebuild("settings")
        return report

    def set_name_budget(self, *, explicit: int | None, configured: int | None) -> None:
        """`mcpool attach --max-name-length` and the daemon's `maxNameLength`; without either,
        the client's `clientInfo.name` decides (a known client's prefix and cap)."""
        self._budget_settings = (explicit, configured)
        self._update_name_budget()

    def _update_name_budget(self) -> None:
        explicit, configured = self._budget_settings
        client = self.client_info.get("name")
        budget = name_budget(
            client if isinstance(client, str) else None, explicit=explicit, configured=configured
        )
        if budget != self.name_budget:
            self.name_budget = budget
            if self.ready:
                # Every exposed name is projected again under the budget.
                self.views_changed("budget")

    def release_all(self) -> None:
        for view in self.views.values():
            if view.handle is not None:
                self.pool.release(view.handle)

    # -- generations ---------------------------------------------------------------------------

    def views_changed(self, reason: str = "upstream") -> None:
        # Called from whichever task published a snapshot (an upstream's relist, a restart).
        if self._reconciling:
            self._dirty = True
        elif not self.closed:
            try:
                self.rebuild(reason)
            except Exception as exc:
                self._fault("a change of its servers' lists", exc)

    def rebuild(self, reason: str = "settings") -> None:
        """Build and publish the next generation; `reason` (settings, upstream, budget) is for
        the log. A server whose part is rejected keeps its fallback (`build_candidate`), and
        the rest, policy changes included, is published (S3, S8)."""
        views = list(self.views.values())
        signature = tuple((id(v), v.projection()) for v in views)
        if self.ready and signature == self._signature:
            return
        prev = self.registry
        cand = build_candidate(
            views,
            number=prev.number + 1,
            settings_generation=self.settings_generation,
            previous=prev,
        )
        self._signature = signature
        self._record_rejections(cand.rejected)
        changed = cand.changed_kinds(prev)
        if not (self.ready and cand.agg is prev.agg and cand.views == prev.views):
            # (A candidate that serves exactly what is served, a rejected part's fallback
            # included, is no new generation.)
            self.registry = cand
            self._log_generation(cand, changed, reason)
        if not self.ready:
            self._become_ready()
            return
        if changed and self.initialized and not self.closed:
            self.pending_kinds.update(changed)
            self._notify_wake.set()
            if self.spawn is not None and not self._notifying:
                self._notifying = True
                self.spawn(self._notify_pending)

    def _record_rejections(self, rejected: tuple[CandidateRejected, ...]) -> None:
        """The session's registry errors are exactly the latest candidate's rejections: an error
        goes as soon as a candidate no longer has it (issue 15.9)."""
        errors = {r.server: r.describe() for r in rejected}
        for server, error in errors.items():
            if self.registry_errors.get(server) != error:
                self._log(f"session {self.id}: registry candidate rejected: {error}")
        self.registry_errors = errors
        self.last_error = "; ".join(errors.values()) or None

    def _log_generation(self, gen: RegistryGeneration, changed: list[str], reason: str) -> None:
        counts = (
            f"{len(gen.tools)} tools, {len(gen.prompts)} prompts, {len(gen.resources)} "
            f"resources, {len(gen.resource_templates)} resource templates"
        )
        what = f"changed: {', '.join(changed)}" if changed else "canonical view unchanged"
        self._log(
            f"session {self.id}: generation {gen.number} published ({reason}): {counts}; {what}",
            "debug",
        )

    def holds(self, view: SessionView) -> bool:
        """S8: whether `view` is still this session's, on a handle it holds. The generation
        being served may predate a settings change that removed, disabled or replaced its
        server (while new entries start, or when a part was rejected)."""
        handle = view.handle
        return handle is not None and not handle.released and self.views.get(view.name) is view

    def _allows(self, route: Route | None) -> Route | None:
        """S8: `route` when the session's current policy and handles allow it, else None: a
        removed, disabled or filtered item is as unknown as one never listed."""
        if route is None or not self.holds(route.view):
            return None
        return route if route.view.key.allows(route.upstream_name) else None

    def _answer_initialize(self) -> None:
        """The servers are leased: an initialize waiting in the backlog is answered now, the
        rest waits for the first generation."""
        backlog, self._backlog = self._backlog, []
        outer = self._batch
        try:
            for msg, batch in backlog:
                if msg.method == "initialize":
                    self._batch = batch
                    self._handle(msg)
                else:
                    self._backlog.append((msg, batch))
        finally:
            self._batch = outer

    def _become_ready(self) -> None:
        self.ready = True
        backlog, self._backlog = self._backlog, []
        outer = self._batch
        try:
            for msg, batch in backlog:
                self._batch = batch
                self._handle(msg)
        finally:
            self._batch = outer

    async def run_notifier(self) -> None:
        """Send list_changed for changed kinds; coalesce while the socket has unsent data."""
        while not self.closed:
            await self._notify_wake.wait()
            self._notify_wake = trio.Event()
            await self._send_pending()

    async def _notify_pending(self) -> None:
        try:
            while self.pending_kinds and not self.closed:
                await self._send_pending()
        finally:
            self._notifying = False

    async def _send_pending(self) -> None:
        if self.out.buffered:
            await self.out.wait_drained()
        kinds, self.pending_kinds = self.pending_kinds, set()
        for kind in LIST_KINDS:
            if kind not in kinds:
                continue
            method = f"notifications/{kind}/list_changed"
            if self.era is not MODERN:
                self.notifications_sent += 1
                self.send(notification(method))
                continue
            # 2026-07-28: only on the listen streams that asked, stamped with their id.
            for listen_id, listen in list(self.listens.items()):
                if kind in listen.kinds:
                    self.notifications_sent += 1
                    stamp = {"_meta": {META_SUBSCRIPTION_ID: listen_id}}
                    self.send(notification(method, stamp))

    # -- output --------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            self.out.write(data)
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
        if self.on_close is not None:
            self.on_close(self)

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
            flight.upstream.cancel(flight.uid, reason)
            flight.finish()
            answer(flight.client_id, flight.batch)
        self.inflight.clear()
        for listen_id in self.listens:
            answer(listen_id, None)
        for client_id, (_waiter, batch) in self._parked.items():
            answer(client_id, batch)
        self._parked = _NO_PARKED
        for msg, batch in self._backlog:
            if msg.is_request:
                answer(msg.id, batch)
        self._backlog.clear()
        if lines:
            with contextlib.suppress(Exception):  # the peer is gone: nobody to tell
                self.out.write(b"".join(lines))

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

    # -- input ---------------------------------------------------------------------------------

    def handle_line(self, line: bytes) -> None:
        try:
            decoded = decode(line)
        except McpoolError as exc:
            self.send_error(None, exc)
            return
        if isinstance(decoded, list):
            # A 2025-03-26 batch: its answers go back together, as one array.
            batch = Batch(sum(1 for m in decoded if m.method is not UNSET and m.id is not UNSET))
            try:
                for msg in decoded:
                    self._batch = batch if msg.method is not UNSET and msg.id is not UNSET else None
                    self.handle_message(msg)
            finally:
                self._batch = None
        else:
            self.handle_message(decoded)

    def handle_message(self, msg: Message) -> None:
        if msg.jsonrpc != "2.0":
            msg_id = msg.id if msg.id is not UNSET else None
            self.reply(
                msg_id,
                error_response(
                    msg_id,
                    INVALID_REQUEST,
                    'jsonrpc must be "2.0"',
                    {"reason": "not a JSON-RPC 2.0 message"},
                ),
            )
            return
        if not self.ready and not (
            msg.method == "ping" or (msg.method == "initialize" and self._views_known)
        ):
            self._backlog.append((msg, self._batch))
            return
        self._handle(msg)

    def _handle(self, msg: Message) -> None:
        method = msg.method
        try:
            if method is UNSET:
                self._client_response(msg)
                return
            if msg.id is UNSET:
                self._notification(method, msg.params)
                return
            entry = _HANDLERS.get(method)
            if entry is None:
                raise MethodNotFound(method, f"mcpool does not serve {method}")
            if msg.id in self.inflight or msg.id in self.listens:
                raise InvalidRequest(
                    f"request id {msg.id!r} is already used by a request in flight "
                    "(ids must be unique among a session's open requests)",
                    id=msg.id,
                )
            handler, kind = entry
            p = decode_params(msg.params)
            if self.era is not HANDSHAKE:
                self._check_era(method, p)
            handler(self, msg, p, _params.typed(p, kind))
        except McpoolError as exc:
            if msg.is_request:
                self.send_error(msg.id, exc)
            else:
                self._drop(f"a malformed {method or 'response'}", exc.reason)
        except Exception as exc:
            # A bug, not bad input: the request still gets an answer and the session goes on.
            trace = "".join(traceback.format_exception(exc)).rstrip()
            self._log(f"session {self.id}: internal error handling {method}\n{trace}")
            if msg.is_request:
                self.send_error(
                    msg.id,
                    McpoolError(f"internal error in mcpool while handling {method}: {exc!r}"),
                )

    def _check_era(self, method: str, p: dict[str, Any]) -> None:
        """P1: decide the era on the first request; check every modern request's envelope."""
        if self.era is None:
            if not opens_modern(method, p):
                return  # initialize decides on handshake; anything else is served as it is
            env = check_envelope(p)  # a malformed one is refused and decides nothing
            self.era = MODERN
            # No handshake to wait for: list_changed may flow as soon as a stream listens.
            self.initialize_answered = self.initialized = True
        elif method == "initialize":
            raise initialize_refused(p)
        else:
            env = check_envelope(p)
        if method in _REMOVED_AT_MODERN:
            raise MethodNotFound(method, f"{method} is not part of protocol {env.version}")
        answers = p.get("inputResponses", {})
        if not isinstance(answers, dict) or not all(isinstance(a, dict) for a in answers.values()):
            # MRTR "Error Handling": a retry's inputResponses is an InputResponses object, each
            # of its answers a result object (sampling, elicitation or roots).
            raise InvalidParams("params.inputResponses must be an object of result objects")
        self.protocol_version = env.version
        self.client_capabilities = env.capabilities
        if env.client_info is not None and env.client_info != self.client_info:
            self.client_info = env.client_info
            self._update_name_budget()
        if env.log_level != self.log_level:
            # Logging is opted into per request in this era; no level means no log messages.
            self.log_level = env.log_level
            if env.log_level is not None:
                self._apply_log_level(env.log_level)
        strip_envelope(p)

    def _notification(self, method: str, params: Raw | UnsetType) -> None:
        """A client's notification; a malformed one raises McpoolError (dropped by _handle)."""
        if method == "notifications/initialized":
            # Out of order (before our initialize result) is ignored, per the handshake rules.
            if self.initialize_answered:
                self.initialized = True
        elif method == "notifications/cancelled":
            c = _params.cancelled(params)
            rid = c.requestId
            if rid is UNSET:
                return  # a task's cancel names no request; mcpool forwards no tasks
            if rid in self.listens:
                self._close_listen(rid)
                return
            flight = self.inflight.get(rid)
            if flight is None and rid in self._parked:
                _waiter, batch = self._parked.pop(rid)
                whole = batch.drop() if batch is not None else None
                if whole is not None:
                    self.send(whole)
            if flight is not None:
                flight.upstream.cancel(flight.uid, c.reason or "cancelled by the client")
                flight.finish()
                if flight.batch is not None:
                    # A cancelled request gets no answer; its batch must not wait for one.
                    whole = flight.batch.drop()
                    if whole is not None:
                        self.send(whole)
        elif method == "notifications/progress":
            # Progress the client reports on a request an upstream sent it (P5).
            token = _params.progress(params).progressToken
            for relay in self.relayed.values():
                if relay.progress_token is not None and relay.progress_token == token:
                    relay.upstream.send_notification(method, params)
                    break

    # -- request handlers ----------------------------------------------------------------------

    def _initialize(self, msg: Message, p: dict[str, Any], t: _params.Initialize) -> None:
        self.era = HANDSHAKE
        version = negotiate(t.protocolVersion)
        self.protocol_version = version
        self.client_capabilities = t.capabilities or {}
        self.client_info = t.clientInfo or {}
        # Before the answer: the client's first tools/list must already fit its name limit (and
        # nothing is notified, as the handshake is not complete yet).
        self._update_name_budget()
        result: dict[str, Any] = {
            "protocolVersion": version,
            "capabilities": SERVER_CAPABILITIES,
            "serverInfo": {"name": "mcpool", "version": __version__},
        }
        instructions = self.registry.instructions() if self.ready else self._instructions_so_far()
        if instructions:
            result["instructions"] = instructions
        self.reply(request_id(msg), response(request_id(msg), result))
        self.initialize_answered = True

    def _instructions_so_far(self) -> str | None:
        """Before the first generation (L6): the instructions of the servers already up, as
        `RegistryGeneration.instructions` joins them (a late server's cannot follow: the
        protocol has no notification for them)."""
        parts = []
        for view in self.views.values():
            text = view.projection().instructions
            if text:
                parts.append(f"## {view.name}\n{text.strip()}")
        return "\n\n".join(parts) if parts else None

    def _discover(self, msg: Message, p: dict[str, Any], t: _params.Plain) -> None:
        """2026-07-28: the session's aggregated capabilities and instructions."""
        if self.era is not MODERN:
            raise MethodNotFound(
                "server/discover",
                "server/discover belongs to protocol 2026-07-28; this session used initialize",
            )
        result = discover_result(SERVER_CAPABILITIES, self.registry.instructions(), SERVER_INFO)
        self.reply(request_id(msg), response(request_id(msg), result))

    def _listen(self, msg: Message, p: dict[str, Any], t: _params.Listen) -> None:
        """2026-07-28: a stream carrying this session's list_changed and resources/updated.

        Acknowledged at once; answered only when it ends (the session closing answers it with
        SESSION_CLOSING). The client ends it with notifications/cancelled naming it, and gets
        no answer then. Resource URIs count as subscriptions (P6). Never part of a batch.
        """
        if self.era is not MODERN:
            raise MethodNotFound(
                "subscriptions/listen",
                "subscriptions/listen belongs to protocol 2026-07-28; this session used "
                "initialize (use resources/subscribe and the notifications it sends)",
            )
        if self._batch is not None:
            raise InvalidRequest(
                "subscriptions/listen cannot be part of a batch: its answer comes only when "
                "the stream ends, and the batch would wait for it"
            )
        honored = honored_filter(p.get("notifications"))
        listen_id = request_id(msg)
        kinds = frozenset(kind for kind, flag in LIST_FLAGS.items() if honored.get(flag))
        uris = frozenset(honored.get("resourceSubscriptions", ()))
        for uri in uris:
            self._hold_uri(uri)
        self.listens[listen_id] = _Listen(kinds, uris)
        self.send(
            notification(
                "notifications/subscriptions/acknowledged",
                {"notifications": honored, "_meta": {META_SUBSCRIPTION_ID: listen_id}},
            )
        )

    def _close_listen(self, listen_id: Any) -> None:
        listen = self.listens.pop(listen_id, None)
        if listen is None:
            return
        held = {uri for other in self.listens.values() for uri in other.uris} | self.subscriptions
        for uri in listen.uris - held:
            self._let_go_uri(uri)

    def _ping(self, msg: Message, p: dict[str, Any], t: _params.Plain) -> None:
        self.send_result(msg, {})

    def _list(self, msg: Message, t: _params.ListPage, kind: str, field: str) -> None:
        gen = self.registry
        items: tuple[dict[str, Any], ...] = getattr(gen, kind)
        cursor = t.cursor
        offset = _offset(cursor) if cursor is not None else 0
        modern = self.era is MODERN
        # Each page is encoded once per aggregate, era (a modern one carries more), page size
        # and offset. Only offsets the daemon issues are cached (page boundaries within the
        # list, and 0): a client's made-up cursors cannot grow the cache.
        size = self.page_size
        cacheable = offset == 0 or (size > 0 and offset % size == 0 and offset < len(items))
        key = f"{kind}@{MODERN if modern else 'handshake'}/{self.page_size}"
        if offset:
            key = f"{key}+{offset}"
        if cacheable:
            cached = gen.encoded.get(key)
            if cached is not None:
                rid = request_id(msg)
                self.reply(rid, _encoder.encode(Response("2.0", rid, Raw(cached))) + b"\n")
                return
        page = items[offset : offset + self.page_size]
        result: dict[str, Any] = {field: page}
        if offset + self.page_size < len(items):
            # Pages are cached on the shared aggregate: no per-session value in them.
            result["nextCursor"] = _cursor(offset + self.page_size)
        if modern:
            result = modern_result("tools/list", result, SERVER_INFO)  # every list is cacheable
        encoded = _encoder.encode(result)
        if cacheable:
            gen.encoded[key] = encoded
        rid = request_id(msg)
        self.reply(rid, _encoder.encode(Response("2.0", rid, Raw(encoded))) + b"\n")

    def _tools_list(self, msg: Message, p: dict[str, Any], t: _params.ListPage) -> None:
        self._list(msg, t, "tools", "tools")

    def _prompts_list(self, msg: Message, p: dict[str, Any], t: _params.ListPage) -> None:
        self._list(msg, t, "prompts", "prompts")

    def _resources_list(self, msg: Message, p: dict[str, Any], t: _params.ListPage) -> None:
        self._list(msg, t, "resources", "resources")

    def _templates_list(self, msg: Message, p: dict[str, Any], t: _params.ListPage) -> None:
        self._list(msg, t, "resource_templates", "resourceTemplates")

    def _tools_call(self, msg: Message, p: dict[str, Any], t: _params.ToolsCall) -> None:
        gen = self.registry
        name = t.name
        route = self._allows(gen.tool_route(name))
        if route is None:
            # A tool error, as the SDKs' own servers answer it: the model sees the text and can
            # pick another tool (a JSON-RPC error would surface as a client failure instead).
            self.send_result(
                msg,
                {
                    "content": [
                        {
                            "type": "text",
                            "text": f"Unknown tool: {name} (no server of this session exposes it)",
                        }
                    ],
                    "isError": True,
                },
            )
            return
        p["name"] = route.upstream_name
        self._forward(msg, route.view, "tools/call", p, t.meta)

    def _prompts_get(self, msg: Message, p: dict[str, Any], t: _params.PromptsGet) -> None:
        name = t.name
        route = self._allows(self.registry.prompt_route(name))
        if route is None:
            raise InvalidParams(
                f"unknown prompt: {name}: no server of this session exposes it",
                message=f"Unknown prompt: {name}",
                prompt=name,
            )
        p["name"] = route.upstream_name
        self._forward(msg, route.view, "prompts/get", p, t.meta)

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

    def _resources_read(self, msg: Message, p: dict[str, Any], t: _params.ResourceUri) -> None:
        self._forward(msg, self._resource_view(t.uri), "resources/read", p, t.meta)

    def _subscribe(self, msg: Message, p: dict[str, Any], t: _params.ResourceUri) -> None:
        """P6: the upstream is subscribed once per URI, however many sessions ask."""
        uri = t.uri
        view = self._resource_view(uri)
        assert view.handle is not None
        self.subscriptions.add(uri)
        if view.handle.entry.subscribe(view.handle, uri):
            self._forward(msg, view, "resources/subscribe", p, t.meta)
        else:
            self.send_result(msg, {})

    def _unsubscribe(self, msg: Message, p: dict[str, Any], t: _params.ResourceUri) -> None:
        uri = t.uri
        view = self._resource_view(uri)
        assert view.handle is not None
        self.subscriptions.discard(uri)
        was_subscribed = uri in view.handle.subscriptions
        if was_subscribed and view.handle.entry.unsubscribe(view.handle, uri):
            self._forward(msg, view, "resources/unsubscribe", p, t.meta)
        else:
            self.send_result(msg, {})

    def _hold_uri(self, uri: str) -> None:
        """A listen stream's resource: subscribe the upstream if no session had it (P6)."""
        try:
            view = self._resource_view(uri)
        except McpoolError:
            return  # no server lists it: honored, and never fires
        handle = view.handle
        assert handle is not None
        upstream = handle.entry.upstream
        if handle.entry.subscribe(handle, uri) and upstream is not None and upstream.alive:
            upstream.send_request(
                "resources/subscribe", _encoder.encode({"uri": uri}), _ignore_reply
            )

    def _let_go_uri(self, uri: str) -> None:
        try:
            view = self._resource_view(uri)
        except McpoolError:
            return
        handle = view.handle
        assert handle is not None
        upstream = handle.entry.upstream
        if (
            uri in handle.subscriptions
            and handle.entry.unsubscribe(handle, uri)
            and upstream is not None
            and upstream.alive
        ):
            upstream.send_request(
                "resources/unsubscribe", _encoder.encode({"uri": uri}), _ignore_reply
            )

    def _complete(self, msg: Message, p: dict[str, Any], t: _params.Complete) -> None:
        ref = t.ref
        if isinstance(ref, _params.PromptRef):
            route = self._allows(self.registry.prompt_route(ref.name))
            if route is None:
                raise InvalidParams(
                    f"unknown prompt: {ref.name}: no server of this session exposes it",
                    prompt=ref.name,
                )
            p["ref"] = {**p["ref"], "name": route.upstream_name}
            self._forward(msg, route.view, "completion/complete", p, t.meta)
        else:
            view = self._resource_view(ref.uri)
            self._forward(msg, view, "completion/complete", p, t.meta)

    def _set_level(self, msg: Message, p: dict[str, Any], t: _params.SetLevel) -> None:
        level = t.level
        if level not in LOG_LEVELS:
            raise InvalidParams(f"unknown log level: {level}", levels=list(LOG_LEVELS))
        self.log_level = level
        self._apply_log_level(level)
        self.send_result(msg, {})

    def _apply_log_level(self, level: str) -> None:
        for view in self.registry.views:
            handle = view.handle
            if handle is None:
                continue
            entry = handle.entry
            before = entry.effective_log_level()
            handle.log_level = level
            after = entry.effective_log_level()
            # A shared upstream logs at the most verbose level any of its sessions asked for;
            # each session still receives only messages at or above its own level.
            if (
                after != before
                and entry.upstream is not None
                and "logging" in entry.snapshot.capabilities
            ):
                entry.upstream.send_request(
                    "logging/setLevel", _encoder.encode({"level": after}), _ignore_reply
                )

    def _forward(
        self,
        msg: Message,
        view: SessionView,
        method: str,
        params: dict[str, Any],
        meta: _params.RequestMeta | None,
    ) -> None:
        handle = view.handle
        assert handle is not None
        entry = handle.entry
        upstream = entry.upstream
        if upstream is None or not upstream.alive:
            if entry.starting_up:
                self._park(msg, view, method, params, meta)
                return
            raise UpstreamUnavailable(
                view.name,
                f"server '{view.name}' is not available ({entry.state.value})",
                state=entry.state.value,
                lastError=entry.last_error,
            )
        client_id = msg.id
        flight = _InFlight(self, client_id, handle, upstream)
        if meta is not None and meta.progressToken is not UNSET:
            flight.progress = entry.register_progress(handle, meta.progressToken)
            params["_meta"] = {**params["_meta"], "progressToken": flight.progress}
        session_modern = self.era is MODERN
        if upstream.era == MODERN:
            # A modern client answers an input_required result itself; for a handshake-era one
            # mcpool turns it into the server-to-client requests it stands for (`_InputRound`),
            # so what it can be asked for is declared either way.
            params = upstream.prepare(
                params,
                self.client_capabilities
                if session_modern
                else _relayable(self.client_capabilities),
            )
            if not session_modern:
                flight.params = params
            wrap = method == "tools/call" and params.get("name") in upstream.wrapped_outputs
            flight.plan = plan_for(
                method, session_modern=session_modern, upstream_modern=True, wrap=wrap
            )
        elif session_modern:
            flight.plan = plan_for(method, session_modern=True, upstream_modern=False)
        self.inflight[client_id] = flight
        try:
            flight.uid = upstream.send_request(method, _encoder.encode(params), flight)
        except BaseException:
            flight.finish()  # whatever failed, the request is not in flight
            raise

    def _park(
        self,
        msg: Message,
        view: SessionView,
        method: str,
        params: dict[str, Any],
        meta: _params.RequestMeta | None,
    ) -> None:
        """Hold a request until its server's first start ends (L6; a standby entry starts)."""
        client_id = msg.id
        if client_id in self._parked:
            raise InvalidRequest(
                f"request id {client_id!r} is already used by a request in flight", id=client_id
            )
        batch = self._batch
        handle = view.handle
        assert handle is not None

        def resume(error: str | None) -> None:
            # Runs in the entry's supervisor task: fenced like every callback from there.
            parked = self._parked.get(client_id)
            if parked is None or parked[0] is not resume or self.closed:
                return  # cancelled, or the session closed (and answered it)
            del self._parked[client_id]
            outer, self._batch = self._batch, batch
            try:
                if error is None and handle.released:
                    error = f"server '{view.name}' was removed from the session while starting"
                name = params.get("name") if method in ("tools/call", "prompts/get") else None
                if error is None and isinstance(name, str) and not view.key.allows(name):
                    # S8: the policy in force now decides, not the one it was routed under.
                    error = f"server '{view.name}': {name} is no longer allowed for this session"
                if error is not None:
                    entry = handle.entry
                    raise UpstreamUnavailable(
                        view.name, error, state=entry.state.value, lastError=entry.last_error
                    )
                self._forward(msg, view, method, params, meta)
            except McpoolError as exc:
                self.send_error(client_id, exc)
            except Exception as exc:
                self._fault(f"a {method} waiting for server '{view.name}'", exc)
            finally:
                self._batch = outer

        if self._parked is _NO_PARKED:
            self._parked = {}
        self._parked[client_id] = (resume, batch)
        handle.entry.when_up(resume)

    # -- from upstreams ------------------------------------------------------------------------

    # These run in the upstream's reader task, which every session of that server shares:
    # what the upstream sent is typed first (a malformed notification is dropped), and an
    # unexpected failure closes this session only (`_fault`), never the reader.

    def upstream_notification(
        self, view: SessionView, method: str, params: Raw | UnsetType
    ) -> None:
        if self.closed or not self.initialize_answered:
            return
        try:
            self._upstream_notification(view, method, params)
        except McpoolError as exc:
            self._drop(f"a malformed {method} from server '{view.name}'", exc.reason)
        except Exception as exc:
            self._fault(f"{method} from server '{view.name}'", exc)

    def _upstream_notification(
        self, view: SessionView, method: str, params: Raw | UnsetType
    ) -> None:
        if method == "notifications/cancelled":
            # The upstream gave up on a request it sent this client: pass that on (P5).
            c = _params.cancelled(params)
            handle_upstream = view.handle.entry.upstream if view.handle else None
            for did, relay in list(self.relayed.items()):
                if relay.upstream is handle_upstream and relay.upstream_id == c.requestId:
                    del self.relayed[did]
                    out: dict[str, Any] = {"requestId": did}
                    if c.reason is not None:
                        out["reason"] = c.reason
                    self.send(notification(method, out))
            return
        if method == "notifications/message":
            if self.era is MODERN and self.log_level is None:
                return  # 2026-07-28: no log messages unless a request asked for a level
            if self.log_level is not None:
                level = _params.log_message(params).level
                if level in LOG_LEVELS and LOG_LEVELS.index(level) < LOG_LEVELS.index(
                    self.log_level
                ):
                    return
            self.send(notification(method, params))
        elif method == "notifications/progress":
            self.send(notification(method, params))
        elif method == "notifications/resources/updated":
            updated = _params.resource_updated(params)  # the uri is a string from here on
            p = decode_params(params)
            uri = updated.uri
            meta = updated.meta
            if meta is not None and META_SUBSCRIPTION_ID in meta:
                # A modern upstream's frame names mcpool's listen stream: never the client's.
                meta = {k: v for k, v in meta.items() if k != META_SUBSCRIPTION_ID}
                p = {k: v for k, v in p.items() if k != "_meta"} | ({"_meta": meta} if meta else {})
                params = UNSET
            if self.era is not MODERN:
                if uri in self.subscriptions:
                    self.send(notification(method, p if params is UNSET else params))
                return
            rest = meta or {}
            for listen_id, listen in self.listens.items():
                if uri in listen.uris:
                    stamped = {**p, "_meta": {**rest, META_SUBSCRIPTION_ID: listen_id}}
                    self.send(notification(method, stamped))

    def server_request(self, view: SessionView, upstream: Upstream, msg: Message) -> str | None:
        """P5: relay an upstream's request to this client; None when sent, else why not."""
        try:
            return self._server_request(upstream, msg)
        except McpoolError as exc:
            return f"malformed {msg.method}: {exc.reason}"
        except Exception as exc:
            self._fault(f"{msg.method} from server '{view.name}'", exc)
            return f"mcpool failed to relay {msg.method} (an internal error; see the daemon log)"

    def _server_request(self, upstream: Upstream, msg: Message) -> str | None:
        method = msg.method if isinstance(msg.method, str) else ""
        if self.era is MODERN:
            return (
                f"the session speaks protocol {self.protocol_version}, where servers send no "
                f"requests; {method} cannot reach it"
            )
        capability = _CLIENT_CAPABILITY.get(method)
        if capability is not None and capability not in self.client_capabilities:
            return f"the session does not support {method} (no {capability} capability)"
        if not self.initialized or self.closed:
            return f"the session cannot take {method} now (handshake not complete)"
        meta = _params.relayed_request(msg.params).meta
        token = meta.progressToken if meta is not None and meta.progressToken is not UNSET else None
        downstream_id = f"mcpool-{next(self._relay_ids)}"
        self.relayed[downstream_id] = _Relayed(upstream, msg.id, token)
        # Params are relayed byte for byte (omitted when the upstream sent none).
        self.send(encode(Request("2.0", downstream_id, method, msg.params)))
        return None

    def _client_response(self, msg: Message) -> None:
        """A client's answer to a relayed request: to the upstream that asked, once it is a
        well-formed answer; one to a request never sent (or already answered) is dropped."""
        relay = self.relayed.pop(msg.id, None) if isinstance(msg.id, str) else None
        if relay is None:
            self._drop("a response to no request", f"no relayed request has id {msg.id!r}")
            return
        wrong = _params.malformed_answer(msg.result, msg.error)
        if wrong is not None:
            # The upstream still gets an answer: it must not wait forever for this one.
            relay.upstream.respond_error(
                relay.upstream_id,
                INVALID_REQUEST,
                "the client's answer was malformed",
                {"reason": wrong, "session": self.id},
            )
            self._drop("a malformed answer to a relayed request", wrong)
            return
        relay.upstream.respond_raw(relay.upstream_id, msg.result, msg.error)


def _ignore_reply(msg: Message) -> None:
    pass


def _relayable(capabilities: dict[str, Any]) -> dict[str, Any]:
    """What of a handshake-era client's capabilities a modern upstream may ask it for through
    mcpool (input requests turned into server-to-client requests). Not roots: a shared server
    is never given one session's folders (the daemon answers roots for it)."""
    return {k: v for k, v in capabilities.items() if k in ("sampling", "elicitation")}


_HANDLERS: dict[str, tuple[Callable[[Session, Message, dict[str, Any], Any], None], type]] = {
    "initialize": (Session._initialize, _params.Initialize),
    "server/discover": (Session._discover, _params.Plain),
    "subscriptions/listen": (Session._listen, _params.Listen),
    "ping": (Session._ping, _params.Plain),
    "tools/list": (Session._tools_list, _params.ListPage),
    "tools/call": (Session._tools_call, _params.ToolsCall),
    "prompts/list": (Session._prompts_list, _params.ListPage),
    "prompts/get": (Session._prompts_get, _params.PromptsGet),
    "resources/list": (Session._resources_list, _params.ListPage),
    "resources/templates/list": (Session._templates_list, _params.ListPage),
    "resources/read": (Session._resources_read, _params.ResourceUri),
    "resources/subscribe": (Session._subscribe, _params.ResourceUri),
    "resources/unsubscribe": (Session._unsubscribe, _params.ResourceUri),
    "completion/complete": (Session._complete, _params.Complete),
    "logging/setLevel": (Session._set_level, _params.SetLevel),
}

_session_ids = itertools.count(1)


def new_session_id() -> str:
    return f"s{next(_session_ids)}"
