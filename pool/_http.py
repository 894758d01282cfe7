"""HTTP upstream connections: streamable HTTP (`httpUrl`, `"type": "http"`) and HTTP+SSE (`url`).

Theory of operation: `HttpUpstream` is an `Upstream` (the transport-neutral connection of
`_upstream`) whose wire is HTTP. The JSON-RPC half comes from the base class unchanged: ids
minted per connection and never reused (P2), the pending map and `call`, `_dispatch` (ping and
roots/list answered here, notifications and server-to-client requests to the entry's event
sink), era detection and the handshake. This module supplies the transport: `_write` queues an
encoded message for the sender task, and `run` is the single owner of the HTTP client, which
it opens, uses and closes (STYLE: one owner task).

Streamable HTTP: every message is one POST. A request's POST answers with JSON or with an SSE
stream that carries the response and whatever the server sends in relation to it; messages from
that stream are dispatched with the stream's request id as the *related* request, so a sampling
or elicitation request reaches the session that made the call (`related_handle`, P5). After the
handshake a GET stream carries the server's unrelated messages (list_changed, resources/updated).
HTTP+SSE (2024-11-05): one GET stream carries every server message; its first event names the
URL messages are POSTed to.

Failure (L3): a connection error, the end of the SSE transport's stream, or a server that no
longer knows our session (HTTP 404; or 400 naming the session, as server-everything's example
server answers) closes the connection with that reason. In-flight requests fail at once and
`run` returns, so the pool's supervisor reconnects with backoff: a fresh handshake and a fresh
listing, never a stale session that reports success.

The HTTP client (httpx2, which the `mcp` SDK is built on) is imported only when an HTTP upstream
starts: a daemon with only stdio servers never loads it. We speak the transport ourselves rather
than through the SDK's transports because they do not say which stream a message arrived on,
turn a 404 into an ordinary error reply, and would round-trip every message through pydantic.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

import msgspec
import trio
from msgspec import UNSET, Raw, UnsetType

from mcpool.protocol import (
    META_PROTOCOL_VERSION,
    MODERN_VERSION,
    CannotStart,
    McpoolError,
    Message,
    UpstreamUnavailable,
)
from mcpool.protocol._headers import header_params, param_headers, standard_headers

from . import _eras, _oauth
from ._oauth import NeedsLogin, OAuthError
from ._spec import TransportIdentity, printable, redact_url
from ._upstream import UPSTREAM_WRITE_BUFFER, Upstream, UpstreamEvents

if TYPE_CHECKING:
    import httpx2

# Closing: the DELETE that ends our session on the server is a courtesy; never wait long for it.
CLOSE_GRACE = 2.0
# How long a new connection waits for its GET stream's answer before it is served anyway.
GET_OPEN_WAIT = 2.0
# A server that ends the GET stream without a `retry` field: reconnect after this (as the SDKs).
GET_RETRY = 1.0
# A broken response stream is resumed (GET with Last-Event-ID) at most this many times in a row,
# waiting RESUME_RETRY, then twice that... between tries; then the connection counts as lost.
RESUME_ATTEMPTS = 3
RESUME_RETRY = 0.2
# A server's `retry` (milliseconds) is obeyed up to this: a huge one must not park a request's
# task long after the request's own time limit answered it.
MAX_RETRY = 30.0
# An error body is only quoted in the error a request gets; more than this is not worth reading.
MAX_ERROR_BODY = 64 * 1024
MAX_CHALLENGE = 1024  # of a WWW-Authenticate header quoted in an error; the rest is noise
KEEPALIVE_CONNECTIONS = 8  # idle connections kept to one server; open streams are not limited
NOTES = "[mcpool]"  # prefix of the transport events kept in stderr_tail (`daemonctl logs NAME`)

_MIME_JSON = "application/json"
_MIME_SSE = "text/event-stream"


class _Head(msgspec.Struct):
    """Just enough of an outgoing message to know whether it is a request, and its id."""

    id: int | str | UnsetType | None = UNSET
    method: str | UnsetType = UNSET


_head_decoder = msgspec.json.Decoder(_Head)
_any_decoder = msgspec.json.Decoder()


def _httpx() -> Any:
    """The HTTP client module, imported on first use (the memory target: see the module doc)."""
    try:
        import httpx2
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise CannotStart(
            "http",
            "httpx2, a dependency of mcpool, is missing: reinstall mcpool",
        ) from exc
    return httpx2


class HttpUpstream(Upstream):
    """One connection to a remote MCP server."""

    wire = "an HTTP response"

    # Tests put a fake server here (an `httpx2.MockTransport` factory), as httpcore takes a
    # `network_backend=`; None is the real network.
    transport_factory: Callable[[], Any] | None = None

    def __init__(
        self,
        identity: TransportIdentity,
        events: UpstreamEvents,
        *,
        guardian: Any = None,  # the pool passes one; a remote server has no process group
        **options: Any,
    ) -> None:
        super().__init__(identity, events, **options)
        if not identity.url:
            raise UpstreamUnavailable(identity.name, f"server '{identity.name}' has no url")
        self.url: str = identity.url
        self.session_id: str | None = None
        self._open = False
        self._outbox: collections.deque[bytes] = collections.deque()
        self._outbox_bytes = 0
        self._outbox_wake = trio.Event()
        self._post_scopes: dict[int, trio.CancelScope] = {}
        # Modern era: the POST of each open subscriptions/listen stream (its id is a string).
        self._listen_scopes: dict[str, trio.CancelScope] = {}
        self._related: int | None = None
        self._endpoint: str | None = None  # HTTP+SSE: where messages are POSTed
        self.needs_login: NeedsLogin | None = None  # the server wants `daemonctl login`
        self.oauth_error: OAuthError | None = None  # a step of the OAuth flow failed
        # Modern era: each listed tool's `x-mcp-header` arguments, mirrored as Mcp-Param-*.
        self._param_annotations: dict[str, dict[tuple[str, ...], str]] = {}

    # -- the transport (what Upstream asks of it) -------------------------------------------

    @property
    def alive(self) -> bool:
        return self._open and not self._close_requested.is_set()

    @property
    def related_handle(self) -> Any:
        """The handle whose request's stream carried the message being dispatched, if any.

        Read by the pool while it routes a server-to-client request (P5): the stream it came on
        names the request, the request names the session.
        """
        if self._related is None:
            return None
        return getattr(self._pending.get(self._related), "handle", None)

    @property
    def related_request(self) -> Any:
        """The reply callback of that request (a session's call in flight), if any: the session
        finds which of its calls a server-to-client request belongs to (issue 18)."""
        return None if self._related is None else self._pending.get(self._related)

    def forget(self, uid: int) -> bool:
        # A cancelled request's POST stream is closed too: nothing on it is wanted any more
        # (and for a modern server, closing the stream is the cancellation).
        scope = self._post_scopes.pop(uid, None)
        if scope is not None:
            scope.cancel()
        return super().forget(uid)

    def _open_listen(self, wanted: dict[str, Any]) -> None:
        # Over HTTP the stream is the listen's POST: a replaced one is closed, which for a
        # modern server is its cancellation (the base class also sends notifications/cancelled).
        old = self._listen_id
        super()._open_listen(wanted)
        if old is not None and old != self._listen_id:
            scope = self._listen_scopes.pop(old, None)
            if scope is not None:
                scope.cancel()

    def _write(self, data: bytes) -> None:
        if not self.alive:
            return
        self._outbox.append(data)
        self._outbox_bytes += len(data)
        if self._outbox_bytes > UPSTREAM_WRITE_BUFFER:
            self._drop(f"has more than {UPSTREAM_WRITE_BUFFER} bytes waiting to be sent")
            return
        self._outbox_wake.set()

    def screen_tools(self, tools: Sequence[Any], *, first_page: bool) -> list[Any]:
        """2026-07-28 on HTTP: a tool whose `x-mcp-header` annotations break the spec's rules
        is left out of the list (with a note naming it and why); the others' annotations are
        kept for the Mcp-Param-* headers of their calls."""
        if first_page:
            self._param_annotations = {}
        kept: list[Any] = []
        for tool in tools:
            name = tool.get("name") if isinstance(tool, dict) else None
            if not isinstance(name, str):
                kept.append(tool)  # not a tool mcpool can list: the registry reports it
                continue
            found = header_params(tool.get("inputSchema"))
            if isinstance(found, str):
                self._note(f"tool {name!r} left out: {found}")
                continue
            if found:
                self._param_annotations[name] = found
            kept.append(tool)
        return kept

    def _request_headers(self, method: str, body: bytes) -> dict[str, str]:
        """2026-07-28 request metadata (streamable-http): the version the body's `_meta`
        declares, Mcp-Method, Mcp-Name and a tool call's Mcp-Param-* headers."""
        try:
            message = _any_decoder.decode(body)
        except msgspec.DecodeError:
            return {}
        params = message.get("params") if isinstance(message, dict) else None
        headers = standard_headers(method, params)
        if not isinstance(params, dict):
            return headers
        meta = params.get("_meta")
        version = meta.get(META_PROTOCOL_VERSION) if isinstance(meta, dict) else None
        if isinstance(version, str):
            headers["mcp-protocol-version"] = version
        name = params.get("name")
        annotations = (
            self._param_annotations.get(name)
            if method == "tools/call" and isinstance(name, str)
            else None
        )
        if annotations:
            headers.update(param_headers(annotations, params.get("arguments")))
        return headers

    def _details(self) -> dict[str, Any]:
        return {"url": redact_url(self.url), "transport": self.identity.kind, "log": self._tail()}

    # -- the owner task -----------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[Upstream] = trio.TASK_STATUS_IGNORED
    ) -> None:
        httpx2 = _httpx()
        self.started_at = trio.current_time()
        client = httpx2.AsyncClient(
            headers=dict(self.identity.headers),
            # Connecting and writing are bounded; reading is not: a response stream may stay
            # open as long as a tool runs, and the caller's own timeout covers a silent server.
            timeout=httpx2.Timeout(self._handshake_timeout, read=None, pool=None),
            limits=httpx2.Limits(
                max_connections=None, max_keepalive_connections=KEEPALIVE_CONNECTIONS
            ),
            follow_redirects=False,
            transport=self.transport_factory() if self.transport_factory is not None else None,
            auth=_oauth.auth_for(self.identity),  # None unless the daemon does OAuth (issue 16)
        )
        self._open = True
        try:
            async with client:
                try:
                    async with trio.open_nursery() as nursery:
                        if self.identity.kind == "sse":
                            await nursery.start(self._sse_stream, client)
                        nursery.start_soon(self._sender, client, nursery)
                        nursery.start_soon(self._expire_requests)
                        try:
                            await self._handshake()
                        except BaseException:
                            self.request_close("handshake failed")
                            raise
                        if self.era == _eras.MODERN:
                            nursery.start_soon(self._keep_listening)
                        elif self.identity.kind == "http" and self.session_id is not None:
                            # Open (its response's head in) before the connection is served, so
                            # what the server sends its GET stream from the start is not missed
                            # and the stream is not taken for a reconnection; bounded.
                            opened = trio.Event()
                            nursery.start_soon(self._get_stream, client, opened)
                            with trio.move_on_after(GET_OPEN_WAIT):
                                await opened.wait()
                        task_status.started(self)
                        await self._close_requested.wait()
                        nursery.cancel_scope.cancel()
                finally:
                    self._open = False
                    with trio.move_on_after(CLOSE_GRACE, shield=True):
                        await self._end_session(client)
                        await client.aclose()
        finally:
            self._open = False
            self._has_exited = True
            self._exited.set()
            self._fail_pending()

    async def _end_session(self, client: httpx2.AsyncClient) -> None:
        """Streamable HTTP: tell the server our session is over (it may refuse: 405)."""
        if self.identity.kind != "http" or self.session_id is None:
            return
        with contextlib.suppress(Exception):  # a courtesy to a server that may be gone
            await client.delete(self.url, headers=self._headers())

    # -- sending ------------------------------------------------------------------------------

    async def _sender(self, client: httpx2.AsyncClient, nursery: trio.Nursery) -> None:
        """POST queued messages in order: a request's POST runs in a task of its own (its
        answer may be a long stream); notifications and responses are POSTed one at a time, so
        `notifications/initialized` reaches the server before any request that follows it."""
        while True:
            while not self._outbox:
                await self._outbox_wake.wait()
                self._outbox_wake = trio.Event()
            data = self._outbox.popleft()
            self._outbox_bytes -= len(data)
            body = data.rstrip(b"\n")
            try:
                head = _head_decoder.decode(body)
            except msgspec.DecodeError:
                head = _Head()
            if isinstance(head.method, str) and isinstance(head.id, int | str):
                scope = trio.CancelScope()
                if isinstance(head.id, int):
                    self._post_scopes[head.id] = scope
                elif head.id in self._listens:
                    self._listen_scopes[head.id] = scope
                nursery.start_soon(self._post, client, body, head, scope)
            else:
                await self._post(client, body, head, trio.CancelScope())

    def _headers(self, method: str | UnsetType = UNSET) -> dict[str, str]:
        headers = {"accept": f"{_MIME_JSON}, {_MIME_SSE}"}
        if self.identity.kind == "http":
            if self.session_id is not None:
                headers["mcp-session-id"] = self.session_id
            version = MODERN_VERSION if method == "server/discover" else self.protocol_version
            if version:
                headers["mcp-protocol-version"] = version
        return headers

    async def _post(
        self, client: httpx2.AsyncClient, body: bytes, head: _Head, scope: trio.CancelScope
    ) -> None:
        uid = head.id if isinstance(head.method, str) and isinstance(head.id, int) else None
        # A listen stream's frames are consumed by `_listen_frame`; it has no pending callback.
        listen = head.id if isinstance(head.id, str) and head.id in self._listens else None
        url = self._endpoint or self.url
        headers = {**self._headers(head.method), "content-type": _MIME_JSON}
        if (
            # Every request, whatever its id: the listen stream's id is a string.
            isinstance(head.method, str)
            and isinstance(head.id, int | str)
            and self.identity.kind == "http"
            and (self.era == _eras.MODERN or head.method == "server/discover")
        ):
            headers.update(self._request_headers(head.method, body))
        sent_session = headers.get("mcp-session-id")
        last: dict[str, Any] = {}  # the response stream's last event id, as it is read
        ended = False  # the server ended the response normally (not broken, not cancelled)
        try:
            with scope:
                async with client.stream("POST", url, content=body, headers=headers) as resp:
                    await self._answer(resp, uid, sent_session, last, request=listen is not None)
                ended = True
        except NeedsLogin as exc:
            self._login_needed(uid, exc)
        except OAuthError as exc:
            self._oauth_failed(uid, exc)
        except Exception as exc:  # any failure of the connection or stream ends it
            if listen is not None:
                pass  # a broken listen stream is reopened like one the server ended (below)
            elif uid is None or not await self._resume(client, uid, last):
                self._drop(f"lost its connection to {redact_url(url)} ({self._why(exc)})")
        finally:
            if uid is not None and self._post_scopes.get(uid) is scope:
                del self._post_scopes[uid]
            if listen is not None and self._listen_scopes.get(listen) is scope:
                del self._listen_scopes[listen]
        if listen is not None and listen in self._listens and not scope.cancelled_caught:
            # The stream ended (or broke) without its result: the server ended the listen.
            self._listens.discard(listen)
            if listen == self._listen_id:
                self._listen_ended_by_server(listen)
        if ended and uid is not None and uid in self._pending and "id" in last:
            # SEP-1699 polling: the server numbered the stream (a priming event) and ended it
            # on purpose; the answer comes on a GET resumed from the last event, after `retry`.
            await self._resume(client, uid, last, wait=retry_seconds(last))
        if (
            uid is not None
            and uid in self._pending
            and self.identity.kind == "http"
            and not scope.cancelled_caught
        ):
            self._fail_one(uid, "ended the response stream without answering")

    async def _resume(
        self, client: httpx2.AsyncClient, uid: int, last: dict[str, Any], *, wait: float = 0.0
    ) -> bool:
        """A request's response stream ended before its answer: when the server numbered the
        stream's events (it supports resuming), GET it again from the last one we saw
        (Last-Event-ID) and read on, after `wait` seconds. A stream that breaks is resumed at
        most RESUME_ATTEMPTS times in a row; one the server ends on purpose (polling) is
        resumed again after its `retry`, as long as the request is pending (its time limit
        bounds that). True when the request is settled (answered, or cancelled meanwhile);
        False when the stream cannot be resumed."""
        failures = 0
        while failures < RESUME_ATTEMPTS:
            if uid not in self._pending:
                return True
            if self.identity.kind != "http" or "id" not in last or not self.alive:
                return False
            scope = self._post_scopes[uid] = trio.CancelScope()  # forget() cancels it
            try:
                with scope:
                    if wait > 0:
                        await trio.sleep(wait)
                    self._note(
                        f"resuming the response stream of request {uid} after event {last['id']}"
                    )
                    headers = {
                        **self._headers(),
                        "accept": _MIME_SSE,
                        "last-event-id": str(last["id"]),
                    }
                    async with client.stream("GET", self.url, headers=headers) as resp:
                        ctype = resp.headers.get("content-type", "").partition(";")[0].strip()
                        if resp.status_code != 200 or ctype.lower() != _MIME_SSE:
                            return False
                        await self._read_events(resp, related=uid, last=last, until_answered=True)
                wait = retry_seconds(last)  # ended on purpose: poll again after its retry
            except Exception:  # a resumed stream can break too: resume again from its last id
                failures += 1
                wait = RESUME_RETRY * failures
            finally:
                if self._post_scopes.get(uid) is scope:
                    del self._post_scopes[uid]
            if scope.cancelled_caught:
                return True
        return uid not in self._pending

    async def _answer(
        self,
        resp: httpx2.Response,
        uid: int | None,
        sent_session: str | None,
        last: dict[str, Any],
        *,
        request: bool = False,
    ) -> None:
        """Read a POST's response. `uid`: the pending request it answers; `request`: a request
        with no pending callback whose response stream must still be read (a listen stream)."""
        if self.session_id is None and self.identity.kind == "http":
            sid = resp.headers.get("mcp-session-id")
            if sid:
                self.session_id = sid
        status = resp.status_code
        if status >= 400:
            raw = await _read_capped(resp, MAX_ERROR_BODY)
            if sent_session is not None and (
                status == 404 or (status == 400 and b"session" in raw.lower())
            ):
                self._drop(
                    f"no longer knows our session (HTTP {status}): reconnecting with a new one"
                )
                return
            if status == 401:
                # Not authorized (today no OAuth flow runs here): say so, with the challenge.
                self._note(f"refused: {status_text(resp)}")
                self._fail_one(uid, f"answered {self.identity.redact(status_text(resp))}")
            elif uid is not None:
                self._fail_from_body(uid, status, raw)
            return
        if (uid is None and not request) or status == 202:
            # HTTP+SSE answers every POST with 202: the response comes on the GET stream.
            if uid is not None and self.identity.kind == "http":
                self._fail_one(uid, "answered a request with 202 Accepted and no response")
            return
        ctype = resp.headers.get("content-type", "").partition(";")[0].strip().lower()
        if ctype == _MIME_SSE:
            await self._read_events(resp, related=uid, last=last)
        elif ctype == _MIME_JSON:
            self._dispatch_body(await _read_capped(resp, self._max_line), uid)
        else:
            self._fail_one(uid, f"answered with content type {ctype or 'none'}")

    async def _read_events(
        self,
        resp: httpx2.Response,
        *,
        related: int | None,
        last: dict[str, Any] | None = None,
        until_answered: bool = False,
    ) -> dict[str, Any]:
        """Dispatch a response stream's messages; returns its last event id and retry (kept
        in `last` as they arrive, so they survive a stream that breaks). `until_answered`: stop
        reading once the `related` request is answered (a resumed GET stream may stay open)."""
        last = {} if last is None else last
        source = _httpx().EventSource(resp, max_event_size=self._max_line)
        async for sse in source:
            if sse.id:
                last["id"] = sse.id
            if sse.retry is not None:
                last["retry"] = sse.retry
            if sse.event in ("message", "") and sse.data:
                self._dispatch_related(sse.data.encode(), related)
                if until_answered and related not in self._pending:
                    break
        return last

    def _dispatch_body(self, data: bytes, related: int | None) -> None:
        """An `application/json` response body: one message (or batch), pretty-printed or not;
        or several, one a line, each dispatched (the answer among them settles the request, the
        others go where a stream's messages go). A body that is neither fails the request with
        what the server sent, rather than leaving it to time out."""
        try:
            _any_decoder.decode(data)
        except msgspec.DecodeError:
            lines = [line for line in data.splitlines() if line.strip()]
            if len(lines) < 2 or not all(_is_json(line) for line in lines):
                self._note(f"sent a JSON body that is not JSON-RPC: {data[:200]!r}")
                self._fail_one(
                    related,
                    f"answered with an application/json body that is not a JSON-RPC message "
                    f"({len(data)} bytes, starting {data[:80]!r})",
                )
                return
            for line in lines:
                self._dispatch_related(line, related)
            return
        self._dispatch_related(data, related)

    def _dispatch_related(self, data: bytes, related: int | None) -> None:
        if b"\n" in data or b"\r" in data:
            # Pretty-printed JSON: sessions relay payloads verbatim on newline-framed streams.
            with contextlib.suppress(msgspec.DecodeError):  # else _dispatch reports it
                data = msgspec.json.encode(_any_decoder.decode(data))
        self._related = related
        try:
            self._dispatch(data)
        finally:
            self._related = None

    # -- server streams -----------------------------------------------------------------------

    async def _get_stream(self, client: httpx2.AsyncClient, opened: trio.Event) -> None:
        """Streamable HTTP: the GET stream for server messages unrelated to any request.
        `opened` is set once its first answer's head is in (or it will not open)."""
        try:
            await self._get_stream_loop(client, opened)
        finally:
            opened.set()

    async def _get_stream_loop(self, client: httpx2.AsyncClient, opened: trio.Event) -> None:
        last_id: str | None = None
        retry = GET_RETRY
        while self.alive:
            headers = {**self._headers(), "accept": _MIME_SSE}
            if last_id is not None:
                headers["last-event-id"] = last_id
            try:
                async with client.stream("GET", self.url, headers=headers) as resp:
                    opened.set()
                    status = resp.status_code
                    if status == 405:
                        return  # the server offers no GET stream: only POST streams
                    if status >= 400:
                        raw = await _read_capped(resp, MAX_ERROR_BODY)
                        if status == 404 or (status == 400 and b"session" in raw.lower()):
                            self._drop(
                                f"no longer knows our session (HTTP {status}): "
                                "reconnecting with a new one"
                            )
                        else:
                            self._note(f"GET stream refused: HTTP {status}")
                        return
                    last = await self._read_events(resp, related=None)
            except NeedsLogin as exc:
                self._login_needed(None, exc)
                return
            except OAuthError as exc:
                self._oauth_failed(None, exc)
                return
            except Exception as exc:  # any failure of the connection or stream ends it
                self._drop(f"lost its connection to {redact_url(self.url)} ({self._why(exc)})")
                return
            last_id = last.get("id", last_id)
            if isinstance(last.get("retry"), int):
                retry = last["retry"] / 1000.0
            self._note(f"the server ended the GET stream; reopening in {retry:g} s")
            await trio.sleep(retry)

    async def _sse_stream(
        self,
        client: httpx2.AsyncClient,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """HTTP+SSE: the one stream; started once it names the endpoint messages go to."""
        started = False
        try:
            async with client.stream("GET", self.url, headers={"accept": _MIME_SSE}) as resp:
                if resp.status_code != 200:
                    raise UpstreamUnavailable(
                        self.name,
                        f"server '{self.name}' answered the SSE request with "
                        f"{self.identity.redact(status_text(resp))}",
                        url=redact_url(self.url),
                    )
                async for sse in _httpx().EventSource(resp, max_event_size=self._max_line):
                    if sse.event == "endpoint":
                        endpoint = urljoin(self.url, sse.data.strip())
                        if _origin(endpoint) != _origin(self.url):
                            raise UpstreamUnavailable(
                                self.name,
                                f"server '{self.name}' named a message endpoint on another "
                                "origin; refused",
                                url=redact_url(self.url),
                            )
                        self._endpoint = endpoint
                        if not started:
                            started = True
                            task_status.started()
                    elif sse.event in ("message", "") and sse.data and started:
                        self._dispatch_related(sse.data.encode(), None)
            reason = "ended its SSE stream"
        except OAuthError as exc:
            self.oauth_error = exc  # what the entry says (not the group it ends up in)
            raise
        except McpoolError:
            raise
        except Exception as exc:  # any failure of the connection or stream ends it
            if not started:
                raise UpstreamUnavailable(
                    self.name,
                    f"server '{self.name}' could not be reached at {redact_url(self.url)}: "
                    f"{self._why(exc)}",
                    url=redact_url(self.url),
                ) from exc
            reason = f"lost its connection to {redact_url(self.url)} ({self._why(exc)})"
        if not started:
            raise UpstreamUnavailable(
                self.name,
                f"server '{self.name}' ended its SSE stream before naming its message endpoint",
                url=redact_url(self.url),
            )
        self._drop(reason)

    # -- failures -----------------------------------------------------------------------------

    def _drop(self, reason: str) -> None:
        """The connection is over: say why, fail what is in flight, and let `run` return."""
        if not self._close_requested.is_set():
            self._note(reason)
        self.request_close(reason)
        self._fail_pending()

    def _login_needed(self, uid: int | None, exc: NeedsLogin) -> None:
        """The server wants a login: the request fails saying so. A step-up (403
        insufficient_scope for one operation) leaves the connection up for the others."""
        self.needs_login = exc
        self._note(exc.reason)
        self._fail_with(uid, exc)
        if not exc.step_up:
            self._drop(exc.reason)

    def _oauth_failed(self, uid: int | None, exc: OAuthError) -> None:
        """A step of the OAuth flow failed (discovery, a refresh): the request fails with that
        error, which names the server and the step, and so does the connection."""
        self.oauth_error = exc
        self._note(exc.reason)
        self._fail_with(uid, exc)
        self._drop(exc.reason)

    def _fail_with(self, uid: int | None, exc: McpoolError) -> None:
        """The request `uid` (if still pending) is answered with our error."""
        cb = self._pending.pop(uid, None) if uid is not None else None
        if cb is not None:
            error = Raw(msgspec.json.encode(exc.to_error_object()))
            cb(Message(jsonrpc="2.0", id=uid, error=error))

    def _fail_one(self, uid: int | None, what: str) -> None:
        if uid is None:
            return
        cb = self._pending.pop(uid, None)
        if cb is None:
            return
        self._check_settled()
        err = UpstreamUnavailable(self.name, f"server '{self.name}' {what}", **self._details())
        cb(Message(jsonrpc="2.0", id=uid, error=Raw(msgspec.json.encode(err.to_error_object()))))

    def _fail_from_body(self, uid: int, status: int, raw: bytes) -> None:
        """A non-2xx answer to a request: its JSON-RPC error if the body is one, else ours."""
        try:
            body = _any_decoder.decode(raw)
        except msgspec.DecodeError:
            body = None
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and isinstance(error.get("code"), int):
            cb = self._pending.pop(uid, None)
            self._check_settled()
            if cb is not None:
                cb(Message(jsonrpc="2.0", id=uid, error=Raw(msgspec.json.encode(error))))
            return
        self._fail_one(uid, f"answered HTTP {status}")

    def _why(self, exc: BaseException) -> str:
        """An exception as text, without the identity's header values (h11 quotes them)."""
        return self.identity.redact(_describe(exc))

    def _note(self, text: str) -> None:
        # Transport errors may quote what was sent (h11 quotes a refused header value).
        self.stderr_tail.append(f"{NOTES} {self.identity.redact(text)}")

    def _tail(self) -> list[str]:
        return list(self.stderr_tail)[-5:]


def _is_json(data: bytes) -> bool:
    try:
        _any_decoder.decode(data)
    except msgspec.DecodeError:
        return False
    return True


def retry_seconds(last: dict[str, Any]) -> float:
    """How long to wait before resuming a stream: the server's last `retry`, else GET_RETRY."""
    retry = last.get("retry")
    if isinstance(retry, int) and retry >= 0:
        return min(retry / 1000.0, MAX_RETRY)
    return GET_RETRY


def status_text(resp: httpx2.Response) -> str:
    """An HTTP error status as a user needs it: a 401 names the server's challenge."""
    text = f"HTTP {resp.status_code}"
    if resp.status_code == 401:
        challenge = resp.headers.get("www-authenticate")
        text += " Unauthorized"
        if challenge:
            text += f" (WWW-Authenticate: {printable(challenge[:MAX_CHALLENGE])})"
    return text


async def _read_capped(resp: httpx2.Response, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            break
    return b"".join(chunks)


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


__all__ = ["HttpUpstream"]
