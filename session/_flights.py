"""A session's traffic with its upstreams (`Flights`): forwarding a request to its server (parked
while the server starts), the requests in flight, the notifications and requests an upstream sends
this session's client and the client's answers to them, the listen streams and subscriptions that
decide which resource updates reach it, and the login notice. A modern client takes no requests: a
handshake-era server's input request during its call is carried by an `input_required` answer, the
call held for the retry (session/_input.py; `_ask_modern`, `_retry_held`, `_expire_held`).

It meets the client through its `ClientLink` only; a fault closes the session through the `fault`
callback given at construction.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Any

import msgspec
import trio
from msgspec import UNSET, Raw, UnsetType

from mcpool.pool import LOGIN_NEEDED, EntryState, Upstream
from mcpool.protocol import (
    INVALID_REQUEST,
    META_SUBSCRIPTION_ID,
    SESSION_CLOSING,
    InvalidRequest,
    McpoolError,
    Message,
    Request,
    UpstreamUnavailable,
    decode_params,
    encode,
    notification,
    response,
    without_own_meta,
)

from . import _params
from ._eras import HANDSHAKE, MODERN, Batch, plan_for
from ._flight import _CLIENT_CAPABILITY, _encoder, _InFlight, _Listen, _Relayed
from ._input import (
    HOLDABLE,
    INPUT_METHODS,
    INPUT_RETRY_TIMEOUT,
    MAX_HELD_CALLS,
    Held,
    InputRefused,
    StateRejected,
    is_ours,
    subject_of,
)
from ._link import ClientLink, SessionLog, closing_line
from ._login_notice import (
    ANSWER_TIMEOUT,
    LoginDesk,
    LoginNotice,
    accepted,
    elicitation_params,
    login_needed_text,
    login_notice,
    may_log,
)
from ._observe import OBSERVED, CallTape, Watch
from ._view import SessionView


class _Resume:
    """A request parked until its server's first start ends (`_park`): the waiter the entry
    calls then. An object, not a closure: a closure checking that it is still the request
    parked under its id names itself, a reference cycle that kept the session, its view and
    handle and the request alive until a full collection (rare in the daemon)."""

    __slots__ = ("batch", "flights", "handle", "meta", "method", "msg", "params", "view")

    def __init__(
        self,
        flights: Flights,
        msg: Message,
        view: SessionView,
        method: str,
        params: dict[str, Any],
        meta: _params.RequestMeta | None,
        batch: Batch | None,
    ) -> None:
        self.flights = flights
        self.msg = msg
        self.view = view
        self.handle = view.handle
        self.method = method
        self.params = params
        self.meta = meta
        self.batch = batch

    def __call__(self, error: str | None) -> None:
        self.flights._resume(self, error)


class _ClientAnswer:
    """The client's answer to a request mcpool itself sent it (the login elicitation), in the
    place a relayed request's upstream takes (`respond_raw`/`respond_error`)."""

    __slots__ = ("done", "result")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: Any = None

    def respond_raw(self, key: Any, result: Raw | UnsetType, error: Raw | UnsetType) -> None:
        if result is not UNSET:
            try:
                self.result = msgspec.json.decode(result)
            except msgspec.DecodeError:
                self.result = None
        self.done.set()

    def respond_error(self, key: Any, code: int, message: str, data: Any = UNSET) -> None:
        self.done.set()


LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


def _relayable(capabilities: dict[str, Any]) -> dict[str, Any]:
    """What of a handshake-era client's capabilities a modern upstream may ask it for through
    mcpool (input requests turned into server-to-client requests). Not roots: a shared server
    is never given one session's folders (the daemon answers roots for it)."""
    return {k: v for k, v in capabilities.items() if k in ("sampling", "elicitation")}


_NO_PARKED: dict[Any, _Resume] = {}  # shared and never written: `_park` gives a session its own

Spawn = Callable[[Callable[[], Awaitable[None]]], None]


class Flights:
    """What a session has in flight with its upstreams, and what they send its client."""

    __slots__ = (
        "_hold_timer",
        "_holding",
        "_log",
        "_login_told",
        "_parked",
        "_sid",
        "fault",
        "folder",
        "inflight",
        "link",
        "listens",
        "logins",
        "relay_ids",
        "relayed",
        "spawn",
        "subscriptions",
        "tape",
    )

    def __init__(
        self,
        sid: str,
        link: ClientLink,
        *,
        log: SessionLog,
        fault: Callable[[str, BaseException], None],
        logins: LoginDesk | None,
        tape: CallTape | None = None,
        folder: str | None = None,
    ) -> None:
        self._sid = sid
        self.link = link
        # Where every answered call, read and get, and every relayed server request, is
        # recorded for the daemon's ledger (audit log, statistics; session/_observe.py).
        self.tape = tape
        self.folder = folder or ""
        self.client_said()
        self._log = log
        # An unexpected exception in code others' tasks run: logged, and this session closes.
        self.fault = fault
        self.inflight: dict[Any, _InFlight] = {}
        # Requests waiting for their server's first start: client id -> its waiter (`_Resume`,
        # which holds its batch); a dict only once one waits (most sessions never have one).
        self._parked: dict[Any, _Resume] = _NO_PARKED
        # Modern calls held for the client's retry with its input (session/_input.py), and
        # whether the task that ends those whose retry never comes is running.
        self._holding: list[_InFlight] = []
        self._hold_timer = False
        self.relayed: dict[str, _Relayed] = {}
        self.relay_ids = itertools.count(1)
        self.listens: dict[Any, _Listen] = {}  # modern: open listen streams by request id
        self.subscriptions: set[str] = set()  # handshake era: resources/subscribe'd URIs
        # Where a login-needing server's login is started for the client (issue 28), if the
        # daemon gives one: the client that declared URL elicitation is asked to open it.
        self.logins = logins
        self._login_told: dict[str, bool] = {}
        # With `spawn` set (the daemon's connections), the tasks that bound a held call's
        # retry and run a login notice can start; without it neither is offered.
        self.spawn: Spawn | None = None

    def client_said(self) -> None:
        """The client said who it is (or it is not known yet): the session's audit lines
        say it from now on."""
        if self.tape is not None:
            info = self.link.client_info
            name = info.get("name", "")
            version = info.get("version", "")
            self.tape.said(
                name if name.__class__ is str else "",
                version if version.__class__ is str else "",
                self.folder,
            )

    def in_use(self, client_id: Any) -> bool:
        """Whether a request of the client's with this id is still open here."""
        return client_id in self.inflight or client_id in self.listens

    def cancelled(self, rid: Any, why: str) -> None:
        """The client cancelled its request `rid` (not a listen stream): it gets no answer,
        and its batch does not wait for one."""
        flight = self.inflight.get(rid)
        if flight is None and rid in self._parked:
            batch = self._parked.pop(rid).batch
            whole = batch.drop() if batch is not None else None
            if whole is not None:
                self.link.send(whole)
        if flight is not None:
            if flight.held is not None:  # a retry waiting on a held call: it ends too
                self.let_go_held(flight, "the client cancelled the call", why)
            flight.cut(why)
            flight.finish()
            if flight.batch is not None:
                whole = flight.batch.drop()
                if whole is not None:
                    self.link.send(whole)

    def progress_from_client(self, method: str, params: Raw | UnsetType, token: Any) -> None:
        """Progress the client reports on a request an upstream sent it (P5)."""
        for relay in self.relayed.values():
            if relay.progress_token is not None and relay.progress_token == token:
                relay.upstream.send_notification(method, params)
                break

    def unfinished_lines(self, closing: McpoolError) -> list[bytes]:
        """The closing session's answers to every request still waiting here (forwarded,
        listen streams, parked), each cut at its upstream."""
        lines: list[bytes] = []

        def answer(msg_id: Any, batch: Batch | None) -> None:
            whole = closing_line(closing, msg_id, batch)
            if whole is not None:
                lines.append(whole)

        reason = closing.reason
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
        return lines

    def close(self, reason: str) -> None:
        """After `unfinished_lines`: held calls are let go and every request an upstream sent
        the client gets an error, so no upstream waits on this session."""
        for flight in list(self._holding):
            self.let_go_held(flight, "the session that owned this request disconnected", reason)
        for relay in self.relayed.values():
            relay.upstream.respond_error(
                relay.upstream_id,
                SESSION_CLOSING,
                "the session that owned this request disconnected",
                {"reason": reason},
            )
        self.relayed.clear()
        self.listens.clear()

    def forward(
        self,
        msg: Message,
        view: SessionView,
        method: str,
        params: dict[str, Any],
        meta: _params.RequestMeta | None,
    ) -> None:
        handle = view.handle
        assert handle is not None
        if self.link.era is MODERN and is_ours(params.get("requestState")):
            self._retry_held(msg, view, method, params)  # a held call carries on
            return
        entry = handle.entry
        upstream = entry.upstream
        if self.link.era is MODERN and "requestState" in params and entry.era == HANDSHAKE:
            # A handshake-era server issues no requestState: this one is nobody's (MRTR: reject).
            raise StateRejected(
                f"server '{view.name}' speaks a protocol without input_required, and this "
                "requestState is not one mcpool issued",
                requestState="unknown",
            )
        if upstream is None or not upstream.alive:
            if entry.starting_up:
                self._park(msg, view, method, params, meta)
                return
            raise UpstreamUnavailable(
                view.name,
                login_needed_text(view.name)
                if entry.state is EntryState.NEEDS_LOGIN
                else f"server '{view.name}' is not available ({entry.state.value})",
                state=entry.state.value,
                lastError=entry.last_error,
            )
        if entry.turns.on and not entry.may_send(handle.session_id):
            # Its server asks clients things: another session's calls are there (pool/_turns.py).
            self._park(msg, view, method, params, meta, turn=True)
            return
        client_id = msg.id
        flight = _InFlight(self, client_id, handle, entry, upstream, self.link.batch)
        handle.in_flight += 1
        if meta is not None and meta.progressToken is not UNSET:
            flight.progress = entry.register_progress(handle, meta.progressToken)
            params["_meta"] = {**params["_meta"], "progressToken": flight.progress}
        session_modern = self.link.era is MODERN
        if upstream.era == MODERN:
            # A modern client answers an input_required result itself; for a handshake-era one
            # mcpool turns it into the server-to-client requests it stands for (`_InputRound`),
            # so what it can be asked for is declared either way.
            params = upstream.prepare(
                params,
                self.link.client_capabilities
                if session_modern
                else _relayable(self.link.client_capabilities),
            )
            if not session_modern:
                flight.params = params
            wrap = method == "tools/call" and params.get("name") in upstream.wrapped_outputs
            flight.plan = plan_for(
                method, session_modern=session_modern, upstream_modern=True, wrap=wrap
            )
        elif session_modern:
            flight.plan = plan_for(method, session_modern=True, upstream_modern=False)
            if method in HOLDABLE:
                # The upstream may ask for input mid-call: a retry must match this request.
                flight.subject = subject_of(method, view.name, params)
                flight.capabilities = self.link.client_capabilities  # this request's (2026-07-28)
        self.inflight[client_id] = flight
        try:
            encoded = _encoder.encode(params)
            if self.tape is not None and method in OBSERVED:
                named = params.get("uri" if method == "resources/read" else "name")
                flight.watch = (
                    perf_counter(),
                    view.name,
                    method,
                    named if named.__class__ is str else "",
                    len(encoded),
                )
            flight.uid = upstream.send_request(method, encoded, flight)
        except BaseException:
            flight.finish()  # whatever failed, the request is not in flight
            raise

    # -- a modern client's call held across input rounds (session/_input.py) --------------------

    def _retry_held(
        self, msg: Message, view: SessionView, method: str, params: dict[str, Any]
    ) -> None:
        """A modern client's retry carrying mcpool's requestState: its answers go to the
        upstream's pending input requests, and it takes over the held call."""
        state = params["requestState"]
        flight = self._held_by(state)
        if flight is None or flight.held is None:
            raise StateRejected(
                "the requestState is unknown to this session (expired, already used, or "
                "another session's): send the request again without it",
                requestState="unknown",
            )
        held = flight.held
        now = trio.current_time()
        if held.expired(now):
            # Let go of the upstream's call now; `held.retry` below answers this retry with
            # the expired-state error.
            self.let_go_held(flight, "the client's retry came too late", "no retry in time")
        responses = params.get("inputResponses")
        retry = held.retry(
            subject_of(method, view.name, params),
            responses if isinstance(responses, dict) else {},
            now,
        )
        for ask, answer in retry.answers:
            flight.upstream.respond(ask.upstream_id, answer)
        flight.client_id, flight.batch = msg.id, self.link.batch
        flight.capabilities = self.link.client_capabilities  # the retry's envelope, from now on
        if retry.then == "final":
            final, flight.held = held.final, None
            self._holding.remove(flight)
            flight(final)  # answered while no request waited: this retry's answer
        elif retry.then == "ask":
            self._send_input_required(flight)
        else:
            self.inflight[msg.id] = flight

    def _send_input_required(self, flight: _InFlight) -> None:
        """Answer the request waiting on a held call with the upstream's input requests; the
        upstream's call stays open for the retry, bounded by INPUT_RETRY_TIMEOUT."""
        held = flight.held
        assert held is not None
        result = held.input_required(trio.current_time())
        if self.inflight.get(flight.client_id) is flight:
            del self.inflight[flight.client_id]
        # The upstream's input requests are in it: no mcpool/* _meta keys of its (X9).
        self.link.deliver(flight.batch, without_own_meta(response(flight.client_id, result)))
        if not self._hold_timer and self.spawn is not None:
            self._hold_timer = True
            self.spawn(self._expire_held)

    async def _expire_held(self) -> None:
        """Let go of each held call whose retry did not come in time (one task per session,
        while any call waits for a retry)."""
        try:
            while not self.link.closed:
                deadlines = [
                    f.held.deadline for f in self._holding if f.held and not f.held.waiting
                ]
                if not deadlines:
                    return
                await trio.sleep_until(min(deadlines))
                now = trio.current_time()
                for flight in list(self._holding):
                    if flight.held is not None and flight.held.expired(now):
                        self.let_go_held(
                            flight,
                            f"the client did not retry within {INPUT_RETRY_TIMEOUT:g} s",
                            "no retry in time",
                        )
        finally:
            self._hold_timer = False

    def _ask_modern(self, upstream: Upstream, msg: Message, method: str) -> str | None:
        """A handshake-era upstream's input request for this modern session (P5: it belongs to
        the call in flight): the call's answer becomes an input_required result carrying it."""
        capability = INPUT_METHODS.get(method)
        if capability is None:
            return (
                f"the session speaks protocol {self.link.protocol_version}, where servers send no "
                f"requests; {method} cannot reach it"
            )
        if self.spawn is None:
            return f"this session has no task to bound a wait for its retry; {method} refused"
        flight = self._asking_flight(upstream)
        if flight is None:
            return (
                f"mcpool cannot tell which call of the session {method} belongs to (none, or "
                "several, of its calls to this server are in flight)"
            )
        if flight.subject is None:
            return (
                f"{method} came during a request that cannot take input (only {sorted(HOLDABLE)})"
            )
        if capability not in flight.capabilities:
            # 2026-07-28 declares capabilities per request: the call's own envelope decides.
            return f"the session does not support {method} (no {capability} capability)"
        params = decode_params(msg.params) if msg.params is not UNSET else None
        if flight.held is None:
            if len(self._holding) >= MAX_HELD_CALLS:
                return f"the session already has {MAX_HELD_CALLS} calls waiting for its input"
            flight.held = Held(flight.subject)
            self._holding.append(flight)
        try:
            flight.held.ask(msg.id, method, params)
        except InputRefused as exc:
            return exc.reason
        if flight.held.waiting:
            self._send_input_required(flight)
        return None

    def _asking_flight(self, upstream: Upstream) -> _InFlight | None:
        """The one call of this session an upstream's request belongs to: the request whose
        stream it came on (HTTP), else the only call of the session to that server still open."""
        related = getattr(upstream, "related_request", None)
        if isinstance(related, _InFlight):
            return related if related.flights is self else None
        open_calls = {id(f): f for f in self.inflight.values() if f.upstream is upstream}
        for f in self._holding:
            if f.upstream is upstream and f.uid >= 0:
                open_calls[id(f)] = f
        return next(iter(open_calls.values())) if len(open_calls) == 1 else None

    def _park(
        self,
        msg: Message,
        view: SessionView,
        method: str,
        params: dict[str, Any],
        meta: _params.RequestMeta | None,
        *,
        turn: bool = False,
    ) -> None:
        """Hold a request until its server's first start ends (L6; a standby entry starts),
        or (`turn`) until this session's turn at a server that asks (pool/_turns.py)."""
        client_id = msg.id
        if client_id in self._parked:
            raise InvalidRequest(
                f"request id {client_id!r} is already used by a request in flight", id=client_id
            )
        handle = view.handle
        assert handle is not None
        resume = _Resume(self, msg, view, method, params, meta, self.link.batch)
        if self._parked is _NO_PARKED:
            self._parked = {}
        self._parked[client_id] = resume
        if turn:
            handle.entry.turns.wait(handle, resume)
        else:
            handle.entry.when_up(resume)

    def _resume(self, parked: _Resume, error: str | None) -> None:
        # Runs in the entry's supervisor task: fenced like every callback from there.
        client_id, view, method, params = parked.msg.id, parked.view, parked.method, parked.params
        handle = parked.handle
        assert handle is not None
        if self._parked.get(client_id) is not parked or self.link.closed:
            return  # cancelled, or the session closed (and answered it)
        del self._parked[client_id]
        outer, self.link.batch = self.link.batch, parked.batch
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
            self.forward(parked.msg, view, method, params, parked.meta)
        except McpoolError as exc:
            self.link.send_error(client_id, exc)
        except Exception as exc:
            self.fault(f"a {method} waiting for server '{view.name}'", exc)
        finally:
            self.link.batch = outer

    # These run in the upstream's reader task, which every session of that server shares:
    # what the upstream sent is typed first (a malformed notification is dropped), and an
    # unexpected failure closes this session only (`_fault`), never the reader.

    def upstream_notification(
        self, view: SessionView, method: str, params: Raw | UnsetType
    ) -> None:
        if self.link.closed or not self.link.initialize_answered:
            return
        try:
            self._upstream_notification(view, method, params)
        except McpoolError as exc:
            self.link.drop(f"a malformed {method} from server '{view.name}'", exc.reason)
        except Exception as exc:
            self.fault(f"{method} from server '{view.name}'", exc)

    def _upstream_notification(
        self, view: SessionView, method: str, params: Raw | UnsetType
    ) -> None:
        if method == LOGIN_NEEDED:
            if self.link.initialized:  # else the client's initialized notification has it told
                self.tell_login_needed(view.name)
            return
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
                    self.link.send(notification(method, out))
            for flight in self._holding:
                if flight.upstream is handle_upstream and flight.held is not None:
                    flight.held.drop(c.requestId)
            return
        if method == "notifications/message":
            if self.link.era is MODERN and self.link.log_level is None:
                return  # 2026-07-28: no log messages unless a request asked for a level
            if self.link.log_level is not None:
                level = _params.log_message(params).level
                if level in LOG_LEVELS and LOG_LEVELS.index(level) < LOG_LEVELS.index(
                    self.link.log_level
                ):
                    return
            # Lossy (X8): a flood is shed before a client that reads is cut for it.
            self.link.send_lossy(without_own_meta(notification(method, params)))
        elif method == "notifications/progress":
            self.link.send_lossy(without_own_meta(notification(method, params)))
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
            if self.link.era is not MODERN:
                if uri in self.subscriptions:
                    line = notification(method, p if params is UNSET else params)
                    self.link.send(without_own_meta(line))
                return
            rest = meta or {}
            for listen_id, listen in self.listens.items():
                if uri in listen.uris:
                    stamped = {**p, "_meta": {**rest, META_SUBSCRIPTION_ID: listen_id}}
                    self.link.send(without_own_meta(notification(method, stamped)))

    def tell_login_needed(self, server: str) -> None:
        """Tell the client that `server` waits for the user's login (issue 28): an elicitation
        of the login's start page where the client takes one (session/_login_notice.py), else
        a warning log message; once per session."""
        failed = self._login_told.get(server)
        notice = login_notice(
            modern=self.link.era is MODERN,
            capabilities=self.link.client_capabilities,
            log_level=self.link.log_level,
            told=failed is not None,
            elicitation_failed=bool(failed),
        )
        logins, spawn = self.logins, self.spawn
        if notice is LoginNotice.ELICIT_URL and logins is not None and spawn is not None:
            self._login_told[server] = False
            spawn(lambda: self._elicit_login(logins, server))
            return
        if notice is LoginNotice.ELICIT_URL:  # nobody here to start a login: the warning
            modern = self.link.era is MODERN
            notice = (
                LoginNotice.LOG if may_log(modern=modern, log_level=self.link.log_level) else notice
            )
        if notice is LoginNotice.LOG:
            self._login_told[server] = False
            self.link.send(
                notification(
                    "notifications/message",
                    {"level": "warning", "logger": "mcpool", "data": login_needed_text(server)},
                )
            )

    async def _elicit_login(self, logins: LoginDesk, server: str) -> None:
        """Start `server`'s login, ask the client to open its page, and say when it is done;
        a login that cannot start, a declined page or no answer falls back to the warning."""
        try:
            started = await logins.start(server)
        except McpoolError as exc:
            self._log(
                f"session {self._sid}: login of server '{server}' did not start: {exc.reason}"
            )
            self._login_failed(server)
            return
        answer = _ClientAnswer()
        downstream_id = f"mcpool-{next(self.relay_ids)}"
        elicitation_id = f"mcpool-login-{downstream_id}"
        self.relayed[downstream_id] = _Relayed(answer, None, None)  # type: ignore[arg-type]
        params = elicitation_params(server, started.url, elicitation_id)
        self.link.send(
            encode(
                Request("2.0", downstream_id, "elicitation/create", Raw(_encoder.encode(params)))
            )
        )
        with trio.move_on_after(ANSWER_TIMEOUT):
            await answer.done.wait()
        self.relayed.pop(downstream_id, None)
        if not accepted(answer.result):
            self._login_failed(server)
            return
        if await started.finished() and not self.link.closed:
            del self._login_told[server]  # a later need of a login is told again
            self.link.send(
                notification(
                    "notifications/elicitation/complete", {"elicitationId": elicitation_id}
                )
            )

    def _login_failed(self, server: str) -> None:
        self._login_told[server] = True
        self.tell_login_needed(server)

    def server_request(self, view: SessionView, upstream: Upstream, msg: Message) -> str | None:
        """P5: relay an upstream's request to this client; None when sent, else why not."""
        try:
            return self._server_request(upstream, msg)
        except McpoolError as exc:
            return f"malformed {msg.method}: {exc.reason}"
        except Exception as exc:
            self.fault(f"{msg.method} from server '{view.name}'", exc)
            return f"mcpool failed to relay {msg.method} (an internal error; see the daemon log)"

    def _server_request(self, upstream: Upstream, msg: Message) -> str | None:
        method = msg.method if isinstance(msg.method, str) else ""
        if self.link.era is MODERN:
            return self._ask_modern(upstream, msg, method)
        capability = _CLIENT_CAPABILITY.get(method)
        if capability is not None and capability not in self.link.client_capabilities:
            return f"the session does not support {method} (no {capability} capability)"
        if not self.link.initialized or self.link.closed:
            return f"the session cannot take {method} now (handshake not complete)"
        meta = _params.relayed_request(msg.params).meta
        token = meta.progressToken if meta is not None and meta.progressToken is not UNSET else None
        downstream_id = f"mcpool-{next(self.relay_ids)}"
        relay = self.relayed[downstream_id] = _Relayed(upstream, msg.id, token)
        if self.tape is not None:
            relay.watch = (perf_counter(), upstream.name, method, "", 0)
        # Params are relayed byte for byte (omitted when the upstream sent none), but for
        # mcpool's own _meta keys (X9).
        self.link.send(without_own_meta(encode(Request("2.0", downstream_id, method, msg.params))))
        return None

    def client_response(self, msg: Message) -> None:
        """A client's answer to a relayed request: to the upstream that asked, once it is a
        well-formed answer; one to a request never sent (or already answered) is dropped."""
        relay = self.relayed.pop(msg.id, None) if isinstance(msg.id, str) else None
        if relay is None:
            self.link.drop("a response to no request", f"no relayed request has id {msg.id!r}")
            return
        wrong = _params.malformed_answer(msg.result, msg.error)
        if wrong is not None:
            # The upstream still gets an answer: it must not wait forever for this one.
            relay.upstream.respond_error(
                relay.upstream_id,
                INVALID_REQUEST,
                "the client's answer was malformed",
                {"reason": wrong, "session": self._sid},
            )
            self.link.drop("a malformed answer to a relayed request", wrong)
            return
        relay.upstream.respond_raw(relay.upstream_id, msg.result, msg.error)
        if relay.watch is not None:
            # The bytes from the client are its answer's, known only now.
            answer = msg.error if msg.error is not UNSET else msg.result
            started, server, method, name, _ = relay.watch
            size = len(answer) if answer is not UNSET else 0
            self.observe((started, server, method, name, size), msg.error, b"")

    def observe(self, watch: Watch, error: Raw | UnsetType, line: bytes) -> None:
        """An observed request was answered (`line` went to the client; `error`: the error it
        carried, if any): it goes on the tape. Never fails the session: the answer is out."""
        try:
            if self.tape is not None:  # (none once the session closed)
                self.tape.done(watch, line, error)
        except Exception as exc:
            self._log(f"the daemon's ledger failed on a {watch[2]}: {exc!r}", "error")

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

    def held_answered(self, flight: _InFlight, msg: Message) -> None:
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
                {"reason": reason if reason is not None else why, "session": self._sid},
            )

    def let_go_held(self, flight: _InFlight, why: str, reason: str) -> None:
        """Give up a held call no request waits for (a retry that never came, or the session
        closed): its upstream's pending input requests get an error and its call is cancelled."""
        if flight in self._holding:
            self._holding.remove(flight)
        self._refuse_asks(flight, why, reason)
        flight.cut(reason)
        flight.held = None
        flight.finish()
