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

Every byte is bounded (X8). What waits for a session's client (on its streams, or for a GET
stream it has not opened) counts against `sessionBufferBytes`; a lossy message (log, progress)
is dropped and counted (`daemonctl sessions`) past half of it, or past STREAMLESS_LOSSY_BYTES
while no stream is open, and a session is cut only for what it cannot lose. A request's head
and its body each have one deadline (`httpHeadTimeout`, `httpBodyTimeout`), however their
bytes are spread; Origin, Host and everything else the head decides are checked before the body
is read. Connections (in all, per uid, waiting for their uid), HTTP sessions (the oldest idle
is ended for a new one) and the bytes of bodies being read at once are capped by `daemon`
options (daemon/_http_limits.py has the bookkeeping); each refusal is an HTTP error naming its
limit and option. Memory freed by ended sessions is handed back to the system (malloc_trim).

Sessions: `initialize` without an `Mcp-Session-Id` creates one (handshake era); later requests
name it, and `DELETE` ends it, as does an idle timeout. A request without a session id that
carries a modern `MCP-Protocol-Version` gets a session of its own that lasts as long as its POST
(the modern era has no handshake), so whatever era a `Session` speaks is served the same way.
Settings: the daemon's config file, or the files named by `X-Mcpool-Settings`.

Security: the endpoint binds loopback unless `--http-allow-remote`; a browser's `Origin` that is
not a loopback origin is refused (403), and so is a non-loopback `Host` (DNS rebinding). Loopback
TCP has no SO_PEERCRED, so the owner of a loopback peer's socket is asked of the kernel
(`mcpool.pool._peercred`, sock_diag) and a peer of another uid is closed before a byte is read,
as on the Unix socket (X1, X7); refusals are logged once a minute per uid, with a count.

Shared tasks and their fences: the accept loop runs no peer input (an accept, the pending
count, a spawn or a close); each connection's task is fenced (its error ends it, logged), each
request within it (a 500), each HTTP session's tasks (its error ends that session).

HTTP/1.1 is spoken with h11 (the sans-I/O parser the house style follows); it is imported only
when the endpoint starts.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import errno
import ipaddress
import itertools
import math
import os
import secrets
import socket
import traceback
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import msgspec
import trio
from msgspec import UNSET

from mcpool.pool._peercred import (
    REFUSAL_LOG_PERIOD,
    PeerUid,
    RefusalTally,
    TallyLine,
    peer_uid_off_loop,
)
from mcpool.protocol import (
    HANDSHAKE_VERSIONS,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    MESSAGE_TOO_LARGE,
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

from ._http_limits import (
    ANSWERED,
    Admission,
    BodyBudget,
    Peer,
    Verdict,
    heap_trimmer,
)
from ._settings import DaemonOptions
from ._sse import (
    HISTORY_BYTES,
    ID_ROOM,
    RESUME_WINDOW,
    ResumeKind,
    decide_resume,
    message_event,
    primes,
    priming_event,
)

if TYPE_CHECKING:
    import h11

    from mcpool.session import Session

PATH = "/mcp"
SESSION_IDLE = 600.0  # an HTTP session with no request and no open stream for this long ends
KEEPALIVE_IDLE = 120.0  # an idle keep-alive connection is closed after this
MAX_HEADER_BYTES = 64 * 1024  # a request head larger than this is a 431
READ_CHUNK = 65536
# A refusal that ends its connection is sent, and what the peer still sends is read and dropped
# (so that its answer is not lost to a reset), within this.
REFUSAL_BOUND = 2.0
CLOSE_BOUND = 1.0  # closing a connection's socket
# The kernel is out of fds or memory: the accept loop pauses this long (trio's own choice).
ACCEPT_SHORTAGES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
ACCEPT_RETRY = 0.1
ACCEPT_GONE = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM})  # that peer left
# Connections accepted per turn of the accept loop. A full batch means a flood: the loop then
# rests FLOOD_REST times as long as the batch took, so that a flood of connections (another
# uid's, refused) has at most a quarter of the loop and the sessions the rest. Smaller batches
# cost the sessions less per turn; a slower drain keeps new connections (the owner's among the
# attacker's, in the kernel's one queue) waiting longer (tools/bench/hostile_http.py).
ACCEPT_BATCH = 8
FLOOD_REST = 3.0
LISTEN_BACKLOG = 4096  # the kernel's own cap (somaxconn) applies
# After sessions end (or a large body is done with), the heap is trimmed once this much later
# (the sessions that end together, a client's many DELETEs, are trimmed for once), then not
# again for TRIM_GAP.
TRIM_DELAY = 1.0
TRIM_GAP = 5.0
TRIM_BODY_BYTES = 1024 * 1024  # a request body this large, once read or refused, trims too
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


# Lossy messages: the session may lose them (a log line, a progress step), so past a bound they
# are dropped and counted rather than queued or the session cut (X8).
LOSSY_METHODS = frozenset({"notifications/message", "notifications/progress"})
# Lossy bytes kept for a session with no stream open (no GET stream, no POST waiting): nobody
# reads them until a GET stream opens, so only a little of what a chatty server says is kept.
STREAMLESS_LOSSY_BYTES = 128 * 1024
# A lossy message is dropped once the session's queue would pass this share of
# sessionBufferBytes: answers keep the rest, so a client that reads slowly loses log lines
# before it is cut for not reading.
LOSSY_SHARE = 2
_SSE_HEAD = b"event: message\ndata: "
_SSE_TAIL = b"\n\n"
_SSE_FRAME = ID_ROOM + len(_SSE_HEAD) + len(_SSE_TAIL)


class Stream:
    """One SSE (or JSON) response body the outbox can put messages on.

    `end` is the outbox's (its last message is queued: the connection sends what is left and
    finishes the body); `close` is the connection's (it is done with the body, sent or not:
    whatever is left unsent is dropped and given back to the session's byte count).

    A resumable stream (SSE, handshake era: daemon/_sse.py) outlives its connection: when the
    client goes away it is `detach`ed, and goes on taking messages for RESUME_WINDOW; a GET with
    `Last-Event-ID` attaches a new connection, which first sends again what the stream handed
    the old one after that id (its `history`, the newest HISTORY_BYTES), then the rest. Every
    byte it holds, history included, counts in the session's bytes; the history is the first
    thing given up when the session needs room.
    """

    def __init__(
        self, outbox: SessionOutbox, *, kind: str, json: bool = False, resumable: bool = False
    ) -> None:
        self.outbox = outbox
        self.kind = kind  # "post" or "get"
        self.json = json  # JSON response mode: only responses, sent together at the end
        self.number = outbox.stream_number()  # its events' ids: `<number>-<seq>`
        self.seq = 0  # the last event put on it
        self.resumable = resumable and not json
        self.history: collections.deque[tuple[int, bytes]] = collections.deque()
        self.history_bytes = 0
        self.last_taken = 0  # the seq of the last event a connection took (the channel is FIFO)
        # The connection sending it now (None: detached), and whether one is.
        self.owner: trio.CancelScope | None = None
        self.released = trio.Event()
        self.released.set()
        self.reattached = trio.Event()
        # 2026-07-28: a request answered by an error alone gets that error as a plain JSON body
        # with the status its code requires (400/404), so the head waits for the first message.
        self.modern = False
        self.touched = False
        self.error_reply: tuple[int, bytes] | None = None
        self.waiting: set[tuple[str, Any]] = set()
        self.tokens: set[tuple[str, Any]] = set()
        self.responses: list[bytes] = []  # JSON mode: the answers so far
        self.held = 0  # bytes in `responses`
        self.queued = 0  # bytes put on the channel and not sent yet
        self.ended = False
        self.closed = False
        self._send, self.receive = trio.open_memory_channel[bytes](math.inf)
        if self.resumable:
            outbox.resumable[self.number] = self

    def framed_size(self, line: bytes) -> int:
        return len(line) if self.json else _SSE_FRAME + len(line)

    def put(self, line: bytes) -> None:
        """Queue one message for the client (the outbox has admitted its bytes)."""
        if self.ended:
            return
        self.touched = True
        if self.json:
            chunk = line
        else:
            self.seq += 1
            chunk = message_event(self.number, self.seq, line)
        self.queued += len(chunk)
        self.outbox.add(len(chunk))
        self._send.send_nowait(chunk)

    def hold(self, line: bytes) -> None:
        """JSON mode: keep an answer for the body that carries them all."""
        self.responses.append(line)
        self.held += len(line)
        self.outbox.add(len(line))

    def finish_json(self) -> None:
        body = _json_body(self.responses)
        self.responses = []
        self.outbox.release(self.held)
        self.held = 0
        self.put(body)

    def taken(self, chunk: bytes) -> None:
        """A connection took `chunk` off the channel to send it: a resumable stream keeps it
        (its bytes still counted) until the newer history pushes it out."""
        if not self.resumable:
            return
        self.last_taken += 1
        self.queued -= len(chunk)
        self.history.append((self.last_taken, chunk))
        self.history_bytes += len(chunk)
        self.outbox.keep_history(len(chunk))
        if self.history_bytes > HISTORY_BYTES:
            self.forget(self.history_bytes - HISTORY_BYTES)

    def sent(self, chunk: bytes) -> None:
        """The connection wrote `chunk` to the socket."""
        if self.resumable:
            return  # counted in the history since `taken`
        self.queued -= len(chunk)
        self.outbox.release(len(chunk))

    def forget(self, need: int) -> int:
        """Give up the oldest history, at least `need` bytes of it (or all); the bytes freed."""
        freed = 0
        while self.history and freed < need:
            _seq, chunk = self.history.popleft()
            freed += len(chunk)
        self.history_bytes -= freed
        self.outbox.history_bytes -= freed
        return freed

    def after(self, seq: int) -> list[bytes]:
        """What this stream handed a connection after event `seq`, to send again."""
        return [chunk for n, chunk in self.history if n > seq]

    def attach(self, scope: trio.CancelScope) -> None:
        self.owner = scope
        self.released = trio.Event()
        self.reattached.set()

    def detach(self) -> None:
        """Its connection is done with it (gone, or taken over): kept for a resumption."""
        self.owner = None
        self.released.set()
        self.reattached = trio.Event()

    def end(self) -> None:
        """No more messages: the connection sends what is queued, then ends the body."""
        if self.ended:
            return
        self.ended = True
        self._send.close()
        self.outbox.unroute(self)

    def close(self) -> None:
        """The connection is done with this body: what it did not send is dropped."""
        if self.closed:
            return
        self.end()
        self.closed = True
        self.receive.close()  # the last receiver: trio discards what is still buffered
        self.outbox.release(self.queued + self.held)
        self.outbox.history_bytes -= self.history_bytes
        self.queued = self.held = self.history_bytes = 0
        self.responses = []
        self.history.clear()
        self.outbox.resumable.pop(self.number, None)
        self.released.set()
        self.reattached.set()  # nothing to wait for any more
        self.outbox.on_idle()


def _nothing() -> None:
    pass


class SessionOutbox:
    """The session's writer: routes every message it writes to one stream (see module doc),
    and bounds what waits for the client in bytes (X8).

    `queued` counts every byte held for the client: on streams, in answers a JSON body is
    waiting for, and in the backlog of a session with no stream. A message that cannot be lost
    cuts the session when the queue is past `sessionBufferBytes` (a message alone always fits);
    a lossy one (a log message, progress) is dropped and counted (`dropped`) once the queue is
    past half of it, or, with no stream open, once STREAMLESS_LOSSY_BYTES of them wait.
    """

    def __init__(self, limit: int, *, streamless_lossy: int = STREAMLESS_LOSSY_BYTES) -> None:
        self.limit = limit
        self.lossy_limit = limit // LOSSY_SHARE
        self.streamless_lossy = streamless_lossy
        self.queued = 0
        self.dropped = 0  # lossy messages dropped (daemonctl sessions)
        self.closed = False
        self.streams: list[Stream] = []  # open POST streams, oldest first
        self.get_stream: Stream | None = None
        # With no stream to put them on: (line, lossy), oldest first, for the next GET stream.
        self.backlog: collections.deque[tuple[bytes, bool]] = collections.deque()
        self.backlog_bytes = 0
        self.backlog_lossy = 0
        self._drained = trio.Event()
        self._drained.set()
        self.on_idle: Callable[[], None] = _nothing
        self._numbers = itertools.count(1)
        # Streams that can be resumed, by number (open ones, and detached ones awaiting a GET).
        self.resumable: dict[int, Stream] = {}
        # Bytes the resumable streams keep of what they already handed a connection: not
        # waiting (not in `queued`, which tells the session a write is pending), but within the
        # session's bound, and the first to go when it needs room.
        self.history_bytes = 0
        self.last_get: int | None = None  # the number of the latest standalone GET stream

    def stream_number(self) -> int:
        return next(self._numbers)

    # Writer protocol ---------------------------------------------------------------------------

    @property
    def buffered(self) -> int:
        return self.queued

    def write(self, data: bytes) -> None:
        for line in data.split(b"\n"):
            if line.strip():
                self.route(line)

    def write_parts(self, parts: Sequence[bytes]) -> None:
        self.write(b"".join(parts))  # each line is routed whole (`route`)

    def write_lossy(self, data: bytes) -> bool:
        """A message the session may lose: queued if it fits its bound, else dropped and counted
        (False). Never raises: the session is never cut for a lossy message."""
        delivered = True
        for line in data.split(b"\n"):
            if line.strip():
                delivered = self.route(line, lossy=True) and delivered
        return delivered

    async def wait_drained(self) -> None:
        while self.queued:
            await self._drained.wait()

    # accounting --------------------------------------------------------------------------------

    def add(self, size: int) -> None:
        self.queued += size
        if self._drained.is_set() and self.queued:
            self._drained = trio.Event()

    def release(self, size: int) -> None:
        self.queued -= size
        if self.queued <= 0:
            self.queued = 0
            self._drained.set()

    def keep_history(self, size: int) -> None:
        """`size` bytes left the queue for a stream's history."""
        self.release(size)
        self.history_bytes += size

    def _admit(self, size: int, lossy: bool) -> bool:
        """May `size` more bytes wait for the client? False: a lossy message is dropped."""
        bound = self.lossy_limit if lossy else self.limit
        if self.history_bytes and self.queued + self.history_bytes + size > bound:
            self._forget_history(self.queued + self.history_bytes + size - bound)
        if lossy:
            if self.queued + size > self.lossy_limit:
                self.dropped += 1
                return False
            return True
        if self.queued and self.queued + size > self.limit:
            raise McpoolError(
                f"the HTTP client stopped reading: {self.queued} bytes are waiting for it, and "
                f"more would pass the session's bound of {self.limit} (sessionBufferBytes)"
            )
        return True

    def _forget_history(self, need: int) -> None:
        """Resumption histories give way to messages (oldest streams first)."""
        for stream in list(self.resumable.values()):
            need -= stream.forget(need)
            if need <= 0:
                return

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
        """The session's GET stream opened: what waited for it goes on it first."""
        self.get_stream = stream
        self.last_get = stream.number
        backlog, self.backlog = self.backlog, collections.deque()
        self.release(self.backlog_bytes)
        self.backlog_bytes = self.backlog_lossy = 0
        for line, _lossy in backlog:
            stream.put(line)  # admitted when it was kept

    def route(self, line: bytes, *, lossy: bool = False) -> bool:
        """Route one line the session wrote; False when a lossy message was dropped."""
        if self.closed:
            return False  # the session is ending: nobody to write to
        try:
            decoded = decode(line)
        except McpoolError:
            return True  # the session only writes what it encoded: nothing to route
        if not isinstance(decoded, list):
            return self._route_one(decoded, line, lossy)
        delivered = True
        for msg in decoded:
            delivered = self._route_one(msg, _encode(msg), lossy) and delivered
        return delivered

    def _route_one(self, msg: Message, line: bytes, lossy: bool) -> bool:
        if msg.method is UNSET:
            self._answer(msg, line)
            return True
        lossy = lossy or msg.method in LOSSY_METHODS
        if msg.method == "notifications/progress":
            token = _progress_token(msg)
            for stream in self.streams:
                if token is not None and _key(token) in stream.tokens and not stream.json:
                    return self._offer(stream, line, lossy)
        for stream in reversed(self.streams):
            if not stream.json and stream.waiting:
                return self._offer(stream, line, lossy)
        if self.get_stream is not None:
            return self._offer(self.get_stream, line, lossy)
        return self._keep(line, lossy)

    def _answer(self, msg: Message, line: bytes) -> None:
        """A response goes to the stream of its request (none: its client left)."""
        key = _key(msg.id)
        for stream in self.streams:
            if key in stream.waiting:
                stream.waiting.discard(key)
                status = _error_status(msg) if stream.modern else 200
                if status != 200 and not stream.touched and not stream.waiting:
                    stream.error_reply = (status, line)
                    stream.end()
                    return
                if stream.json:
                    self._admit(len(line), lossy=False)
                    stream.hold(line)
                else:
                    self._admit(stream.framed_size(line), lossy=False)
                    stream.put(line)
                if not stream.waiting:
                    if stream.json:
                        stream.finish_json()
                    stream.end()
                return

    def _offer(self, stream: Stream, line: bytes, lossy: bool) -> bool:
        if not self._admit(stream.framed_size(line), lossy):
            return False
        stream.put(line)
        return True

    def _keep(self, line: bytes, lossy: bool) -> bool:
        """No stream: keep it for the next GET stream, within the bounds."""
        size = len(line)
        if lossy and self.backlog_lossy + size > self.streamless_lossy:
            self.dropped += 1
            return False
        if not self._admit(size, lossy):
            return False
        self.backlog.append((line, lossy))
        self.backlog_bytes += size
        if lossy:
            self.backlog_lossy += size
        self.add(size)
        return True

    def unroute(self, stream: Stream) -> None:
        """`stream` takes no more messages."""
        if stream in self.streams:
            self.streams.remove(stream)
        if self.get_stream is stream:
            self.get_stream = None

    def close(self) -> None:
        """The session ended: every stream ends, and nothing is kept for it any more."""
        self.closed = True
        for stream in [*self.streams, *([self.get_stream] if self.get_stream else [])]:
            stream.end()
        for stream in list(self.resumable.values()):
            if stream.owner is None:
                stream.close()  # detached: nobody will send it
        self.backlog.clear()
        self.release(self.backlog_bytes)
        self.backlog_bytes = self.backlog_lossy = 0


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


async def _listen(host: str, port: int) -> list[socket.socket]:
    """Non-blocking listening sockets on every address `host` names (as trio's
    open_tcp_listeners makes them), all on one port: the accept loop accepts from them
    directly, in batches."""
    infos = await trio.socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    listeners: list[socket.socket] = []
    try:
        for family, kind, proto, _name, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            listeners.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(listeners) > 1:  # the port the first was given, for all
                address = (address[0], listeners[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
    except BaseException:
        for sock in listeners:
            sock.close()
        raise
    return listeners


class _HttpSession:
    def __init__(self, sid: str, state: Any, outbox: SessionOutbox, *, ephemeral: bool) -> None:
        self.id = sid
        self.state = state
        self.outbox = outbox
        self.ephemeral = ephemeral
        self.idle = trio.CancelScope(deadline=math.inf)
        # Starts a task in the session's nursery (a detached stream's expiry); set once it runs.
        self.spawn: Callable[..., object] | None = None
        self.last_used = trio.current_time()  # the oldest idle session is evicted first
        self.ended = trio.Event()

    @property
    def session(self) -> Session:
        session: Session = self.state.session
        return session

    @property
    def busy(self) -> bool:
        return bool(self.outbox.streams) or self.outbox.get_stream is not None

    def touch(self) -> None:
        self.last_used = now = trio.current_time()
        self.idle.deadline = math.inf if self.busy else now + SESSION_IDLE


class _Outcome(enum.Enum):
    """How a stream's connection ended (`HttpEndpoint._stream`)."""

    ENDED = "ended"  # sent whole
    GONE = "gone"  # the client went away first
    TAKEN = "taken"  # another connection resumed it


class _ConnectionOver(Exception):
    """This connection must end (already logged): a request failed once its response began."""


class _Reply(Exception):
    """A plain (non-streamed) HTTP answer, raised from anywhere in a request's handling.
    `close`: the connection ends after it (what is left of the request is not read)."""

    def __init__(
        self,
        status: int,
        body: bytes = b"",
        headers: list[tuple[str, str]] | None = None,
        *,
        close: bool = False,
    ):
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = headers or []
        self.close = close


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def _rpc_error(status: int, code: int, message: str, reason: str, msg_id: Any = None) -> _Reply:
    body = error_response(msg_id, code, message, {"reason": reason}).rstrip(b"\n")
    return _Reply(status, body, [("content-type", "application/json")])


def limit_reply(
    status: int,
    message: str,
    reason: str,
    option: str | None,
    value: float,
    *,
    close: bool = True,
) -> _Reply:
    """A refusal for a limit: says which, its value and the `daemon` option that sets it (None:
    a fixed one). `close`: the connection ends after it. 503 and 429 say when to retry."""
    data: dict[str, Any] = {"reason": reason, "limit": value}
    if option is not None:
        data["option"] = f"daemon.{option}"
    body = error_response(None, INVALID_REQUEST, message, data).rstrip(b"\n")
    headers = [("content-type", "application/json")]
    if status in (503, 429):
        headers.append(("retry-after", "1"))
    return _Reply(status, body, headers, close=close)


def reply_bytes(reply: _Reply) -> bytes:
    """A whole HTTP/1.1 response that ends its connection, made without h11 (for a connection
    whose request was never read whole, or never read at all)."""
    head = [f"HTTP/1.1 {reply.status} {_reason(reply.status).decode()}"]
    head += [f"{name}: {value}" for name, value in reply.headers]
    head += [
        f"server: {SERVER_NAME.decode()}",
        f"content-length: {len(reply.body)}",
        "connection: close",
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + reply.body


def _content_length(headers: dict[str, str]) -> int | None:
    """The declared body length (h11 has refused a malformed one), None for a chunked body."""
    value = headers.get("content-length")
    return int(value) if value is not None and value.strip().isdigit() else None


def _body_too_large(size: int, most: int) -> _Reply:
    data = {
        "reason": f"the request body is {size} bytes or more, past the {most} a message may be",
        "option": "daemon.maxMessageBytes",
        "limit": most,
    }
    body = error_response(None, MESSAGE_TOO_LARGE, "Request body too large", data).rstrip(b"\n")
    return _Reply(413, body, [("content-type", "application/json")], close=True)


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
    """The `--http` server: its connections (admitted by `Admission`, daemon/_http_limits.py),
    its requests and its sessions. `options` gives the daemon's current options; each limit is
    read when it is applied, so a settings change applies to what comes next."""

    def __init__(
        self,
        host: SessionHost,
        bind: tuple[str, int],
        *,
        allow_remote: bool = False,
        options: Callable[[], DaemonOptions] = DaemonOptions,
    ) -> None:
        self.host = host
        self.bind = bind
        self.allow_remote = allow_remote
        self.options = options
        self.sessions: dict[str, _HttpSession] = {}
        self.port: int | None = None
        self.admission = Admission(os.getuid())
        self.bodies = BodyBudget()
        self.refusals: RefusalTally[Verdict, Peer] = RefusalTally()
        self._uids = PeerUid()  # sock_diag, on the loop: an exact lookup takes microseconds
        self._freed = trio.Event()
        self._nursery: trio.Nursery | None = None

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        if not (self.allow_remote or bind_is_loopback(self.bind[0])):
            raise ValueError(f"refusing to serve on {self.bind[0]}: not loopback")
        listeners = await _listen(*self.bind)
        self.port = listeners[0].getsockname()[1]
        self.host.log("info", "HTTP endpoint listening", url=f"http://{self._url_host()}{PATH}")
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    nursery.start_soon(self._log_refusals)
                    nursery.start_soon(self._trim_heap)
                    for listener in listeners:
                        nursery.start_soon(self._accept, listener, nursery)
                    task_status.started(self.port)
                    await trio.sleep_forever()
                finally:
                    for hs in list(self.sessions.values()):
                        hs.session.close("the daemon is shutting down")
                    self._log_tally(self.refusals.flush())
        finally:
            for listener in listeners:
                listener.close()
            self._uids.close()

    def _url_host(self) -> str:
        host = self.bind[0]
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    # -- connections --------------------------------------------------------------------------

    async def _accept(self, listener: socket.socket, nursery: trio.Nursery) -> None:
        """The accept loop: it accepts in batches and decides each connection at once where the
        kernel names its peer in microseconds (sock_diag): another uid's is closed right here,
        unread, so a flood of them costs an accept, a lookup and a close each, and no task.
        Under a flood (a full batch), it then rests (FLOOD_REST): most of the loop stays the
        sessions'. The rest of the connections get a task each."""
        failing = False
        while True:
            await trio.lowlevel.wait_readable(listener)
            began = trio.current_time()
            for _ in range(ACCEPT_BATCH):
                try:
                    sock, _address = listener.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:
                    if exc.errno in ACCEPT_GONE:
                        continue  # that peer left while it was being accepted
                    if exc.errno not in ACCEPT_SHORTAGES:
                        raise
                    if not failing:  # once per run of failures
                        self.host.log("error", f"HTTP accept failed: {exc}")
                    failing = True
                    await trio.sleep(ACCEPT_RETRY)
                    break
                failing = False
                try:
                    self._admit(sock, nursery)
                except Exception as exc:  # the accept loop goes on, whatever one connection met
                    sock.close()
                    self.host.log(
                        "error",
                        f"HTTP connection not admitted: {type(exc).__name__}: {exc}",
                        traceback=traceback.format_exc(),
                    )
            else:
                await trio.sleep((trio.current_time() - began) * FLOOD_REST)

    def _admit(self, sock: socket.socket, nursery: trio.Nursery) -> None:
        """A connection just accepted: closed (too many waiting for their uid; another uid's;
        no uid known), or given a task (served, refused in HTTP, or waiting for a slow lookup)."""
        opts = self.options()
        if not self.admission.arrive(opts.http_max_pending_lookups):
            self._refused(Verdict.PENDING_FULL, None)
            sock.close()
            return
        try:
            peer = self._peer_now(sock)
        except BaseException:
            self.admission.abandoned()
            raise
        if peer is None:  # the kernel has no sock_diag: asked off the loop, in the task
            nursery.start_soon(self._connection, sock, None)
            return
        verdict = self.admission.identified(
            peer,
            max_open=opts.http_max_connections,
            max_per_peer=opts.http_max_connections_per_uid,
        )
        if verdict is Verdict.SERVE or verdict in ANSWERED:
            nursery.start_soon(self._connection, sock, (peer, verdict))
            return
        self._refused(verdict, peer)
        sock.close()

    def _peer_now(self, sock: socket.socket) -> Peer | None:
        """Who is on the other end, where that is known at once: a remote address (with
        --http-allow-remote), or a loopback peer's uid from sock_diag (X7: asked of the kernel
        before a byte is read). None: the uid must be asked the slow way (`_peer_later`)."""
        try:
            peer = sock.getpeername()
            local = sock.getsockname()
        except OSError:
            return Peer(None)  # it left already
        if self.allow_remote:  # (a loopback bind has loopback peers only)
            ip = ipaddress.ip_address(peer[0])
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            if not ip.is_loopback:
                return Peer(None, peer[0])
        if not self._uids.available:
            return None
        uid = self._uids.lookup((peer[0], peer[1]), (local[0], local[1]))
        return Peer(uid) if uid is not None or self._uids.available else None

    async def _peer_later(self, sock: socket.socket) -> Peer:
        try:
            peer = sock.getpeername()
            local = sock.getsockname()
        except OSError:
            return Peer(None)
        return Peer(await peer_uid_off_loop((peer[0], peer[1]), (local[0], local[1])))

    async def _connection(self, sock: socket.socket, decided: tuple[Peer, Verdict] | None) -> None:
        """One connection's task: served, refused in HTTP, or first its peer looked up. Whatever
        goes wrong in it ends this connection only (logged with its traceback), never the
        endpoint."""
        try:
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        except BaseException:
            sock.close()
            self._forget(decided)
            raise
        try:
            if decided is None:
                try:
                    peer = await self._peer_later(sock)
                except BaseException:
                    self.admission.abandoned()
                    raise
                opts = self.options()
                verdict = self.admission.identified(
                    peer,
                    max_open=opts.http_max_connections,
                    max_per_peer=opts.http_max_connections_per_uid,
                )
            else:
                peer, verdict = decided
            if verdict is Verdict.SERVE:
                try:
                    await self._serve_connection(stream, peer)
                finally:
                    self.admission.left(peer)
                return
            self._refused(verdict, peer)
            if verdict in ANSWERED:
                try:
                    await self._send_refusal(stream, self._admission_reply(verdict, peer))
                finally:
                    self.admission.answered()
        except Exception as exc:  # one connection must never end the endpoint
            self.host.log(
                "error",
                f"HTTP connection failed: {type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(),
            )
        finally:
            with trio.move_on_after(CLOSE_BOUND, shield=True):
                await stream.aclose()

    def _forget(self, decided: tuple[Peer, Verdict] | None) -> None:
        """A connection whose task could not begin: its admission given back."""
        if decided is None:
            self.admission.abandoned()
        elif decided[1] is Verdict.SERVE:
            self.admission.left(decided[0])
        else:
            self.admission.answered()

    def _admission_reply(self, verdict: Verdict, peer: Peer) -> _Reply:
        opts = self.options()
        if verdict is Verdict.TOO_MANY:
            return limit_reply(
                503,
                "Too many connections",
                f"{self.admission.open} HTTP connections are open, the most the daemon takes",
                "httpMaxConnections",
                opts.http_max_connections,
            )
        return limit_reply(
            429,
            "Too many connections",
            f"{peer.describe(self.admission.owner)} has "
            f"{self.admission.by_peer.get(peer, 0)} HTTP connections open, the most one may",
            "httpMaxConnectionsPerUid",
            opts.http_max_connections_per_uid,
        )

    def _refused(self, verdict: Verdict, peer: Peer | None) -> None:
        line = self.refusals.refused(verdict, peer, trio.current_time())
        if line is not None:
            self._log_tally([line])

    def _log_tally(self, lines: list[TallyLine[Verdict, Peer]]) -> None:
        for line in lines:
            who = line.peer.describe(self.admission.owner) if line.peer else "peers"
            if line.first:
                text = (
                    f"refused an HTTP connection from {who}: {line.kind.value}; more "
                    f"refusals are counted, and logged every {REFUSAL_LOG_PERIOD:g} s"
                )
            else:
                text = (
                    f"refused {line.times} more HTTP connection{'s' if line.times > 1 else ''} "
                    f"from {who} since the last line: {line.kind.value}"
                )
            fields: dict[str, Any] = {"count": line.times, "refusal": line.kind.name.lower()}
            if line.peer is not None:
                fields["uid"] = line.peer.uid
                if line.peer.address is not None:
                    fields["address"] = line.peer.address
            self.host.log("warning", text, **fields)

    async def _log_refusals(self) -> None:
        """The counts of refusals whose minute is over, logged as they fall due."""
        while True:
            await trio.sleep(self.refusals.period / 4)
            self._log_tally(self.refusals.due(trio.current_time()))

    async def _trim_heap(self) -> None:
        """Memory freed by ended sessions goes back to the system (glibc keeps it otherwise:
        a flood's messages freed left the daemon at 1 GB). Sessions that end together are
        trimmed for once, at most once per TRIM_GAP; in a worker thread, off the loop."""
        trim = heap_trimmer()
        if trim is None:
            return
        while True:
            await self._freed.wait()
            await trio.sleep(TRIM_DELAY)
            self._freed = trio.Event()
            await trio.to_thread.run_sync(trim, abandon_on_cancel=True)
            await trio.sleep(TRIM_GAP)

    async def _send_refusal(self, stream: trio.SocketStream, reply: _Reply) -> None:
        """Send a refusal that ends the connection, then read what the peer still sends (and
        drop it) until it closes: closing with unread input resets the connection, and a
        client could lose the answer. Bounded in time and in bytes."""
        with trio.move_on_after(REFUSAL_BOUND):
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                await stream.send_all(reply_bytes(reply))
                await stream.send_eof()
                dropped = 0
                while dropped < self.options().max_message_bytes:
                    data = await stream.receive_some(READ_CHUNK)
                    if not data:
                        return
                    dropped += len(data)

    async def _serve_connection(self, stream: trio.SocketStream, peer: Peer) -> None:
        import h11

        loopback = peer.address is None
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        try:
            fresh = True
            while True:
                request = await self._read_head(stream, conn, fresh=fresh)
                if request is None:
                    break
                fresh = False
                await self._respond(stream, conn, request, loopback)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                conn.start_next_cycle()
        except _Reply as refusal:  # a limit that ends the connection
            await self._send_refusal(stream, refusal)
        except h11.RemoteProtocolError as exc:
            # Not HTTP (or broken HTTP): say so when a response can still start, then close.
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                if exc.error_status_hint == 431:
                    reply = limit_reply(
                        431,
                        "Request header fields too large",
                        f"the request head is larger than {MAX_HEADER_BYTES} bytes",
                        None,
                        MAX_HEADER_BYTES,
                    )
                else:
                    reply = _Reply(exc.error_status_hint, f"bad request: {exc}".encode())
                await self._send_refusal(stream, reply)
        except (
            trio.BrokenResourceError,
            trio.ClosedResourceError,
            OSError,
            h11.ProtocolError,
            _ConnectionOver,
        ):
            pass  # the client went away or spoke broken HTTP: only its connection ends

    async def _read_head(
        self, stream: trio.SocketStream, conn: h11.Connection, *, fresh: bool
    ) -> h11.Request | None:
        """The next request's head, or None when the client closed or stayed idle. A head has
        one deadline (httpHeadTimeout) from its first byte, or from the accept for a new
        connection, however its bytes are spread out: a client dribbling a head gets a 408."""
        import h11

        event = conn.next_event()
        if event is h11.NEED_DATA and not fresh:
            with trio.move_on_after(KEEPALIVE_IDLE) as idle:
                conn.receive_data(await stream.receive_some(READ_CHUNK))
            if idle.cancelled_caught:
                return None
            event = conn.next_event()
        timeout = self.options().http_head_timeout
        heard = not fresh
        with trio.move_on_after(timeout) as scope:
            while event is h11.NEED_DATA:
                data = await stream.receive_some(READ_CHUNK)
                heard = heard or bool(data)
                conn.receive_data(data)
                event = conn.next_event()
        if scope.cancelled_caught:
            if not heard:
                return None  # connected and said nothing: closed without a word
            raise limit_reply(
                408,
                "Request Timeout",
                f"the request head did not arrive whole within {timeout:g} s",
                "httpHeadTimeout",
                timeout,
            )
        return event if isinstance(event, h11.Request) else None

    async def _read_body(
        self, stream: trio.SocketStream, conn: h11.Connection, headers: dict[str, str]
    ) -> bytes:
        """The request's body, read within one deadline (httpBodyTimeout), no larger than
        maxMessageBytes, and only while the bodies being read at once stay within
        httpMaxPendingBodyBytes (a declared length is reserved whole before a byte is read)."""
        import h11

        opts = self.options()
        most = opts.max_message_bytes
        cap = opts.http_max_pending_body_bytes
        declared = _content_length(headers)
        if declared is not None and declared > most:
            raise _body_too_large(declared, most)
        reserved = declared or 0
        if not self.bodies.reserve(reserved, cap):
            raise self._bodies_full(reserved, cap)
        try:
            if conn.they_are_waiting_for_100_continue:
                go_on = h11.InformationalResponse(status_code=100, headers=[])
                await self._send(stream, conn, go_on)
            chunks: list[bytes] = []
            got = 0
            with trio.move_on_after(opts.http_body_timeout):
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        conn.receive_data(await stream.receive_some(READ_CHUNK))
                    elif isinstance(event, h11.Data):
                        got += len(event.data)
                        if got > most:
                            raise _body_too_large(got, most)
                        if got > reserved:  # chunked: reserved as it comes
                            if not self.bodies.reserve(got - reserved, cap, held=reserved):
                                raise self._bodies_full(got - reserved, cap)
                            reserved = got
                        chunks.append(bytes(event.data))
                    elif isinstance(event, h11.EndOfMessage):
                        return b"".join(chunks)
                    else:
                        raise _ConnectionOver()
            raise limit_reply(
                408,
                "Request Timeout",
                f"the request body did not arrive whole within {opts.http_body_timeout:g} s",
                "httpBodyTimeout",
                opts.http_body_timeout,
            )
        finally:
            self.bodies.release(reserved)
            if reserved >= TRIM_BODY_BYTES:
                self._freed.set()  # a large body's memory goes back too (_trim_heap)

    def _bodies_full(self, size: int, cap: int) -> _Reply:
        return limit_reply(
            503,
            "Too many request bodies",
            f"{self.bodies.reserved} bytes of request bodies are being read already; "
            f"{size} more would pass the daemon's bound",
            "httpMaxPendingBodyBytes",
            cap,
        )

    async def _send(self, stream: trio.SocketStream, conn: h11.Connection, event: Any) -> None:
        data = conn.send(event)
        if data:
            await stream.send_all(data)

    async def _send_plain(
        self, stream: trio.SocketStream, conn: h11.Connection, reply: _Reply
    ) -> None:
        import h11

        headers = [
            ("server", SERVER_NAME.decode()),
            ("content-length", str(len(reply.body))),
            *reply.headers,
        ]
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
        peer_loopback: bool,
    ) -> None:
        import h11

        # h11 has checked the names (tokens) and values (no CR, LF or NUL); latin-1 decodes any
        # byte, so a value is text whatever the client sent.
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.headers}
        try:
            try:
                self._check_head(request, headers)
            except _Reply:
                # Refused on its head. A request with no body is over once its end is seen
                # (its connection is kept); one with a body is answered with the body unread,
                # and its connection ends (below).
                conn.next_event()
                raise
            body = await self._read_body(stream, conn, headers)
            reply = await self._route(stream, conn, request, headers, body, peer_loopback)
        except _Reply as exc:
            reply = exc
        except (
            trio.BrokenResourceError,
            trio.ClosedResourceError,
            OSError,
            h11.ProtocolError,
            _ConnectionOver,
        ):
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
        if reply is None:
            return
        if reply.close or conn.their_state is not h11.DONE:
            raise reply  # _serve_connection sends it and ends the connection
        await self._send_plain(stream, conn, reply)

    def _check_head(self, request: h11.Request, headers: dict[str, str]) -> None:
        """What the head alone decides, before a byte of the body is read (a bad Origin with a
        15 MiB body is refused at once, not once the body is in memory)."""
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
        if method not in ("GET", "POST", "DELETE"):
            raise _Reply(405, b"", [("allow", "GET, POST, DELETE")])
        version = headers.get("mcp-protocol-version")
        if method != "POST" and version is not None and version not in SERVED_VERSIONS:
            raise _unsupported_version(version, None)
        if method != "POST":
            return
        ctype = headers.get("content-type", "").partition(";")[0].strip().lower()
        if ctype != "application/json":
            raise _rpc_error(
                415, INVALID_REQUEST, "Unsupported Media Type", "send application/json"
            )
        accept = headers.get("accept", "*/*").lower()
        if not ("text/event-stream" in accept or "*/*" in accept or "application/json" in accept):
            raise _rpc_error(
                406,
                INVALID_REQUEST,
                "Not Acceptable",
                "accept application/json or text/event-stream",
            )

    async def _route(
        self,
        stream: trio.SocketStream,
        conn: h11.Connection,
        request: h11.Request,
        headers: dict[str, str],
        body: bytes,
        peer_loopback: bool,
    ) -> _Reply | None:
        method = request.method.decode()
        if method == "POST":
            return await self._post(stream, conn, headers, body, peer_loopback)
        if method == "GET":
            return await self._get(stream, conn, headers)
        hs = self._session_of(headers, required=True)  # DELETE
        assert hs is not None
        hs.session.close("the client ended the session")
        return _Reply(200)

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
        accept = headers.get("accept", "*/*").lower()  # one of them (_check_head)
        sse = "text/event-stream" in accept or "*/*" in accept
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
        out = Stream(hs.outbox, kind="post", json=not sse, resumable=not hs.ephemeral)
        out.modern = hs.ephemeral and len(requests) == 1
        if hs.ephemeral:
            # The request's own session: its tools/call checks the Mcp-Param-* headers.
            hs.session.request_headers = headers
        hs.outbox.open(out, requests)
        hs.touch()
        hs.session.handle_line(body)
        prime = primes(version)
        try:
            await self._send_stream(hs, stream, conn, out, extra, prime=prime)
        finally:
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
        box = hs.outbox
        decision = decide_resume(
            headers.get("last-event-id"), frozenset(box.resumable), box.last_get
        )
        if decision.kind is ResumeKind.REFUSE:
            raise _rpc_error(400, INVALID_REQUEST, "Bad Request", decision.reason)
        replay: list[bytes] = []
        if decision.kind is ResumeKind.RESUME:
            out = box.resumable[decision.stream]
            replay = out.after(decision.after)
        elif box.get_stream is not None and box.get_stream.owner is None:
            out = box.get_stream  # its client went away: this GET goes on with what waits
        elif box.get_stream is not None:
            raise _rpc_error(409, INVALID_REQUEST, "Conflict", "this session's GET stream is open")
        else:
            out = Stream(box, kind="get", resumable=not hs.ephemeral)
            box.open_get(out)
        if out.owner is not None:
            # A client resuming a stream whose old connection we have not seen end yet (a
            # network cut): the old connection lets go of it, and this one takes it.
            out.owner.cancel()
            with trio.move_on_after(CLOSE_BOUND):
                await out.released.wait()
            if out.owner is not None:
                raise _rpc_error(409, INVALID_REQUEST, "Conflict", "the stream is still in use")
        hs.touch()
        try:
            await self._send_stream(
                hs,
                stream,
                conn,
                out,
                [],
                prime=primes(headers.get("mcp-protocol-version"))
                and decision.kind is not ResumeKind.RESUME,
                replay=replay,
            )
        finally:
            hs.touch()
        return None

    async def _send_stream(
        self,
        hs: _HttpSession,
        stream: trio.SocketStream,
        conn: h11.Connection,
        out: Stream,
        extra: list[tuple[str, str]],
        *,
        prime: bool = False,
        replay: Sequence[bytes] = (),
    ) -> None:
        """`_stream`, then what becomes of `out`: closed once sent whole, kept for a resumption
        when its client went away (and it can be resumed), left to the connection that took it
        over."""
        outcome = _Outcome.GONE
        try:
            outcome = await self._stream(stream, conn, out, extra, prime=prime, replay=replay)
        finally:
            if outcome is _Outcome.TAKEN:
                pass  # another connection sends it now
            elif outcome is _Outcome.GONE and out.resumable and not out.closed and hs.spawn:
                try:
                    hs.spawn(self._expire_detached, hs, out)
                    out.detach()
                except RuntimeError:
                    # The session's nursery closed as this connection ended: trio closes it
                    # when its last task ends and only reschedules its owner, so this task can
                    # run before the owner's `hs.spawn = None`. Its session is over, and so is
                    # the stream.
                    out.close()
            else:
                out.close()
        if outcome is not _Outcome.ENDED:
            raise trio.BrokenResourceError("the client closed the stream, or sent too much")

    async def _expire_detached(self, hs: _HttpSession, out: Stream) -> None:
        """A detached stream not resumed within RESUME_WINDOW is dropped (by the task of its
        latest detachment: one resumed and detached again has a window of its own)."""
        reattached = out.reattached
        with trio.move_on_after(RESUME_WINDOW):
            await reattached.wait()
        if out.reattached is reattached and out.owner is None and not out.closed:
            out.close()
            hs.touch()

    async def _stream(
        self,
        stream: trio.SocketStream,
        conn: h11.Connection,
        out: Stream,
        extra: list[tuple[str, str]],
        *,
        prime: bool = False,
        replay: Sequence[bytes] = (),
    ) -> _Outcome:
        """Write `out` as the response body until it ends, the client goes away, or another
        connection takes it over (a resumption)."""
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
                return _Outcome.ENDED
        if out.json:
            chunks = [*([first] if first is not None else []), *[c async for c in out.receive]]
            for chunk in chunks:
                out.sent(chunk)
            await self._send_plain(
                stream,
                conn,
                _Reply(200, b"".join(chunks), [("content-type", "application/json"), *extra]),
            )
            return _Outcome.ENDED
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
        with trio.CancelScope() as owned:
            out.attach(owned)
            try:
                async with trio.open_nursery() as nursery:

                    async def watch() -> None:
                        # The client may close the connection at any time; h11 keeps what it
                        # pipelines (a next request's head, at most: more ends the connection,
                        # unread).
                        nonlocal gone
                        pipelined = 0
                        while True:
                            try:
                                data = await stream.receive_some(READ_CHUNK)
                            except (trio.BrokenResourceError, trio.ClosedResourceError):
                                data = b""
                            pipelined += len(data)
                            if not data or pipelined > MAX_HEADER_BYTES:
                                gone = True
                                nursery.cancel_scope.cancel()
                                return
                            conn.receive_data(data)

                    nursery.start_soon(watch)
                    try:
                        if prime:
                            primer = priming_event(out.number, out.last_taken)
                            await self._send(stream, conn, h11.Data(data=primer))
                        for chunk in replay:
                            await self._send(stream, conn, h11.Data(data=chunk))
                        if first is not None:
                            out.taken(first)
                            await self._send(stream, conn, h11.Data(data=first))
                            out.sent(first)
                        async for chunk in out.receive:
                            out.taken(chunk)
                            await self._send(stream, conn, h11.Data(data=chunk))
                            out.sent(chunk)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        # The client went away (a reset) while we wrote: as when it closes.
                        gone = True
                    nursery.cancel_scope.cancel()
            finally:
                out.detach()
        if owned.cancelled_caught:
            return _Outcome.TAKEN
        if gone:
            return _Outcome.GONE
        await self._send(stream, conn, h11.EndOfMessage())
        return _Outcome.ENDED

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
        opts = self.options()
        self._make_room(opts.http_max_sessions)
        outbox = SessionOutbox(opts.session_buffer_bytes)
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

    def _make_room(self, most: int) -> None:
        """Room for one more session within httpMaxSessions: the oldest idle sessions (no
        stream open) end; when none is idle, the new one is refused (503)."""
        live = [hs for hs in self.sessions.values() if not hs.session.closed]
        over = len(live) + 1 - most
        if over <= 0:
            return
        idle = sorted((hs for hs in live if not hs.busy), key=lambda hs: hs.last_used)
        if len(idle) < over:
            raise limit_reply(
                503,
                "Too many sessions",
                f"{len(live)} HTTP sessions are open and {len(live) - len(idle)} of them are "
                "busy (a stream open): none can be ended for a new one",
                "httpMaxSessions",
                most,
                close=False,
            )
        for hs in idle[:over]:
            reason = (
                f"evicted: the oldest idle of more than {most} HTTP sessions "
                "(daemon.httpMaxSessions)"
            )
            self.host.log("info", f"HTTP session {hs.id} {reason}", session=hs.session.id)
            hs.session.close(reason)

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
                hs.spawn = nursery.start_soon
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
            # Its nursery is closed: a stream whose client goes away after this is closed, not
            # left to an expiry task that can no longer start (the error it was).
            hs.spawn = None
            self.sessions.pop(hs.id, None)
            hs.outbox.close()
            # The session's writer calls back into this record of it (a reference cycle that
            # kept the ended session alive until a full collection); nothing to touch any more.
            hs.outbox.on_idle = _nothing
            self.host.close_session(hs.state, reason)
            hs.ended.set()
            self._freed.set()  # its memory goes back to the system (_trim_heap)


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
