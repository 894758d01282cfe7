"""Requests in flight between a session and its upstreams: a forwarded request and its reply
callback (`_InFlight`), a request an upstream sent the client (`_Relayed`), an input_required
round a handshake-era client answers (`_InputRound`), and a modern client's listen stream
(`_Listen`). A modern client's call whose handshake-era upstream asked for input is an
`_InFlight` with a `held` state machine (session/_input.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from time import perf_counter
from types import MappingProxyType
from typing import Any, Protocol

import msgspec
from msgspec import UNSET, Raw, UnsetType

from mcpool.pool import Handle, PoolEntry, Upstream
from mcpool.protocol import (
    JsonRpcId,
    McpoolError,
    Message,
    RawErrorResponse,
    Request,
    UpstreamUnavailable,
    encode,
    error_response,
    response_line,
    without_own_meta,
)

from . import _params
from ._eras import MODERN, Batch, ResultPlan, translate_error, translate_result
from ._input import Held, Subject
from ._link import CLOSED, ClientLink
from ._observe import FLUSH_RECORDS, RESULT, TOOL_ERROR, CallRecord, CallTape, Watch

_encoder = msgspec.json.Encoder()
_EMPTY = Raw(b"{}")  # the result of an answer that had none
_NO_CAPABILITIES: Mapping[str, Any] = MappingProxyType({})


class FlightHost(Protocol):
    """What a request in flight needs of the session's flights (session/_flights.py)."""

    inflight: dict[Any, _InFlight]
    relayed: dict[str, _Relayed]
    relay_ids: itertools.count[int]
    tape: CallTape | None  # where observed answers are recorded (session/_observe.py)

    @property
    def link(self) -> ClientLink: ...

    def held_answered(self, flight: _InFlight, msg: Message) -> None: ...

    def fault(self, where: str, exc: BaseException) -> None: ...

    def observe(self, watch: Watch, error: Raw | UnsetType, line: bytes) -> None: ...


class _InFlight(msgspec.Struct, eq=False):
    """One forwarded request: the reply callback, and what cancelling it needs.

    A Struct, not a class with `__slots__` and an `__init__`: it is made for every forwarded
    request, and a Struct is built in C (one Python frame less per call, its defaults filled in
    without bytecode). `eq=False`: compared and hashed by identity, as a plain object is. The
    maker counts it on its handle (`handle.in_flight += 1`; `finish` takes it off).
    """

    flights: FlightHost
    client_id: Any
    handle: Handle
    entry: PoolEntry
    upstream: Upstream
    batch: Batch | None  # the batch this request came in, if any
    uid: int = 0
    progress: str | None = None
    plan: ResultPlan | None = None  # None: the answer's bytes go back untouched
    # A handshake-era session's request to a modern upstream: what was sent, kept so an
    # input_required answer can be retried with the client's input (`_InputRound`).
    params: dict[str, Any] | None = None
    rounds: int = 0
    # A modern session's call to a handshake-era upstream: what a retry must match, and,
    # once the upstream asked for input, the held call's state (session/_input.py).
    subject: Subject | None = None
    # What the request's envelope said it can answer (read only; a shared empty one by default).
    capabilities: Mapping[str, Any] = _NO_CAPABILITIES
    held: Held | None = None
    # Set when the daemon's ledger is told of this request's answer (session/_observe.py).
    watch: Watch | None = None

    def cut(self, reason: str) -> None:
        """Cancel this request at its upstream, which nobody waits on any more (the client
        cancelled it, or the session is closing). The server may go on with it for a while
        (cancelling is advisory): the entry remembers that what it sends meanwhile is still
        this session's (DESIGN X8, `PoolEntry.call_cut`). The caller then `finish`es it."""
        if self.uid >= 0:
            self.entry.call_cut(self.handle, self.upstream)
            self.upstream.cancel(self.uid, reason)

    def finish(self) -> None:
        """Forget this request (answered, cancelled, or the session closed); idempotent."""
        s = self.flights
        if s.inflight.get(self.client_id) is self:
            del s.inflight[self.client_id]
        if self.progress is not None:
            self.entry.unregister_progress(self.progress)
            self.progress = None
        if self.uid >= 0:
            handle = self.handle
            handle.in_flight -= 1
            self.uid = -1
            if not handle.in_flight and self.entry.turns.on:
                self.entry.calls_ended()

    def __call__(self, msg: Message) -> None:
        # Runs in the upstream's reader task, which every session of that server shares: an
        # unexpected failure here closes this session only (see the module docstring).
        s = self.flights
        link = s.link
        try:
            if (
                self.plan is None
                and self.held is None
                and self.params is None
                and self.batch is None
                and self.progress is None
                and msg.error is UNSET
            ):
                # The hot path: a result passed back as it came, outside any batch; `finish`,
                # inlined.
                inflight = s.inflight
                if inflight.get(self.client_id) is self:
                    del inflight[self.client_id]
                if self.uid >= 0:
                    handle = self.handle
                    handle.in_flight -= 1
                    self.uid = -1
                    if not handle.in_flight and self.entry.turns.on:
                        self.entry.calls_ended()
                if link.phase is CLOSED:
                    return
                result = msg.result
                if result is UNSET:
                    result = _EMPTY
                client_id = self.client_id
                # `response_line` and `send`, inlined (every relayed answer).
                line = (
                    b'{"jsonrpc":"2.0","id":%d,"result":%b}\n' % (client_id, result)
                    if client_id.__class__ is int
                    else response_line(client_id, result)
                )
                # X9: the upstream's mcpool/* _meta keys go. `may_carry_own_meta`, inlined
                # with `partition` (one argument, no tuple to parse: about 900 instructions a
                # search where `find` costs 1,400 and `in` 2,400), on every relayed answer.
                if line.partition(b"mcpool")[1] or line.partition(b"\\u00")[1]:
                    line = without_own_meta(line)
                try:
                    link.out.write(line)
                except Exception as exc:
                    link.broke(str(exc))
                watch = self.watch
                if watch is not None:
                    # `CallTape.done` with no error, inlined (a property test holds the two
                    # equal): every observed answer.
                    tape = s.tape
                    if tape is not None:
                        started, server, method, name, sent = watch
                        records = tape.records
                        records.append(
                            CallRecord(
                                tape.facts,
                                started + tape.wall_offset,
                                server,
                                method,
                                name,
                                sent,
                                (perf_counter() - started) * 1000.0,
                                TOOL_ERROR
                                if method == "tools/call"
                                and line.partition(b'"isError"')[1]
                                and (b'"isError":true' in line or b'"isError": true' in line)
                                else RESULT,
                                len(line),
                            )
                        )
                        if len(records) >= FLUSH_RECORDS:
                            tape.full(tape)
                return
            if self.held is not None:
                s.held_answered(self, msg)
                if not self.held.waiting:
                    self.finish()
                    return  # no request waits for it: the client's retry gets it
                self.held = None
            self.finish()
            if link.phase is CLOSED:
                return
            plan = self.plan
            result = msg.result
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
                    error = Raw(
                        translate_error(bytes(error), plan, session_modern=link.era is MODERN)
                    )
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
                        link.deliver(
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
                        link.deliver(self.batch, line)
                        return
                # The result's bytes as they came, but for mcpool's own _meta keys (X9).
                line = without_own_meta(response_line(self.client_id, result))
            if self.batch is None:
                link.send(line)  # the hot path: no batch is ever waiting on a handshake-era call
            else:
                link.deliver(self.batch, line)
            if self.watch is not None:
                s.observe(self.watch, msg.error, line)
        except Exception as exc:
            s.fault(f"the answer from server '{self.entry.name}'", exc)


def request_id(msg: Message) -> JsonRpcId:
    """The id of a message already known to be a request."""
    assert isinstance(msg.id, int | str)
    return msg.id


class _Relayed:
    """A request an upstream sent to this session's client, awaiting the client's answer."""

    __slots__ = ("progress_token", "upstream", "upstream_id", "watch")

    def __init__(self, upstream: Upstream, upstream_id: Any, progress_token: Any) -> None:
        self.upstream = upstream
        self.upstream_id = upstream_id
        self.progress_token = progress_token
        self.watch: Watch | None = None  # a server's request the ledger is told of


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
        s = flight.flights
        link = s.link
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
            if capability not in link.client_capabilities:
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
            downstream_id = f"mcpool-{next(s.relay_ids)}"
            s.relayed[downstream_id] = _Relayed(round_, key, None)  # type: ignore[arg-type]
            raw = UNSET if params is UNSET else Raw(_encoder.encode(params))
            link.send(without_own_meta(encode(Request("2.0", downstream_id, method, raw))))
        if not asks:
            round_.retry()
        return None

    # What `_client_response` calls on a relay's upstream.

    def respond_raw(self, key: str, result: Raw | UnsetType, error: Raw | UnsetType) -> None:
        if key not in self.pending or self.flight.flights.link.phase is CLOSED:
            return
        if error is not UNSET:
            self.pending.clear()
            if not self._still_wanted():
                return
            line = _encoder.encode(RawErrorResponse("2.0", self.flight.client_id, error)) + b"\n"
            self.flight.flights.link.deliver(self.flight.batch, line)
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
        s = self.flight.flights
        if s.link.phase is CLOSED or s.inflight.get(self.flight.client_id) is not self.flight:
            return False
        del s.inflight[self.flight.client_id]
        return True

    def retry(self) -> None:
        old = self.flight
        s = old.flights
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
            s.link.deliver(
                old.batch, error_response(old.client_id, obj.code, obj.message, obj.data)
            )
            return
        flight = _InFlight(s, old.client_id, old.handle, old.entry, upstream, old.batch)
        old.handle.in_flight += 1
        flight.plan, flight.params, flight.rounds = old.plan, params, old.rounds + 1
        flight.watch = old.watch  # (its answer is the original request's)
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
