"""Upstream connections: `Upstream`, the transport-neutral JSON-RPC half (ids, replies,
dispatch, eras, handshake, the listen stream), and `StdioUpstream`, a child process spoken to in
newline-delimited JSON-RPC (`_http.HttpUpstream` is the other transport).

Theory of operation: `StdioUpstream.run` is the single owner task of the child (STYLE: one owner
per resource). It spawns the process in its own process group (so wrapper grandchildren such as
`npx`/`uvx` are reachable with one `killpg`), registers the group with the guardian (L4: the
groups die with the daemon even when it is SIGKILLed), detects the server's protocol era and
performs its handshake (see `_eras`: a bounded `server/discover` probe, else `initialize`), and
reports ready through `task_status.started()`. From then on:

- requests go out synchronously (`send_request` writes straight to the pipe, see `_fdio`), each
  under an id minted here and never reused (P2); the reply callback runs in the reader task;
- each request has a time limit (`request_timeout`): one timer task per connection sleeps until
  the earliest deadline (of a deque of those that came in order, and a heap of the others),
  answers an overdue request with UPSTREAM_TIMEOUT naming the server and the limit, and sends
  the server `notifications/cancelled` for it. The limit is a
  total: progress does not extend it (a wedged server can still send progress; a server whose
  tools run longer gets a larger `timeout`);
- the reader dispatches responses to their callbacks, answers `ping` and `roots/list` locally,
  and hands everything else to the entry's event sink;
- when the child exits or its stdout closes, every pending request fails at once with
  `UpstreamClosed` naming the server, the exit status and the last stderr lines (L3);
- a modern-era server gets the envelope on every request mcpool makes itself (`call`) and on
  forwarded ones (`prepare`); the handshake-era requests it has no counterpart for are answered
  here (`LOCAL_ON_MODERN`), and one `subscriptions/listen` stream, kept by `_keep_listening`,
  brings its list_changed and resources/updated to the same event sink as unsolicited ones.

Closing (L4) is bounded at every step: close stdin, wait, SIGTERM the group, wait, SIGKILL.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import heapq
import itertools
import math
import os
import signal
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import msgspec
import trio
from msgspec import UNSET, Raw, UnsetType

from mcpool import __version__
from mcpool.protocol import (
    INTERNAL_ERROR,
    LATEST_HANDSHAKE,
    META_SUBSCRIPTION_ID,
    MODERN_VERSION,
    UPSTREAM_CLOSED,
    UPSTREAM_TIMEOUT,
    UPSTREAM_UNAVAILABLE,
    CannotStart,
    LineFramer,
    McpoolError,
    Message,
    RawErrorResponse,
    Response,
    UpstreamClosed,
    UpstreamTimeout,
    UpstreamUnavailable,
    decode,
    decode_unchecked,
    error_response,
    notification,
    request,
    request_line,
    response,
    split_result,
)
from mcpool.protocol import (
    MessageTooLarge as _MessageTooLarge,
)

from . import _eras
from ._environ import SPAWN_MARKER, upstream_environment
from ._fdio import READ_CHUNK, READ_GONE, FdWriter, WriterClosed, read_ready, read_some
from ._guardian import ProcessSet, escaped_descendants, mark, marked_processes
from ._spec import TransportIdentity, printable

STDERR_LINES = 500  # what `daemonctl logs NAME` can show of one upstream
STDERR_TAIL_IN_ERRORS = 5  # stderr lines quoted in an UpstreamClosed error's data
STDIN_CLOSE_GRACE = 2.0  # a well-behaved server exits on stdin EOF well within this
SIGTERM_GRACE = 2.0  # time to exit after SIGTERM before the group is SIGKILLed
SIGKILL_WAIT = 2.0  # SIGKILL cannot be ignored; this only bounds a zombie reap
EXIT_STATUS_WAIT = 0.5  # after stdout EOF, how long in-flight errors wait for the exit status
UPSTREAM_WRITE_BUFFER = 64 * 1024 * 1024  # a stuck child's stdin may hold this much before we fail
# A line at least this long answering a list page of ours is split by position instead of
# decoded whole (`split_result`): the page's own decoder parses it (pool/_reuse.py: only the
# bytes that changed since the last listing), so an envelope decode would parse it all for
# nothing; 0.4 ms a 530 KB page. Shorter lines cost less to decode than to special-case.
SPLIT_LINE_MIN = 32 * 1024
# The era probe: a server that answers `server/discover` at all answers it as fast as `ping`,
# and a handshake-only one answers it with an error just as fast; the bound only covers a server
# that ignores unknown requests before `initialize`. A slow starter is not misjudged by it: its
# late answer to the probe locks it modern, and its -32022 to `initialize` sends us back to
# discover (`_eras.locked_modern`). Never the SDK's fixed 10 s: that is 10 s on every spawn of
# such a server.
PROBE_TIMEOUT = 1.5
# A listen stream the server ended is reopened after this, doubling for each stream in a row that
# ended before LISTEN_STABLE, up to LISTEN_REOPEN_MAX: a server that ends every stream at once
# costs a request every 30 s, not a loop, and one that ends a stream now and then loses ~1 s.
LISTEN_REOPEN_INITIAL = 1.0
LISTEN_REOPEN_MAX = 30.0
LISTEN_STABLE = 60.0
# A request sent to an upstream is answered with an UPSTREAM_TIMEOUT error after this long
# unless the entry's `timeout` or the daemon's `requestTimeout` says otherwise: gemini-cli's
# default for one tool call, long enough for real work, short of "forever" for a hung server.
DEFAULT_REQUEST_TIMEOUT = 600.0
# The deadline heap drops answered requests lazily; it is rebuilt from the pending ones once it
# holds this many more than twice their number, so a busy upstream's heap stays small.
DEADLINE_COMPACT_SLACK = 1024
# A server whose message is larger than this gets a stdout pipe of BIG_PIPE (Linux): a 600 KB
# tools/list then arrives in one wake-up instead of ten (each a loop pass and a context switch
# of both processes). Only such servers: pipe pages count against a per-user limit.
BIG_MESSAGE = 256 * 1024
BIG_PIPE = 1024 * 1024
# Reads of one wake-up while each fills its chunk: a large message is read in one loop pass,
# and no server can hold the loop for more than this many chunks.
READS_PER_WAKE = 16


# What the daemon declares to upstreams: it relays sampling and elicitation to the session that
# owns the request (P5) and answers roots itself (or relays them for session-scoped servers).
UPSTREAM_CLIENT_CAPABILITIES: dict[str, Any] = {
    "roots": {"listChanged": False},
    "sampling": {},
    "elicitation": {},
}

ReplyCallback = Callable[[Message], None]

# The JSON strings of the methods `send_checked` sends, encoded once (bounded: a method not seen
# before goes through `request_line` once this is full).
_METHOD_JSON: dict[str, bytes] = {}
METHOD_JSON_MAX = 64


class UpstreamEvents(Protocol):
    """What a connection reports to its pool entry."""

    def on_notification(self, method: str, params: Raw | UnsetType) -> None: ...

    def on_server_request(self, upstream: Upstream, msg: Message) -> None: ...


class _GroupRegistry(Protocol):
    def register(self, pgid: int) -> None: ...

    def unregister(self, pgid: int) -> None: ...


# The n of each process's SPAWN_MARKER value: never the same twice in one daemon.
_SPAWN_IDS = itertools.count(1)
_CANNOT_EXEC = frozenset(
    {errno.ENOENT, errno.EACCES, errno.ENOTDIR, errno.ENOEXEC, errno.ELOOP, errno.EISDIR}
)

_result_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


def listen_reopen_delay(short_runs: int) -> float:
    """Seconds before reopening a listen stream the server ended, after `short_runs` streams in
    a row that it ended early (1 is the first)."""
    return min(LISTEN_REOPEN_MAX, LISTEN_REOPEN_INITIAL * (1 << min(max(0, short_runs - 1), 16)))


class Upstream:
    """One MCP connection to a server, whatever carries it: the JSON-RPC half.

    Ids are minted here and never reused (P2); `send_request` registers a reply callback and
    writes synchronously; `_dispatch` routes what arrives (responses to their callbacks, ping
    and roots/list answered here, modern listen frames consumed, everything else to the entry's
    event sink); `_handshake` detects the era and opens the session; `_keep_listening` keeps a
    modern server's listen stream. A transport subclass supplies `alive`, `_write`, `run` and
    `_details` (see below) and calls `_dispatch` for every message it receives.
    """

    # What carries the server's messages, as the log names it.
    wire = "stdout"

    def __init__(
        self,
        identity: TransportIdentity,
        events: UpstreamEvents,
        *,
        max_line: int,
        handshake_timeout: float,
        roots: tuple[str, ...] = (),
    ) -> None:
        self.identity = identity
        self.name = identity.name
        self._events = events
        self._max_line = max_line
        self._handshake_timeout = handshake_timeout
        self._roots = roots
        self._next_id = 1
        self._pending: dict[int, ReplyCallback] = {}
        # Our requests whose result the caller parses itself (`call`'s `decode_result`): a long
        # answer to one is split by position (SPLIT_LINE_MIN), and its whole line kept here
        # until `call` has parsed the result, to be decoded whole if that fails.
        self._parses_own: set[int] = set()
        self._split_lines: dict[int, bytes] = {}
        # A `wait_settled` waiter's event, set (and dropped) once `_pending` runs empty; None
        # while nobody waits, so that a relayed answer costs no Event.set() call.
        self._settled: trio.Event | None = None
        # Each request's time limit (seconds): set by the pool from the entry's `timeout` or
        # the daemon's `requestTimeout`. One timer task (`_expire_requests`) serves the
        # (deadline, id, method, limit) of every request instead of a task or a cancel scope
        # per request: in `_due` while they come in order (every request under the same limit:
        # the common case, one append each), the others in the heap `_deadlines`.
        self.request_timeout = DEFAULT_REQUEST_TIMEOUT
        self._due: collections.deque[tuple[float, int, str, float]] = collections.deque()
        self._deadlines: list[tuple[float, int, str, float]] = []
        # The run's clock's current_time, found on first use (`_read_clock`).
        self._now: Callable[[], float] | None = None
        self._deadline_wake = trio.Event()
        self._close_requested = trio.Event()
        self._exited = trio.Event()
        self._has_exited = False  # `_exited` is set (read by `alive` on every request)
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self.pid: int | None = None
        self.started_at: float | None = None
        self.exit_status: int | None = None
        self.closed_reason: str | None = None
        self.protocol_version: str | None = None
        self.server_capabilities: dict[str, Any] = {}
        self.server_info: dict[str, Any] = {}
        self.instructions: str | None = None
        self.era = _eras.HANDSHAKE
        # Set by the pool from this entry's last connection: a server known to be handshake-era
        # is not probed again on every restart (a silent probe costs PROBE_TIMEOUT each time).
        self.known_era: str | None = None
        # Modern era only: the level sessions asked for (sent in every request's envelope), the
        # tools whose non-object output is wrapped, and the listen stream's resource set.
        self.log_level: str | None = None
        self.wrapped_outputs: frozenset[str] = frozenset()
        self.listen_uris: set[str] = set()
        self._listen_id: str | None = None
        self._listen_serial = 0
        self._listen_wanted = trio.Event()
        self.listen_filter: dict[str, Any] = {}  # what the current stream asked for (info)
        self._listens: set[str] = set()  # ids of our listen streams still open
        self._listen_ended = False  # the server ended the current stream: reopen (with backoff)
        self._listen_opened_at = 0.0
        self._listen_short_runs = 0  # streams in a row the server ended before LISTEN_STABLE
        # Subscribes (request ids, in `_pending`) answered once a listen stream carrying their
        # URI is acknowledged: those no stream was opened for yet, and those per stream.
        self._subscribes_due: list[int] = []
        self._subscribes_of: dict[str, list[int]] = {}

    # -- sending (synchronous: no task switch on the hot path) -------------------------------

    def send_request(
        self,
        method: str,
        params: Raw | bytes | UnsetType,
        on_reply: ReplyCallback,
        *,
        bounded: bool = True,
    ) -> int:
        """Send a request; `on_reply` gets the response (or a synthesized error) exactly once.

        A modern-era server is sent `params` as given: the caller stamped them (`prepare`).
        A `bounded` request (all but `call`'s, which bounds its own) is answered with an
        UPSTREAM_TIMEOUT error and cancelled at the upstream after `request_timeout`.
        """
        if not self.alive:
            raise UpstreamClosed(
                self.name, f"server '{self.name}' is not running", **self._details()
            )
        if params is not UNSET and bounded and self.era is not _eras.MODERN:
            return self.send_checked(method, params, on_reply)
        uid = self._next_id
        self._next_id = uid + 1
        if self.era is _eras.MODERN and method in _eras.LOCAL_ON_MODERN:
            self._answer_locally(uid, method, params, on_reply)
            return uid
        self._pending[uid] = on_reply
        if bounded:
            self._add_deadline(uid, method)
        # Encoded params (a forwarded request's) are put in place as they are, not re-encoded.
        self._write(request(uid, method) if params is UNSET else request_line(uid, method, params))
        return uid

    def _add_deadline(self, uid: int, method: str) -> None:
        now = self._now
        if now is None:
            now = self._read_clock()
        limit = self.request_timeout
        self._push_deadline((now() + limit, uid, method, limit))

    def _read_clock(self) -> Callable[[], float]:
        """The run's clock, asked once: trio.current_time() goes through three calls to get to
        it (a MockClock in tests is the run's clock as well)."""
        self._now = trio.lowlevel.current_clock().current_time
        return self._now

    def _push_deadline(self, entry: tuple[float, int, str, float]) -> None:
        """Add a request's deadline: at the end of `_due` when it is not earlier than the last
        one there, else in the heap; the timer is woken when it is the earliest of all."""
        due, heap = self._due, self._deadlines
        deadline = entry[0]
        if due and deadline >= due[-1][0]:
            due.append(entry)
            if len(due) > 2 * len(self._pending) + DEADLINE_COMPACT_SLACK:
                self._compact_deadlines()
            return
        earliest = min(due[0][0] if due else math.inf, heap[0][0] if heap else math.inf)
        if not due:
            due.append(entry)
        else:
            heapq.heappush(heap, entry)
            if len(heap) > 2 * len(self._pending) + DEADLINE_COMPACT_SLACK:
                self._compact_deadlines()
        if deadline < earliest:
            self._deadline_wake.set()  # the timer sleeps until a later deadline, or forever

    def _compact_deadlines(self) -> None:
        """Answered requests' deadlines are dropped lazily; once they outnumber the pending
        ones by DEADLINE_COMPACT_SLACK, both lists keep only the pending ones."""
        pending = self._pending
        self._due = collections.deque(d for d in self._due if d[1] in pending)
        heap = self._deadlines
        heap[:] = [d for d in heap if d[1] in pending]
        heapq.heapify(heap)

    def send_checked(self, method: str, params: Raw | bytes, on_reply: ReplyCallback) -> int:
        """`send_request` of a bounded request with params, for a caller that found this
        connection `alive` and handshake-era just before (a session forwarding a call: the hot
        path, which skips those checks here)."""
        uid = self._next_id
        self._next_id = uid + 1
        pending = self._pending
        pending[uid] = on_reply
        # `_add_deadline` and `_push_deadline`'s common case, inlined.
        now = self._now
        if now is None:
            now = self._read_clock()
        limit = self.request_timeout
        entry = (now() + limit, uid, method, limit)
        due = self._due
        if due and entry[0] >= due[-1][0] and len(due) <= 2 * len(pending) + DEADLINE_COMPACT_SLACK:
            due.append(entry)
        else:
            self._push_deadline(entry)
        # Encoded params (a forwarded request's) are put in place as they are, not re-encoded
        # (`request_line`, inlined).
        encoded = _METHOD_JSON.get(method)
        if encoded is None:
            return self._write_request(uid, method, params)
        self._write(b'{"jsonrpc":"2.0","id":%d,"method":%b,"params":%b}\n' % (uid, encoded, params))
        return uid

    def _write_request(self, uid: int, method: str, params: Raw | bytes) -> int:
        self._write(request_line(uid, method, params))
        if len(_METHOD_JSON) < METHOD_JSON_MAX:
            _METHOD_JSON[method] = _encoder.encode(method)
        return uid

    def expire_requests(self, now: float) -> float:
        """Answer every pending request whose deadline passed with an UPSTREAM_TIMEOUT error
        naming the server and the limit, and cancel it at the upstream; the next deadline."""
        due, heap = self._due, self._deadlines
        while True:
            if due and due[0][0] <= now and (not heap or due[0][0] <= heap[0][0]):
                _, uid, method, limit = due.popleft()
            elif heap and heap[0][0] <= now:
                _, uid, method, limit = heapq.heappop(heap)
            else:
                break
            cb = self._pending.pop(uid, None)
            if cb is None:
                continue  # answered (or cancelled) in time
            reason = f"server '{self.name}' did not answer {method} within {limit:g} s"
            self.send_notification("notifications/cancelled", {"requestId": uid, "reason": reason})
            err = UpstreamTimeout(self.name, reason, message=reason, method=method, timeout=limit)
            cb(Message(jsonrpc="2.0", id=uid, error=Raw(_encoder.encode(err.to_error_object()))))
            due = self._due  # a callback's request may have compacted it
        self._check_settled()
        return min(due[0][0] if due else math.inf, heap[0][0] if heap else math.inf)

    async def _expire_requests(self) -> None:
        """The connection's one request timer: sleeps until the earliest deadline."""
        while True:
            if self._deadline_wake.is_set():
                self._deadline_wake = trio.Event()
            # Read after the reset: a request sent while we wait sets the new event.
            next_deadline = self.expire_requests(trio.current_time())
            with trio.move_on_at(next_deadline):
                await self._deadline_wake.wait()

    def screen_tools(self, tools: Sequence[Any], *, first_page: bool) -> Sequence[Any]:
        """A modern upstream's listed tools as the transport accepts them (HTTP: see
        `HttpUpstream.screen_tools`); every one on stdio."""
        return tools

    def prepare(self, params: dict[str, Any], capabilities: dict[str, Any]) -> dict[str, Any]:
        """Stamp a forwarded request for a modern-era server (the caller checked the era).

        `capabilities` are what the requesting session can be asked for through mcpool: a
        modern session's own, nothing for a handshake-era one (mcpool cannot turn an
        `input_required` result into server-to-client requests).
        """
        meta = _eras.envelope(
            _client_info(),
            capabilities,
            version=self.protocol_version or MODERN_VERSION,
            log_level=self.log_level,
        )
        return _eras.stamp(params, meta)

    def _answer_locally(
        self, uid: int, method: str, params: Raw | bytes | UnsetType, on_reply: ReplyCallback
    ) -> None:
        """A handshake-era request with no modern counterpart: apply it here, answer {}."""
        try:
            p = _result_decoder.decode(params) if not isinstance(params, UnsetType) else {}
        except msgspec.DecodeError:
            p = {}
        p = p if isinstance(p, dict) else {}
        if method == "logging/setLevel":
            level = p.get("level")
            self.log_level = level if isinstance(level, str) else None
        elif isinstance(p.get("uri"), str):
            before = set(self.listen_uris)
            if method == "resources/subscribe":
                self.listen_uris.add(p["uri"])
            else:
                self.listen_uris.discard(p["uri"])
            if self.listen_uris != before:
                self._listen_wanted.set()
                if method == "resources/subscribe":
                    # Answered when the server acknowledges a stream with this URI: a client
                    # told "subscribed" before the server listens could change the resource
                    # in between, and that update would be lost.
                    self._pending[uid] = on_reply
                    self._add_deadline(uid, method)
                    self._subscribes_due.append(uid)
                    return
        on_reply(Message(jsonrpc="2.0", id=uid, result=Raw(b"{}")))

    def _answer_subscribes(self, uids: list[int]) -> None:
        """Subscribes whose stream is acknowledged, ended, or not needed: answered {}."""
        for uid in uids:
            cb = self._pending.pop(uid, None)
            if cb is not None:
                cb(Message(jsonrpc="2.0", id=uid, result=Raw(b"{}")))
        if uids and self._settled is not None:
            self._check_settled()

    def send_notification(self, method: str, params: Any = UNSET) -> None:
        if self.alive:
            self._write(notification(method, params))

    def forget(self, uid: int) -> bool:
        """Drop a pending request (cancelled downstream): its late response is discarded (P2)."""
        dropped = self._pending.pop(uid, None) is not None
        self._check_settled()
        return dropped

    def cancel(self, uid: int, reason: str) -> None:
        if self.forget(uid):
            self.send_notification("notifications/cancelled", {"requestId": uid, "reason": reason})

    def respond(self, msg_id: Any, result: Any) -> None:
        if self.alive:
            self._write(response(msg_id, result))

    def respond_raw(self, msg_id: Any, result: Raw | UnsetType, error: Raw | UnsetType) -> None:
        """Relay a session's answer to a server-to-client request, payload untouched."""
        if not self.alive:
            return
        if error is not UNSET:
            self._write(_encoder.encode(RawErrorResponse("2.0", msg_id, error)) + b"\n")
        else:
            body = result if result is not UNSET else Raw(b"{}")
            self._write(_encoder.encode(Response("2.0", msg_id, body)) + b"\n")

    def respond_error(self, msg_id: Any, code: int, message: str, data: Any = UNSET) -> None:
        if self.alive:
            self._write(error_response(msg_id, code, message, data))

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def wait_settled(self) -> None:
        """Return once no request is in flight (L7: a drained entry closes after its calls;
        each request is bounded by its time limit, so this wait is too)."""
        while self._pending and not self._exited.is_set():
            if self._settled is None:
                self._settled = trio.Event()
            await self._settled.wait()

    def _check_settled(self) -> None:
        if not self._pending and self._settled is not None:
            self._settled.set()
            self._settled = None

    async def call(
        self,
        method: str,
        params: Any = UNSET,
        *,
        timeout: float,
        cancellable: bool = True,
        decode_result: Callable[[msgspec.Raw], Any] | None = None,
    ) -> Any:
        """Send a request of the daemon's own and wait for its decoded result.

        `cancellable=False` only forgets a request that timed out: the spec forbids cancelling
        `initialize` and `server/discover`. `decode_result` decodes the result instead of
        `msgspec.json.decode` (a list's pages reuse items listed before: pool/_reuse.py).
        """
        done = trio.Event()
        box: list[Message] = []

        def on_reply(msg: Message) -> None:
            box.append(msg)
            done.set()

        if self.era is _eras.MODERN and method not in _eras.LOCAL_ON_MODERN:
            if isinstance(params, dict):
                params = self.prepare(dict(params), {})
            elif isinstance(params, UnsetType):
                params = self.prepare({}, {})
        raw = (
            params
            if isinstance(params, Raw | UnsetType)
            else msgspec.Raw(msgspec.json.encode(params))
        )
        uid = self.send_request(method, raw, on_reply, bounded=False)
        if decode_result is not None:
            self._parses_own.add(uid)
        try:
            with trio.move_on_after(timeout) as scope:
                await done.wait()
        finally:
            self._parses_own.discard(uid)
            line = self._split_lines.pop(uid, None)
        if scope.cancelled_caught:
            if cancellable:
                self.cancel(uid, "timed out")
            else:
                self.forget(uid)
            raise UpstreamTimeout(
                self.name,
                f"server '{self.name}' did not answer {method} within {timeout:g} s",
                method=method,
                timeout=timeout,
            )
        msg = box[0]
        if msg.error is not UNSET:
            err = _result_decoder.decode(msg.error)
            own = _own_reason(err)
            if own is not None:
                # Synthesized here (the connection failed the request): its reason says what
                # happened ("answered HTTP 401 ..."), where its message is only the family.
                raise McpoolError(own, message=str(err["message"]), code=err["code"], method=method)
            text = err.get("message") if isinstance(err, dict) else err
            raise McpoolError(
                f"server '{self.name}' answered {method} with an error: {text}",
                message=str(text),
                code=err.get("code", INTERNAL_ERROR) if isinstance(err, dict) else INTERNAL_ERROR,
                server=self.name,
                method=method,
                error=err,
            )
        if msg.result is UNSET:
            result = None
        elif decode_result is not None:
            try:
                result = decode_result(msg.result)
            except msgspec.MsgspecError:
                if line is None:
                    raise
                result = decode_result(self._whole_result(line, uid, method))
        else:
            result = _result_decoder.decode(msg.result)
        if self.era is _eras.MODERN and method == "tools/list" and isinstance(result, dict):
            tools = result.get("tools")
            if isinstance(tools, list | tuple):  # (a tuple: a known page's, pool/_reuse.py)
                result["tools"], wrapped = _eras.wrap_output_schemas(
                    self.screen_tools(tools, first_page=not (params or {}).get("cursor"))
                )
                # Each page adds its names; a relist starts from the first page (no cursor).
                self.wrapped_outputs = (
                    wrapped if not (params or {}).get("cursor") else self.wrapped_outputs | wrapped
                )
        return result

    def request_close(self, reason: str) -> None:
        if self.closed_reason is None:
            self.closed_reason = reason
        self._close_requested.set()

    def kill(self) -> None:
        """Past the shutdown bound: end what this connection runs, now (a remote server's:
        nothing here)."""

    # -- the connection (shared by every transport) ------------------------------------------

    async def _handshake(self) -> None:
        """P1: probe `server/discover`, bounded; any error or no answer means `initialize`."""
        # The `protocolVersion` setting, or the era pin of a dual-era server's sessions.
        pinned = self.identity.protocol_version or self.identity.era_pin
        if pinned == MODERN_VERSION:
            if await self._probe():
                return
            raise CannotStart(
                self.name,
                f"server '{self.name}' does not answer server/discover at {MODERN_VERSION}, "
                'which its "protocolVersion" setting requires',
            )
        if pinned is None and self.known_era != _eras.HANDSHAKE and await self._probe():
            return
        try:
            result = await self.call(
                "initialize",
                {
                    "protocolVersion": pinned or LATEST_HANDSHAKE,
                    "capabilities": UPSTREAM_CLIENT_CAPABILITIES,
                    "clientInfo": _client_info(),
                },
                timeout=self._handshake_timeout,
                cancellable=False,
            )
        except McpoolError as exc:
            # Our probe timed out, but reached the server and locked it modern: ask again.
            if _eras.locked_modern(exc.data.get("error")) and await self._probe():
                return
            raise
        if not isinstance(result, dict):
            raise UpstreamUnavailable(
                self.name, f"server '{self.name}' sent an invalid initialize result"
            )
        self.protocol_version = result.get("protocolVersion")
        caps = result.get("capabilities")
        self.server_capabilities = caps if isinstance(caps, dict) else {}
        info = result.get("serverInfo")
        self.server_info = info if isinstance(info, dict) else {}
        instr = result.get("instructions")
        self.instructions = instr if isinstance(instr, str) else None
        self.send_notification("notifications/initialized")

    async def _probe(self) -> bool:
        """Ask `server/discover`; True (and the era set) when the answer is modern evidence.

        A -32022 naming a version mcpool speaks is asked again, once, at that version (a modern
        server said so: falling back to `initialize` would be wrong)."""
        version = MODERN_VERSION
        for attempt in range(2):
            try:
                result = await self.call(
                    "server/discover",
                    _eras.discover_params(_client_info(), version),
                    timeout=min(PROBE_TIMEOUT, self._handshake_timeout),
                    cancellable=False,
                )
                break
            except UpstreamClosed:
                raise
            except McpoolError as exc:
                again = _eras.retry_version(exc.data.get("error"))
                if again is None or attempt:
                    return False
                version = again
        found = _eras.discovered(result)
        if found is None:
            return False
        self.era = _eras.MODERN
        self.protocol_version = found.version
        self.server_capabilities = found.capabilities
        self.server_info = found.server_info
        self.instructions = found.instructions
        return True

    async def _keep_listening(self) -> None:
        """Modern era: one `subscriptions/listen` stream for what the pool must hear about.

        Reopened (new stream first, then the old one cancelled, so nothing falls between them)
        whenever the resource set changes. A stream the server ends is reopened after a backoff
        (`listen_reopen_delay`), and what it may have carried meanwhile is caught up: each list
        it listens for is re-listed (sessions hear of it only if their view changed) and each
        subscribed resource is reported updated (a client re-reads it).
        """
        while True:
            if self._listen_ended:
                self._listen_ended = False
                lived = trio.current_time() - self._listen_opened_at
                self._listen_short_runs = (
                    0 if lived >= LISTEN_STABLE else self._listen_short_runs + 1
                )
                await trio.sleep(listen_reopen_delay(self._listen_short_runs))
                wanted = _eras.listen_filter(self.server_capabilities, self.listen_uris)
                if self._listen_id is None and wanted and self.alive:
                    self._open_listen(wanted)
                    self._catch_up(wanted)
            wanted = _eras.listen_filter(self.server_capabilities, self.listen_uris)
            if wanted != self.listen_filter or (wanted and self._listen_id is None):
                self._open_listen(wanted)
            elif self._subscribes_due:
                # Their URIs were in the stream already (or the server has no subscriptions).
                due, self._subscribes_due = self._subscribes_due, []
                self._answer_subscribes(due)
            await self._listen_wanted.wait()
            self._listen_wanted = trio.Event()

    def _catch_up(self, wanted: dict[str, Any]) -> None:
        """What a listen stream may have missed while none was open, as if it had arrived."""
        for kind, flag in _eras.LIST_FLAGS.items():
            if wanted.get(flag) is True:
                self._events.on_notification(f"notifications/{kind}/list_changed", UNSET)
        for uri in wanted.get("resourceSubscriptions") or ():
            self._events.on_notification(
                "notifications/resources/updated", Raw(msgspec.json.encode({"uri": uri}))
            )

    def _open_listen(self, wanted: dict[str, Any]) -> None:
        old = self._listen_id
        self.listen_filter = wanted
        self._listen_id = None
        # The subscribes waiting for the replaced stream wait for this one (it carries theirs).
        due = self._subscribes_of.pop(old, []) if old is not None else []
        due += self._subscribes_due
        self._subscribes_due = []
        if wanted and self.alive:
            self._listen_serial += 1
            listen_id = f"mcpool-listen-{self._listen_serial}"
            self._listen_id = listen_id
            params = self.prepare({"notifications": wanted}, {})
            self._listens.add(listen_id)
            self._listen_opened_at = trio.current_time()
            if due:
                self._subscribes_of[listen_id] = due
            self._write(request(listen_id, "subscriptions/listen", params))
        else:
            self._answer_subscribes(due)
        if old is not None:
            # Late frames of the old stream still reach the event sink: a list_changed only
            # costs a relist, and sessions filter resources/updated by their own subscriptions.
            self._listens.discard(old)
            if self.alive:
                self.send_notification(
                    "notifications/cancelled", {"requestId": old, "reason": "listen set changed"}
                )

    def _listen_frame(self, msg: Message) -> bool:
        """Consume what belongs to our listen streams; False for everything else."""
        if msg.method == "notifications/subscriptions/acknowledged":
            # The pool listens for every kind the server offers; what waits is the subscribes.
            listen_id = _acknowledged_stream(msg.params)
            if listen_id is not None:
                self._answer_subscribes(self._subscribes_of.pop(listen_id, []))
            return True
        if not self._listens:
            return False
        if msg.method is UNSET:
            if isinstance(msg.id, str) and msg.id in self._listens:
                # The stream's result: the server ended it (gracefully, or with an error).
                self._listens.discard(msg.id)
                if msg.id == self._listen_id:
                    self._listen_ended_by_server(msg.id)
                return True
            return False
        if msg.method == "notifications/cancelled" and msg.params is not UNSET:
            try:
                rid = _result_decoder.decode(msg.params).get("requestId")
            except (msgspec.DecodeError, AttributeError):
                return False
            if isinstance(rid, str) and rid in self._listens:
                # On stdio the server ends a listen stream with a cancel naming it.
                self._listens.discard(rid)
                if rid == self._listen_id:
                    self._listen_ended_by_server(rid)
                return True
        return False

    def _listen_ended_by_server(self, listen_id: str) -> None:
        # Its subscribes are answered: the stream that replaces it carries their URIs again.
        self._answer_subscribes(self._subscribes_of.pop(listen_id, []))
        self._listen_id = None
        self._listen_ended = True
        self._listen_wanted.set()
        self.stderr_tail.append(f"[mcpool] the server ended listen stream {listen_id}")

    def _dispatch(self, line: bytes) -> None:
        # The hot path: a handshake-era server's result under one of our (int) ids, which is
        # all `decode` would accept of it too, decoded without its frame and checks; the loop
        # below for it, fenced the same way. Anything else, or a line that does not decode,
        # goes through `decode`.
        if self._parses_own and len(line) >= SPLIT_LINE_MIN:
            split = split_result(line)
            if split is not None and split[0] in self._parses_own:
                self._split_answer(split[0], split[1], line)
                return
        try:
            decoded: Any = decode_unchecked(line)
        except (msgspec.DecodeError, RecursionError):  # ValidationError included
            decoded = None
        if (
            decoded.__class__ is Message
            and decoded.method is UNSET
            and decoded.error is UNSET
            and decoded.result is not UNSET
            and decoded.id.__class__ is int
            and decoded.jsonrpc == "2.0"
            and self.era is not _eras.MODERN
        ):
            try:  # (`_answered`, inlined: every relayed answer)
                cb = self._pending.pop(decoded.id, None)
                if cb is not None:
                    cb(decoded)
                    if self._settled is not None:
                        self._check_settled()
            except Exception as exc:
                self._dispatch_failed(exc)
            return
        try:
            decoded = decode(line)
        except McpoolError:
            self.stderr_tail.append(
                f"[mcpool] ignored a malformed message on {self.wire}: {line[:200]!r}"
            )
            return
        for msg in decoded if isinstance(decoded, list) else (decoded,):
            # This is the reader task every session of this server depends on: whatever a
            # callback raises (sessions fence their own; this is the last line) is recorded
            # and the next message is read, never raised into the reader.
            try:
                if self.era is _eras.MODERN and self._listen_frame(msg):
                    continue
                if msg.method is UNSET:
                    if isinstance(msg.id, int):
                        self._answered(msg.id, msg)
                elif msg.id is UNSET:
                    self._events.on_notification(msg.method, msg.params)
                elif msg.method == "ping":
                    self.respond(msg.id, {})
                elif msg.method == "roots/list" and self.identity.scope != "session":
                    self.respond(
                        msg.id,
                        {
                            "roots": [
                                {"uri": _as_file_uri(r), "name": _root_name(r)} for r in self._roots
                            ]
                        },
                    )
                else:
                    self._events.on_server_request(self, msg)
            except Exception as exc:
                self._dispatch_failed(exc)

    def _answered(self, uid: int, msg: Message) -> None:
        """An answer to a request of ours, to its callback (once; none if it was forgotten)."""
        cb = self._pending.pop(uid, None)
        if cb is not None:
            cb(msg)
            if self._settled is not None:
                self._check_settled()

    def _split_answer(self, uid: int, result: memoryview, line: bytes) -> None:
        """A long answer to a request whose caller parses its result: handed on unparsed
        (`split_result`), with its line kept in case that parse fails. `call` pops the line
        whatever happens: `uid` is in `_parses_own` only while it waits."""
        self._split_lines[uid] = line
        try:
            self._answered(uid, Message(jsonrpc="2.0", id=uid, result=Raw(result)))
        except Exception as exc:
            self._dispatch_failed(exc)

    def _whole_result(self, line: bytes, uid: int, method: str) -> Raw:
        """The result of a split answer whose result did not parse (`_split_answer`): its line
        decoded whole, as any other answer is. Anything but a result under `uid` is this
        request's failure."""
        try:
            decoded = decode(line)
        except McpoolError:
            decoded = None
        if (
            not isinstance(decoded, Message)
            or decoded.id != uid
            or decoded.method is not UNSET
            or decoded.error is not UNSET
            or decoded.result is UNSET
        ):
            self.stderr_tail.append(f"[mcpool] a malformed answer to {method}: {line[:200]!r}")
            raise McpoolError(
                f"server '{self.name}' answered {method} with a malformed message",
                server=self.name,
                method=method,
            )
        return decoded.result

    def _dispatch_failed(self, exc: Exception) -> None:
        trace = "".join(traceback.format_exception(exc)).rstrip()
        self.stderr_tail.append(f"[mcpool] internal error dispatching a message: {trace}")

    def _fail_pending(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        self._check_settled()
        err = UpstreamClosed(
            self.name,
            f"server '{self.name}' {self.closed_reason or 'closed'} "
            "while the request was in flight",
            **self._details(),
        )
        obj = err.to_error_object()
        raw_error = msgspec.Raw(msgspec.json.encode(obj))
        for uid, cb in pending.items():
            cb(Message(jsonrpc="2.0", id=uid, error=raw_error))

    # -- what a transport provides ----------------------------------------------------------

    @property
    def alive(self) -> bool:
        """Whether messages can be sent now."""
        raise NotImplementedError

    def _write(self, data: bytes) -> None:
        """Send one encoded message (a line); never blocks. A failure closes the connection."""
        raise NotImplementedError

    async def run(
        self, *, task_status: trio.TaskStatus[Upstream] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The connection's one owner task: connect, `_handshake`, report started, serve
        (handing each received message to `_dispatch`) until `request_close`, then close;
        on the way out set `_exited` and `_fail_pending`."""
        raise NotImplementedError

    def _details(self) -> dict[str, Any]:
        """What an error about this connection carries in its `data` (never secrets)."""
        raise NotImplementedError


class StdioUpstream(Upstream):
    """A child process spoken to over its stdin and stdout (see the module docstring)."""

    def __init__(
        self,
        identity: TransportIdentity,
        events: UpstreamEvents,
        *,
        guardian: _GroupRegistry | None,
        max_line: int,
        handshake_timeout: float,
        roots: tuple[str, ...] = (),
    ) -> None:
        super().__init__(
            identity,
            events,
            max_line=max_line,
            handshake_timeout=handshake_timeout,
            roots=roots,
        )
        self._guardian = guardian
        self._writer: FdWriter | None = None
        # Its descendants that left its process group, found when it closes (held by pidfd).
        self._escaped = ProcessSet()
        self._spawn_id = ""

    @property
    def alive(self) -> bool:
        writer = self._writer
        return writer is not None and not writer.closed and not self._has_exited

    def _write(self, data: bytes) -> None:
        assert self._writer is not None
        try:
            self._writer.write(data)
        except WriterClosed:
            self._close_requested.set()

    async def run(
        self, *, task_status: trio.TaskStatus[Upstream] = trio.TASK_STATUS_IGNORED
    ) -> None:
        ident = self.identity
        assert ident.command is not None
        # What it starts inherits this, and stays attributable to it (`_find_marked`).
        self._spawn_id = f"{os.getpid()}.{next(_SPAWN_IDS)}"
        env = upstream_environment(ident.env, spawn_id=self._spawn_id)
        if ident.cwd is not None and _missing_dir(ident.cwd):
            # Never somewhere else: a server given "." would serve whatever folder it ran in.
            raise UpstreamUnavailable(
                self.name,
                f"server '{self.name}' not started: its cwd {printable(ident.cwd)} "
                "does not exist (or is not a folder)",
                cwd=ident.cwd,
            )
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            proc = await trio.lowlevel.open_process(
                [ident.command, *ident.args],
                stdin=in_r,
                stdout=out_w,
                stderr=err_w,
                env=env,
                cwd=ident.cwd,
                start_new_session=True,
            )
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte in an argument
            for fd in (in_r, in_w, out_r, out_w, err_r, err_w):
                os.close(fd)
            # Not there, not executable, not a program: no retry fixes that (the user does,
            # and a settings change or a session attaching tries again).
            permanent = isinstance(exc, ValueError) or exc.errno in _CANNOT_EXEC
            raise (CannotStart if permanent else UpstreamUnavailable)(
                self.name,
                f"server '{self.name}' could not be started: "
                f"{ident.redact(str(getattr(exc, 'strerror', None) or exc))}",
                command=ident.command,
            ) from exc
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        for fd in (in_w, out_r, err_r):
            os.set_blocking(fd, False)
        self.pid = proc.pid
        self.started_at = trio.current_time()
        if self._guardian is not None:
            self._guardian.register(proc.pid)
        self._writer = FdWriter(in_w, UPSTREAM_WRITE_BUFFER)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer.run)
                nursery.start_soon(self._read_stdout, out_r)
                nursery.start_soon(self._read_stderr, err_r)
                nursery.start_soon(self._watch_exit, proc)
                nursery.start_soon(self._expire_requests)
                try:
                    await self._handshake()
                except BaseException:
                    self.request_close("handshake failed")
                    raise
                if self.era is _eras.MODERN:
                    nursery.start_soon(self._keep_listening)
                task_status.started(self)
                await self._close_requested.wait()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self._shutdown(proc, in_w)
                os.close(out_r)
                os.close(err_r)
                if self._guardian is not None:
                    self._guardian.unregister(proc.pid)
                self._fail_pending()

    async def _watch_exit(self, proc: trio.Process) -> None:
        self.exit_status = await proc.wait()
        self._has_exited = True
        self._exited.set()
        if self.closed_reason is None:
            self.closed_reason = f"exited with status {self.exit_status}"
        self._fail_pending()
        self._close_requested.set()

    async def _read_stdout(self, fd: int) -> None:
        framer = LineFramer(self._max_line)
        feed, dispatch = framer.feed, self._dispatch
        whole_line = framer.whole_line
        widened = whole = False
        while True:
            # `read_some`, inlined: one coroutine less per message every session of this
            # server waits on.
            await trio.lowlevel.wait_readable(fd)
            try:
                data = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                continue
            except OSError as exc:
                if exc.errno not in READ_GONE:
                    raise
                data = b""
            ended = not data
            if len(data) == READ_CHUNK:
                # More may be waiting: up to READS_PER_WAKE chunks are read in this pass and
                # framed at once (a 605 KB message fed 64 KB at a time grew the framer's
                # buffer ten times: 0.3 ms against 0.07 ms).
                chunks = [data]
                size = len(data)
                for _ in range(READS_PER_WAKE - 1):
                    if not widened and framer.pending() + size > BIG_MESSAGE:
                        widened = True
                        _widen_pipe(fd)
                    more = read_ready(fd)
                    if more is None:
                        break
                    if not more:
                        ended = True
                        break
                    data = more
                    chunks.append(data)
                    size += len(data)
                    if len(data) < READ_CHUNK:
                        break  # the pipe is empty (for now)
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                # One whole line of many chunks (a long list page): dispatched with its newline
                # (the decoders and `split_result` take a trailing blank) rather than copied
                # without it, 530 KB more each relist.
                whole = framer.is_whole_line(data)
            if whole:
                whole = False
                dispatch(data)
            elif data:
                line = whole_line(data)  # the hot path: one whole line, one read
                if line is not None:
                    dispatch(line)
                else:
                    try:
                        lines = feed(data)
                    except _MessageTooLarge:
                        self.request_close(f"sent a message larger than {self._max_line} bytes")
                        return
                    for line in lines:
                        dispatch(line)
            if ended:
                # Usually the process is exiting: its status makes the error much clearer.
                with trio.move_on_after(EXIT_STATUS_WAIT):
                    await self._exited.wait()
                if self.closed_reason is None:
                    self.closed_reason = "closed its stdout"
                self._fail_pending()
                self._close_requested.set()
                return

    async def _read_stderr(self, fd: int) -> None:
        buf = b""
        while True:
            data = await read_some(fd)
            if not data:
                if buf:
                    self.stderr_tail.append(buf.decode(errors="replace"))
                return
            buf += data
            *lines, buf = buf.split(b"\n")
            for ln in lines:
                self.stderr_tail.append(ln.decode(errors="replace").rstrip("\r"))
            if len(buf) > 64 * 1024:
                self.stderr_tail.append(buf.decode(errors="replace"))
                buf = b""

    def _details(self) -> dict[str, Any]:
        return {
            "exitStatus": self.exit_status,
            "stderr": list(self.stderr_tail)[-STDERR_TAIL_IN_ERRORS:],
        }

    async def _shutdown(self, proc: trio.Process, stdin_fd: int) -> None:
        """L4: close stdin, wait, SIGTERM the group, wait, SIGKILL. Every wait bounded. The
        descendants that left the group get the same signals at the same steps."""
        assert self._writer is not None
        self._writer.close("closing")
        pgid = proc.pid
        escaped = self._escaped
        # Its tree before stdin closes: a server that exits on end of file hands its children
        # to init. Again at each step it is still running (it may start more), and what it
        # orphaned by its environment (pool/_guardian.py, "Escaped descendants").
        self._find_escaped(proc)
        with contextlib.suppress(OSError):
            os.close(stdin_fd)
        try:
            if proc.returncode is None:
                with trio.move_on_after(STDIN_CLOSE_GRACE):
                    await proc.wait()
            self._find_escaped(proc)
            for pid in await trio.to_thread.run_sync(self._find_marked):
                escaped.add(pid)
            _killpg(pgid, signal.SIGTERM)
            escaped.signal(signal.SIGTERM)
            if proc.returncode is None or escaped:
                with trio.move_on_after(SIGTERM_GRACE):
                    await proc.wait()
                    for pidfd in escaped.pidfds:
                        await trio.lowlevel.wait_readable(pidfd)
            self._find_escaped(proc)
            # The group may hold grandchildren even after the leader exited (npx -> node).
            _killpg(pgid, signal.SIGKILL)
            escaped.signal(signal.SIGKILL)
            if proc.returncode is None:
                with trio.move_on_after(SIGKILL_WAIT):
                    await proc.wait()
        finally:
            escaped.close()
        self.exit_status = proc.returncode
        self._has_exited = True
        self._exited.set()

    def _find_escaped(self, proc: trio.Process) -> None:
        if proc.returncode is None:
            escaped_descendants(proc.pid, self._escaped)

    def _find_marked(self) -> list[int]:
        """What this process started that carries its id and is outside its group (a read of
        every process's environment: a worker thread's job)."""
        assert self.pid is not None
        return marked_processes(mark(SPAWN_MARKER, self._spawn_id), frozenset({self.pid}))

    def kill(self) -> None:
        """Past the shutdown bound: SIGKILL its process group and whatever left it, now."""
        if self.pid is None:
            return
        if not self._has_exited:
            escaped_descendants(self.pid, self._escaped)
        for pid in self._find_marked():
            self._escaped.add(pid)
        _killpg(self.pid, signal.SIGKILL)
        self._escaped.signal(signal.SIGKILL)


def _widen_pipe(fd: int) -> None:
    """Make a pipe BIG_PIPE bytes (Linux); where that is refused it stays as it is."""
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None)
    if set_size is not None:
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, set_size, BIG_PIPE)


_OWN_CODES = frozenset({UPSTREAM_UNAVAILABLE, UPSTREAM_CLOSED, UPSTREAM_TIMEOUT})


def _acknowledged_stream(params: Raw | UnsetType) -> str | None:
    """The listen stream a server's `notifications/subscriptions/acknowledged` names (its
    `_meta` subscription id), or None when the notification is not well formed."""
    if params is UNSET:
        return None
    try:
        p = _result_decoder.decode(params)
    except msgspec.DecodeError:
        return None
    meta = p.get("_meta") if isinstance(p, dict) else None
    listen_id = meta.get(META_SUBSCRIPTION_ID) if isinstance(meta, dict) else None
    return listen_id if isinstance(listen_id, str) else None


def _own_reason(err: Any) -> str | None:
    """The reason of an error this connection synthesized (mcpool's codes), else None."""
    if not isinstance(err, dict) or err.get("code") not in _OWN_CODES:
        return None
    data = err.get("data")
    reason = data.get("reason") if isinstance(data, dict) else None
    return reason if isinstance(reason, str) and isinstance(err.get("message"), str) else None


def _client_info() -> dict[str, Any]:
    return {"name": "mcpool", "version": __version__}


def _missing_dir(path: str) -> bool:
    """Whether a server's cwd is not a folder (one stat, as the spawn itself would do)."""
    return not os.path.isdir(path)


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _as_file_uri(root: str) -> str:
    return root if "://" in root else "file://" + os.path.abspath(os.path.expanduser(root))


def _root_name(root: str) -> str:
    return os.path.basename(root.rstrip("/")) or root


__all__ = ["StdioUpstream", "UpstreamEvents"]
