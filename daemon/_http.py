"""The downstream streamable HTTP endpoint: `mcpool daemon --http 127.0.0.1:PORT` serves `/mcp`.

Theory of operation: the endpoint is a transport in front of ordinary `Session`s, which know
nothing of HTTP. A session speaks newline-delimited JSON-RPC to a writer; here that writer is a
`SessionOutbox`, a pure router (no I/O) that sends each message the session writes to the right
place:

- a response goes to the POST stream that carried its request;
- a progress notification goes to the stream whose request named its progress token;
- any other server message (a sampling or elicitation request, a log message) goes to the most
  recently opened POST stream still waiting for a response, since it is almost always about that
  request; failing that, to the session's GET stream; failing that, it waits (bounded) for one.

Sessions: `initialize` without an `Mcp-Session-Id` creates one (handshake era); later requests
name it, and `DELETE` ends it, as does an idle timeout. A request without a session id that
carries a modern `MCP-Protocol-Version` gets a session of its own that lasts as long as its POST
(the modern era has no handshake), so whatever era a `Session` speaks is served the same way.
Settings: the daemon's config file, or the files named by `X-Mcpool-Settings`.

Security: the endpoint binds loopback unless `--http-allow-remote`; a browser's `Origin` that is
not a loopback origin is refused (403), and so is a non-loopback `Host` (DNS rebinding). Loopback
TCP has no SO_PEERCRED, so the owner of a loopback peer's socket is asked of the kernel
(`mcpool.pool._peercred`, sock_diag) and a peer of another uid is refused, as on the Unix
socket (X1, X7).

HTTP/1.1 is spoken with h11 (the sans-I/O parser the house style follows); it is imported only
when the endpoint starts.
"""

from __future__ import annotations

import collections
import contextlib
import ipaddress
import math
import os
import secrets
import traceback
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import msgspec
import trio
from msgspec import UNSET

from mcpool.pool._peercred import peer_uid_off_loop
from mcpool.protocol import (
    HANDSHAKE_VERSIONS,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    META_PROTOCOL_VERSION,
    METHOD_NOT_FOUND,
    MODERN_VERSIONS,
    UNSUPPORTED_PROTOCOL_VERSION,
    McpoolError,
    Message,
    decode,
    decode_params,
    error_response,
)
from mcpool.protocol._headers import (
    HEADER_MISMATCH,
    REMOVED_AT_MODERN,
    error_status,
    header_mismatch,
)

if TYPE_CHECKING:
    import h11

    from mcpool.session import Session

PATH = "/mcp"
SESSION_IDLE = 600.0  # an HTTP session with no request and no open stream for this long ends
HEADER_TIMEOUT = 30.0  # a request's head and body must arrive within this (slowloris bound)
KEEPALIVE_IDLE = 120.0  # an idle keep-alive connection is closed after this
BACKLOG_MESSAGES = 1000  # server messages kept for a GET stream that is not open (oldest dropped)
MAX_HEADER_BYTES = 64 * 1024
SETTINGS_HEADER = "x-mcpool-settings"
SERVER_NAME = b"mcpool"

_decoder = msgspec.json.Decoder()


class SessionHost(Protocol):
    """What the endpoint needs from the daemon (`Daemon` implements it)."""

    config_path: str

    def open_session(
        self, out: Any, *, name: str, sources: list[str], peer: str, via: str
    ) -> Any: ...

    async def apply_to_session(self, state: Any) -> Any: ...

    def close_session(self, state: Any, reason: str) -> None: ...

    def log(self, level: str, message: str, **fields: Any) -> None: ...


# -- the router (pure) --------------------------------------------------------------------------


def _key(msg_id: Any) -> tuple[str, Any]:
    """JSON-RPC ids compare by type and value: 1 and "1" are different requests."""
    return (type(msg_id).__name__, msg_id)


class Stream:
    """One SSE (or JSON) response body the outbox can put messages on."""

    def __init__(self, outbox: SessionOutbox, *, kind: str, json: bool = False) -> None:
        self.outbox = outbox
        self.kind = kind  # "post" or "get"
        self.json = json  # JSON response mode: only responses, sent together at the end
        # 2026-07-28: a request answered by an error alone gets that error as a plain JSON body
        # with the status its code requires (400/404), so the head waits for the first message.
        self.modern = False
        self.touched = False
        self.error_reply: tuple[int, bytes] | None = None
        self.waiting: set[tuple[str, Any]] = set()
        self.tokens: set[tuple[str, Any]] = set()
        self.responses: list[bytes] = []
        self.queued = 0
        self.closed = False
        self._send, self.receive = trio.open_memory_channel[bytes](math.inf)

    def put(self, line: bytes) -> None:
        if self.closed:
            return
        self.touched = True
        chunk = line if self.json else b"event: message\ndata: " + line + b"\n\n"
        self.queued += len(chunk)
        self.outbox.queued += len(chunk)
        self._send.send_nowait(chunk)

    def sent(self, chunk: bytes) -> None:
        """The connection wrote `chunk` to the socket."""
        self.queued -= len(chunk)
        self.outbox.release(len(chunk))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._send.close()
        self.outbox.detach(self)


def _nothing() -> None:
    pass


class SessionOutbox:
    """The session's writer: routes every message it writes to one stream (see module doc)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.queued = 0
        self.streams: list[Stream] = []  # open POST streams, oldest first
        self.get_stream: Stream | None = None
        self.backlog: collections.deque[bytes] = collections.deque(maxlen=BACKLOG_MESSAGES)
        self._drained = trio.Event()
        self._drained.set()
        self.on_idle: Callable[[], None] = _nothing

    # Writer protocol ---------------------------------------------------------------------------

    @property
    def buffered(self) -> int:
        return self.queued

    def write(self, data: bytes) -> None:
        if self.queued > self.limit:
            raise McpoolError(
                f"the HTTP client stopped reading: more than {self.limit} bytes are waiting"
            )
        for line in data.split(b"\n"):
            if line.strip():
                self.route(line)
        if self.queued:
            self._drained = trio.Event() if self._drained.is_set() else self._drained

    def write_parts(self, parts: Sequence[bytes]) -> None:
        self.write(b"".join(parts))  # each line is routed whole (`route`)

    def write_lossy(self, data: bytes) -> bool:
        self.write(data)
        return True

    async def wait_drained(self) -> None:
        while self.queued:
            await self._drained.wait()

    # routing -----------------------------------------------------------------------------------

    def open(self, stream: Stream, requests: list[Message]) -> None:
        """Register a POST stream before its requests reach the session (replies can be
        synchronous)."""
        for msg in requests:
            stream.waiting.add(_key(msg.id))
            token = _progress_token(msg)
            if token is not None:
                stream.tokens.add(_key(token))
        self.streams.append(stream)

    def open_get(self, stream: Stream) -> None:
        self.get_stream = stream
        backlog, self.backlog = list(self.backlog), collections.deque(maxlen=BACKLOG_MESSAGES)
        for line in backlog:
            stream.put(line)

    def route(self, line: bytes) -> None:
        try:
            decoded = decode(line)
        except McpoolError:
            return  # the session only writes what it encoded: nothing to route
        for msg in decoded if isinstance(decoded, list) else [decoded]:
            self._route_one(msg, line if not isinstance(decoded, list) else _encode(msg))

    def _route_one(self, msg: Message, line: bytes) -> None:
        if msg.method is UNSET:
            key = _key(msg.id)
            for stream in self.streams:
                if key in stream.waiting:
                    stream.waiting.discard(key)
                    status = _error_status(msg) if stream.modern else 200
                    if status != 200 and not stream.touched and not stream.waiting:
                        stream.error_reply = (status, line)
                        stream.close()
                        return
                    if stream.json:
                        stream.responses.append(line)
                    else:
                        stream.put(line)
                    if not stream.waiting:
                        if stream.json:
                            stream.put(_json_body(stream.responses))
                        stream.close()
                    return
            return  # its stream is gone (the client disconnected): nobody to tell
        if msg.method == "notifications/progress":
            token = _progress_token(msg)
            for stream in self.streams:
                if token is not None and _key(token) in stream.tokens and not stream.json:
                    stream.put(line)
                    return
        for stream in reversed(self.streams):
            if not stream.json and stream.waiting:
                stream.put(line)
                return
        if self.get_stream is not None:
            self.get_stream.put(line)
        else:
            self.backlog.append(line)

    def detach(self, stream: Stream) -> None:
        if stream in self.streams:
            self.streams.remove(stream)
        if self.get_stream is stream:
            self.get_stream = None
        self.release(stream.queued)
        stream.queued = 0
        self.on_idle()

    def release(self, size: int) -> None:
        self.queued -= size
        if self.queued <= 0:
            self.queued = 0
            self._drained.set()

    def close(self) -> None:
        for stream in [*self.streams, *([self.get_stream] if self.get_stream else [])]:
            stream.close()


def _progress_token(msg: Message) -> Any:
    if msg.params is UNSET:
        return None
    try:
        params = _decoder.decode(msg.params)
    except msgspec.DecodeError:
        return None
    if not isinstance(params, dict):
        return None
    if msg.method == "notifications/progress":
        return _usable_token(params.get("progressToken"))
    meta = params.get("_meta")
    return _usable_token(meta.get("progressToken")) if isinstance(meta, dict) else None


def _usable_token(token: Any) -> Any:
    """A progress token is a string or a number (MCP); anything else (an object, an array, a
    bool) routes nothing, rather than raising where the session's writes are routed."""
    if isinstance(token, str | int | float) and not isinstance(token, bool):
        return token
    return None


def _error_status(msg: Message) -> int:
    """The HTTP status a 2026-07-28 response must carry (200 unless it is such an error)."""
    if msg.error is UNSET:
        return 200
    try:
        error = _decoder.decode(msg.error)
    except msgspec.DecodeError:
        return 200
    return error_status(error.get("code")) if isinstance(error, dict) else 200


def _encode(msg: Message) -> bytes:
    return msgspec.json.encode(msg)


def _json_body(responses: list[bytes]) -> bytes:
    return responses[0] if len(responses) == 1 else b"[" + b",".join(responses) + b"]"


# -- request checks (pure) -----------------------------------------------------------------------


def is_loopback_host(host: str) -> bool:
    """`localhost`, 127.0.0.0/8 or ::1, with or without a port (`[::1]:8080`)."""
    host = host.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def origin_allowed(origin: str | None) -> bool:
    """No Origin (not a browser) is fine; a browser page must itself be on loopback."""
    if origin is None:
        return True
    parts = urlsplit(origin.strip())
    return parts.scheme in ("http", "https") and is_loopback_host(parts.netloc)


def parse_settings_header(value: str | None) -> list[str] | None:
    """`X-Mcpool-Settings: /a/b.json, /c.json` -> paths; None when absent. Raises ValueError."""
    if value is None:
        return None
    paths = [p.strip() for p in value.split(",") if p.strip()]
    if not paths:
        raise ValueError("X-Mcpool-Settings names no file")
    for p in paths:
        if not os.path.isabs(p):
            raise ValueError(f"X-Mcpool-Settings paths must be absolute: {p!r}")
    return [os.path.normpath(p) for p in paths]


def parse_bind(value: str) -> tuple[str, int]:
    """`127.0.0.1:8765`, `[::1]:8765`, `localhost:8765` -> (host, port). Raises ValueError."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    number = int(port)
    if not 0 <= number <= 65535:
        raise ValueError(f"port out of range: {number}")
    return host, number


def bind_is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# -- the server ----------------------------------------------------------------------------------


class _HttpSession:
    def __init__(self, sid: str, state: Any, outbox: SessionOutbox, *, ephemeral: bool) -> None:
        self.id = sid
        self.state = state
        self.outbox = outbox
        self.ephemeral = ephemeral
        self.idle = trio.CancelScope(deadline=math.inf)
        self.ended = trio.Event()

    @property
    def session(self) -> Session:
        session: Session = self.state.session
        return session

    def touch(self) -> None:
        busy = self.outbox.streams or self.outbox.get_stream is not None
        self.idle.deadline = math.inf if busy else trio.current_time() + SESSION_IDLE


class _ConnectionOver(Exception):
    """This connection must end (already logged): a request failed once its response began."""


class _Reply(Exception):
    """A plain (non-streamed) HTTP answer, raised from anywhere in a request's handling."""

    def __init__(
        self, status: int, body: bytes = b"", headers: list[tuple[str, str]] | None = None
    ):
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = headers or []


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def _rpc_error(status: int, code: int, message: str, reason: str, msg_id: Any = None) -> _Reply:
    body = error_response(msg_id, code, message, {"reason": reason}).rstrip(b"\n")
    return _Reply(status, body, [("content-type", "application/json")])


# Every version the endpoint accepts in MCP-Protocol-Version: the handshake era's (negotiated by
# initialize) and the modern era's (per request).
SERVED_VERSIONS: frozenset[str] = frozenset((*MODERN_VERSIONS, *HANDSHAKE_VERSIONS))


def _unsupported_version(version: str, msg_id: Any) -> _Reply:
    """400 with -32022 naming what is served (streamable-http, "Protocol Version Header")."""
    body = error_response(
        msg_id,
        UNSUPPORTED_PROTOCOL_VERSION,
        "Unsupported protocol version",
        # What server/discover lists (its supportedVersions): the versions a request can name.
        {"supported": list(reversed(MODERN_VERSIONS)), "requested": version},
    ).rstrip(b"\n")
    return _Reply(400, body, [("content-type", "application/json")])


def modern_refusal(version: str | None, msg: Message, headers: dict[str, str]) -> _Reply | None:
    """The endpoint's own answer to a single request before any session sees it, or None.

    An unknown MCP-Protocol-Version is -32022 (400) with the request's id; at 2026-07-28 the
    methods that revision removed are -32601 (404), and headers contradicting the body -32020
    (400) (streamable-http, "Request Metadata" and "Server Validation").
    """
    msg_id = msg.id if msg.id is not UNSET else None
    try:
        params = decode_params(msg.params) if msg.params is not UNSET else {}
    except McpoolError:
        params = {}  # the session answers a malformed params object itself
    meta = params.get("_meta")
    declared = meta.get(META_PROTOCOL_VERSION) if isinstance(meta, dict) else None
    if version is not None and isinstance(declared, str) and declared != version:
        return _rpc_error(
            400,
            HEADER_MISMATCH,
            "Header mismatch",
            f"MCP-Protocol-Version {version} does not match the body's protocol version {declared}",
            msg_id,
        )
    if version is not None and version not in SERVED_VERSIONS:
        return _unsupported_version(version, msg_id)
    if version not in MODERN_VERSIONS or not msg.is_request or not isinstance(msg.method, str):
        return None
    if msg.method in REMOVED_AT_MODERN:
        return _rpc_error(
            404,
            METHOD_NOT_FOUND,
            "Method not found",
            f"{msg.method} is not part of protocol {version}",
            msg_id,
        )
    why = header_mismatch(msg.method, params, headers)
    if why is not None:
        return _rpc_error(400, HEADER_MISMATCH, "Header mismatch", why, msg_id)
    return None


class HttpEndpoint:
    def __init__(
        self,
        host: SessionHost,
        bind: tuple[str, int],
        *,
        allow_remote: bool = False,
        max_body: int = 16 * 1024 * 1024,
        session_buffer: int = 8 * 1024 * 1024,
    ) -> None:
        self.host = host
        self.bind = bind
        self.allow_remote = allow_remote
        self.max_body = max_body
        self.session_buffer = session_buffer
        self.sessions: dict[str, _HttpSession] = {}
        self.port: int | None = None
        self._nursery: trio.Nursery | None = None

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        if not (self.allow_remote or bind_is_loopback(self.bind[0])):
            raise ValueError(f"refusing to serve on {self.bind[0]}: not loopback")
        listeners = await trio.open_tcp_listeners(self.bind[1], host=self.bind[0])
        sock = listeners[0].socket
        self.port = sock.getsockname()[1]
        self.host.log("info", "HTTP endpoint listening", url=f"http://{self._url_host()}{PATH}")
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started(self.port)
            try:
                await trio.serve_listeners(self._connection, listeners, handler_nursery=nursery)
            finally:
                for hs in list(self.sessions.values()):
                    hs.session.close("the daemon is shutting down")

    def _url_host(self) -> str:
        host = self.bind[0]
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    # -- connections --------------------------------------------------------------------------

    async def _connection(self, stream: trio.SocketStream) -> None:
        import h11

        try:
            peer = stream.socket.getpeername()
            local = stream.socket.getsockname()
            peer_loopback = ipaddress.ip_address(peer[0]).is_loopback
            if peer_loopback:
                uid = await peer_uid_off_loop((peer[0], peer[1]), (local[0], local[1]))
                if uid != os.getuid():
                    self.host.log(
                        "warning", "refused an HTTP connection from another user", uid=uid
                    )
                    await stream.aclose()
                    return
            elif not self.allow_remote:
                await stream.aclose()
                return
            conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
            while True:
                got = await self._read_request(stream, conn)
                if got is None:
                    break
                request, body = got
                await self._respond(stream, conn, request, body, peer_loopback)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                conn.start_next_cycle()
        except h11.RemoteProtocolError as exc:
            # Not HTTP (or broken HTTP): say so when a response can still start, then close.
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                with trio.move_on_after(1.0), contextlib.suppress(Exception):
                    reply = _Reply(exc.error_status_hint, f"bad request: {exc}".encode())
                    await self._send_plain(stream, conn, reply, close=True)
        except (
            trio.BrokenResourceError,
            trio.ClosedResourceError,
            OSError,
            h11.ProtocolError,
            _ConnectionOver,
        ):
            pass  # the client went away or spoke broken HTTP: only its connection ends
        except Exception as exc:  # one connection must never end the endpoint
            self.host.log(
                "error",
                f"HTTP connection failed: {type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(),
            )
        finally:
            with trio.move_on_after(1.0, shield=True):
                await stream.aclose()

    async def _read_request(
        self, stream: trio.SocketStream, conn: h11.Connection
    ) -> tuple[h11.Request, bytes] | None:
        import h11

        request: h11.Request | None = None
        body = bytearray()
        first = True
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                bound = KEEPALIVE_IDLE if first and request is None else HEADER_TIMEOUT
                with trio.move_on_after(bound) as scope:
                    data = await stream.receive_some(65536)
                if scope.cancelled_caught:
                    return None
                first = False
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > self.max_body:
                    await self._send_plain(
                        stream, conn, _Reply(413, b"request body too large"), close=True
                    )
                    return None
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                return request, bytes(body)
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return None

    async def _send(self, stream: trio.SocketStream, conn: h11.Connection, event: Any) -> None:
        data = conn.send(event)
        if data:
            await stream.send_all(data)

    async def _send_plain(
        self, stream: trio.SocketStream, conn: h11.Connection, reply: _Reply, close: bool = False
    ) -> None:
        import h11

        headers = [
            ("server", SERVER_NAME.decode()),
            ("content-length", str(len(reply.body))),
            *reply.headers,
        ]
        if close:
            headers.append(("connection", "close"))
        await self._send(
            stream,
            conn,
            h11.Response(status_code=reply.status, headers=headers, reason=_reason(reply.status)),
        )
        if reply.body:
            await self._send(stream, conn, h11.Data(data=reply.body))
        await self._send(stream, conn, h11.EndOfMessage())

    # -- requests -----------------------------------------------------------------------------

    async def _respond(
        self,
        stream: trio.SocketStream,
        conn: h11.Connection,
        request: h11.Request,
        body: bytes,
        peer_loopback: bool,
    ) -> None:
        import h11

        # h11 has checked the names (tokens) and values (no CR, LF or NUL); latin-1 decodes any
        # byte, so a value is text whatever the client sent.
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.headers}
        try:
            reply = await self._route(stream, conn, request, headers, body, peer_loopback)
        except _Reply as exc:
            reply = exc
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, h11.ProtocolError):
            raise  # the client went away, or HTTP broke: its connection ends
        except Exception as exc:
            # The fence of every request: a bug met by one request answers that request only.
            self.host.log(
                "error",
                f"HTTP request failed: {type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(),
            )
            if conn.our_state is not h11.SEND_RESPONSE:
                raise _ConnectionOver() from None  # its response began: end the connection
            reply = _rpc_error(
                500,
                INTERNAL_ERROR,
                "Internal error",
                f"{type(exc).__name__}: {exc} (the daemon log has more)",
            )
        if reply is not None:
            await self._send_plain(stream, conn, reply)

    async def _route(
        self,
        stream: trio.SocketStream,
        conn: h11.Connection,
        request: h11.Request,
        headers: dict[str, str],
        body: bytes,
        peer_loopback: bool,
    ) -> _Reply | None:
        if not origin_allowed(headers.get("origin")):
            raise _rpc_error(
                403, INVALID_REQUEST, "Forbidden", "the Origin is not a loopback origin"
            )
        if not self.allow_remote and not is_loopback_host(headers.get("host", "")):
            raise _rpc_error(403, INVALID_REQUEST, "Forbidden", "the Host is not a loopback name")
        target = request.target.decode("latin-1").partition("?")[0]
        if target != PATH:
            raise _Reply(404, b"not found: mcpool serves MCP at /mcp")
        method = request.method.decode()
        version = headers.get("mcp-protocol-version")
        if method != "POST" and version is not None and version not in SERVED_VERSIONS:
            raise _unsupported_version(version, None)
        if method == "POST":
            return await self._post(stream, conn, headers, body, peer_loopback)
        if method == "GET":
            return await self._get(stream, conn, headers)
        if method == "DELETE":
            hs = self._session_of(headers, required=True)
            assert hs is not None
            hs.session.close("the client ended the session")
            return _Reply(200)
        raise _Reply(405, b"", [("allow", "GET, POST, DELETE")])

    def _session_of(self, headers: dict[str, str], *, required: bool) -> _HttpSession | None:
        sid = headers.get("mcp-session-id")
        if sid is None:
            if required:
                raise _rpc_error(
                    400, INVALID_REQUEST, "Bad Request", "an Mcp-Session-Id header is required"
                )
            return None
        hs = self.sessions.get(sid)
        if hs is None or hs.session.closed:
            raise _rpc_error(404, INVALID_REQUEST, "Session not found", f"no session {sid}")
        return hs

    def _holder_of(self, requests: list[Message]) -> _HttpSession | None:
        """The one-POST session holding the call a lone 2026-07-28 retry carries on (its
        requestState names the call: session/_input.py), if any."""
        if len(requests) != 1 or requests[0].params is UNSET:
            return None
        if b"requestState" not in bytes(requests[0].params):
            return None  # most requests: not decoded twice (handle_line decodes them)
        try:
            state = decode_params(requests[0].params).get("requestState")
        except McpoolError:
            return None
        if state is None:
            return None
        for hs in self.sessions.values():
            if hs.ephemeral and not hs.session.closed and hs.session.holds_state(state):
                return hs
        return None

    async def _post(
        self,
        stream: trio.SocketStream,
        conn: h11.Connection,
        headers: dict[str, str],
        body: bytes,
        peer_loopback: bool,
    ) -> _Reply | None:
        ctype = headers.get("content-type", "").partition(";")[0].strip().lower()
        if ctype != "application/json":
            raise _rpc_error(
                415, INVALID_REQUEST, "Unsupported Media Type", "send application/json"
            )
        accept = headers.get("accept", "*/*").lower()
        sse = "text/event-stream" in accept or "*/*" in accept
        if not (sse or "application/json" in accept):
            raise _rpc_error(
                406,
                INVALID_REQUEST,
                "Not Acceptable",
                "accept application/json or text/event-stream",
            )
        try:
            decoded = decode(body)
        except McpoolError as exc:
            obj = exc.to_error_object()
            raise _Reply(
                400,
                error_response(None, obj.code, obj.message, obj.data).rstrip(b"\n"),
                [("content-type", "application/json")],
            ) from None
        messages = decoded if isinstance(decoded, list) else [decoded]
        version = headers.get("mcp-protocol-version")
        for msg in messages:
            refusal = modern_refusal(version, msg, headers)
            if refusal is not None:
                raise refusal
        requests = [m for m in messages if m.is_request]
        extra: list[tuple[str, str]] = []
        hs = self._session_of(headers, required=False)
        if hs is None:
            hs = self._holder_of(requests)  # a retry goes to the session holding its call
        if hs is None:
            modern = headers.get("mcp-protocol-version") in MODERN_VERSIONS
            if not any(m.method == "initialize" for m in requests) and not modern:
                raise _rpc_error(
                    400, INVALID_REQUEST, "Bad Request", "an Mcp-Session-Id header is required"
                )
            hs = self._new_session(
                headers,
                peer_loopback,
                ephemeral=modern and not any(m.method == "initialize" for m in requests),
            )
            if not hs.ephemeral:
                extra.append(("mcp-session-id", hs.id))
        if not requests:
            hs.session.handle_line(body)
            hs.touch()
            return _Reply(202, b"", extra)
        out = Stream(hs.outbox, kind="post", json=not sse)
        out.modern = hs.ephemeral and len(requests) == 1
        if hs.ephemeral:
            # The request's own session: its tools/call checks the Mcp-Param-* headers.
            hs.session.request_headers = headers
        hs.outbox.open(out, requests)
        hs.touch()
        hs.session.handle_line(body)
        try:
            await self._stream(stream, conn, out, extra)
        finally:
            out.close()
            if hs.ephemeral and not hs.outbox.streams and not hs.session.awaiting_retry:
                # Held for the client's retry (its input_required): it ends with the retry's
                # POST, or idle (SESSION_IDLE, past the retry's own bound). A retry may come
                # before this POST's stream has ended here (the client read the answer first):
                # the session then ends with the last of its POSTs.
                hs.session.close("the request is over")
            hs.touch()
        return None

    async def _get(
        self, stream: trio.SocketStream, conn: h11.Connection, headers: dict[str, str]
    ) -> _Reply | None:
        if "text/event-stream" not in headers.get("accept", "").lower():
            raise _Reply(405, b"", [("allow", "POST, DELETE")])
        hs = self._session_of(headers, required=True)
        assert hs is not None
        if hs.outbox.get_stream is not None:
            raise _rpc_error(409, INVALID_REQUEST, "Conflict", "this session's GET stream is open")
        out = Stream(hs.outbox, kind="get")
        hs.outbox.open_get(out)
        hs.touch()
        try:
            await self._stream(stream, conn, out, [])
        finally:
            out.close()
            hs.touch()
        return None

    async def _stream(
        self,
        stream: trio.SocketStream,
        conn: h11.Connection,
        out: Stream,
        extra: list[tuple[str, str]],
    ) -> None:
        """Write `out` as the response body until it closes or the client goes away."""
        import h11

        first: bytes | None = None
        if out.modern:
            # The head waits for the first message: an error alone has its own status.
            with contextlib.suppress(trio.EndOfChannel):
                first = await out.receive.receive()
            if first is None and out.error_reply is not None:
                status, body = out.error_reply
                await self._send_plain(
                    stream,
                    conn,
                    _Reply(status, body, [("content-type", "application/json"), *extra]),
                )
                return
        if out.json:
            chunks = [*([first] if first is not None else []), *[c async for c in out.receive]]
            for chunk in chunks:
                out.sent(chunk)
            await self._send_plain(
                stream,
                conn,
                _Reply(200, b"".join(chunks), [("content-type", "application/json"), *extra]),
            )
            return
        await self._send(
            stream,
            conn,
            h11.Response(
                status_code=200,
                reason=b"OK",
                headers=[
                    ("server", SERVER_NAME.decode()),
                    ("content-type", "text/event-stream"),
                    ("cache-control", "no-cache"),
                    *extra,
                ],
            ),
        )
        gone = False
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                # The client may close the connection at any time; h11 keeps what it pipelines.
                nonlocal gone
                while True:
                    try:
                        data = await stream.receive_some(65536)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        data = b""
                    if not data:
                        gone = True
                        nursery.cancel_scope.cancel()
                        return
                    conn.receive_data(data)

            nursery.start_soon(watch)
            if first is not None:
                await self._send(stream, conn, h11.Data(data=first))
                out.sent(first)
            async for chunk in out.receive:
                await self._send(stream, conn, h11.Data(data=chunk))
                out.sent(chunk)
            nursery.cancel_scope.cancel()
        if gone:
            raise trio.BrokenResourceError("the client closed the stream")
        await self._send(stream, conn, h11.EndOfMessage())

    # -- sessions -----------------------------------------------------------------------------

    def _new_session(
        self, headers: dict[str, str], peer_loopback: bool, *, ephemeral: bool
    ) -> _HttpSession:
        try:
            named = parse_settings_header(headers.get(SETTINGS_HEADER))
        except ValueError as exc:
            raise _rpc_error(400, INVALID_REQUEST, "Bad Request", str(exc)) from None
        if named is not None and not peer_loopback:
            raise _rpc_error(
                403,
                INVALID_REQUEST,
                "Forbidden",
                "X-Mcpool-Settings is accepted from loopback only",
            )
        sources = named if named is not None else [self.host.config_path]
        outbox = SessionOutbox(self.session_buffer)
        state = self.host.open_session(
            outbox, name="http", sources=sources, peer="http", via="http"
        )
        sid = secrets.token_urlsafe(24)
        hs = _HttpSession(sid, state, outbox, ephemeral=ephemeral)
        outbox.on_idle = hs.touch
        self.sessions[sid] = hs
        assert self._nursery is not None
        self._nursery.start_soon(self._run_session, hs)
        return hs

    async def _run_session(self, hs: _HttpSession) -> None:
        """One HTTP session's tasks, in the endpoint's nursery: whatever fails in them ends
        this session only (logged with its traceback), never the endpoint."""
        session = hs.session
        reason = "the client disconnected"
        try:
            async with trio.open_nursery() as nursery:
                session.on_close = lambda _s: nursery.cancel_scope.cancel()
                # As on the socket: a notifier task only while one is due; and the task that
                # bounds a held call's wait for its retry (session/_input.py).
                session.spawn = nursery.start_soon
                nursery.start_soon(self.host.apply_to_session, hs.state)
                hs.touch()
                with hs.idle:
                    await trio.sleep_forever()
                reason = f"no HTTP request for {SESSION_IDLE:g} s"
                nursery.cancel_scope.cancel()
        except Exception as exc:
            reason = f"internal error: {type(exc).__name__}: {exc}"
            self.host.log(
                "error",
                f"HTTP session {hs.id} failed: {type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(),
            )
        finally:
            self.sessions.pop(hs.id, None)
            hs.outbox.close()
            # The session's writer calls back into this record of it (a reference cycle that
            # kept the ended session alive until a full collection); nothing to touch any more.
            hs.outbox.on_idle = _nothing
            self.host.close_session(hs.state, reason)
            hs.ended.set()


__all__ = [
    "HttpEndpoint",
    "SessionHost",
    "SessionOutbox",
    "Stream",
    "bind_is_loopback",
    "is_loopback_host",
    "origin_allowed",
    "parse_bind",
    "parse_settings_header",
]
