"""HTTP upstreams against a real socket: a small streamable HTTP server of the tests' own (trio,
HTTP/1.1 with `Connection: close`), driven through the real pool and `HttpUpstream`.

Issue 15: a log message on the response stream of one session's call reaches that session only
(point 2, and the stdio rule next to it); a stream the server ends on purpose after a priming
event is resumed by GET with Last-Event-ID after `retry` (point 3, SEP-1699); a 401 names the
status and the server's WWW-Authenticate challenge (point 12).
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import trio

from mcpool.pool import Handle, Pool, PoolEntry, PoolOptions, ServerSettings, identity_of
from mcpool.protocol import Message

WAIT = 10.0  # loopback only; this turns a hang into a failure
FAKE_UPSTREAM = Path(__file__).resolve().parents[2] / "tools" / "fake_upstream.py"
CHALLENGE = 'Bearer resource_metadata="http://127.0.0.1/.well-known/oauth-protected-resource"'


class WireServer:
    """A streamable HTTP MCP server: JSON for most requests; `tools/call` answers on an SSE
    stream that first carries a log message naming the call's `text` argument. `poll`: the call's
    stream sends only a priming event and ends; the answer comes on the GET that resumes it."""

    def __init__(self, *, unauthorized: bool = False, poll: bool = False) -> None:
        self.unauthorized = unauthorized
        self.poll = poll
        self.port = 0
        self.gets: list[dict[str, str]] = []
        self.parked: list[Any] = []  # poll: the ids of calls whose stream ended unanswered

    async def serve(self, nursery: trio.Nursery) -> None:
        serve = functools.partial(trio.serve_tcp, self._connection, 0, host="127.0.0.1")
        listeners = await nursery.start(serve)
        self.port = listeners[0].socket.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    async def _connection(self, stream: trio.SocketStream) -> None:
        async with stream:
            method, headers, body = await _read_request(stream)
            if self.unauthorized:
                await _send(stream, 401, b"", {"www-authenticate": CHALLENGE})
            elif method == "GET":
                await self._get(stream, headers)
            elif method == "DELETE":
                await _send(stream, 200, b"")
            else:
                await self._post(stream, json.loads(body))

    async def _post(self, stream: trio.SocketStream, msg: dict[str, Any]) -> None:
        rid, method = msg.get("id"), msg.get("method")
        if rid is None:
            await _send(stream, 202, b"")
        elif method == "initialize":
            result = {
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {}, "logging": {}},
                "serverInfo": {"name": "wire", "version": "1"},
            }
            await _send_json(stream, {"jsonrpc": "2.0", "id": rid, "result": result})
        elif method == "tools/list":
            tools = [{"name": "say", "inputSchema": {"type": "object"}}]
            await _send_json(stream, {"jsonrpc": "2.0", "id": rid, "result": {"tools": tools}})
        elif method == "tools/call":
            text = msg["params"]["arguments"]["text"]
            log = {"level": "info", "logger": "wire", "data": text}
            events = [_event({"jsonrpc": "2.0", "method": "notifications/message", "params": log})]
            if self.poll:
                self.parked.append(rid)
                events = [b"id: ev-1\nretry: 200\ndata: \n\n"]
            else:
                events.append(_event({"jsonrpc": "2.0", "id": rid, "result": _said(text)}))
            await _send_sse(stream, events)
        else:
            error = {"code": -32601, "message": "Method not found"}
            await _send_json(stream, {"jsonrpc": "2.0", "id": rid, "error": error})

    async def _get(self, stream: trio.SocketStream, headers: dict[str, str]) -> None:
        self.gets.append(headers)
        if "last-event-id" not in headers or not self.parked:
            await _send(stream, 405, b"")
            return
        rid = self.parked.pop(0)
        answer = {"jsonrpc": "2.0", "id": rid, "result": _said("resumed")}
        await _send_sse(stream, [b"id: ev-2\n" + _event(answer)])


def _said(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}]}


def _event(msg: Any) -> bytes:
    return b"event: message\ndata: " + json.dumps(msg).encode() + b"\n\n"


async def _read_request(stream: trio.SocketStream) -> tuple[str, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some()
        if not chunk:
            raise EOFError("the client closed before a whole request")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        body += await stream.receive_some()
    return lines[0].split(" ")[0], headers, body


async def _send(
    stream: trio.SocketStream, status: int, body: bytes, headers: dict[str, str] | None = None
) -> None:
    head = [f"HTTP/1.1 {status} X", f"content-length: {len(body)}", "connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    await stream.send_all(("\r\n".join(head) + "\r\n\r\n").encode() + body)


async def _send_json(stream: trio.SocketStream, msg: Any) -> None:
    await _send(stream, 200, json.dumps(msg).encode(), {"content-type": "application/json"})


async def _send_sse(stream: trio.SocketStream, events: list[bytes]) -> None:
    head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
    await stream.send_all(head.encode() + b"".join(events))


class Listener:
    def __init__(self) -> None:
        self.logs: list[Any] = []

    def snapshot_changed(self, entry: PoolEntry) -> None:
        pass

    def upstream_notification(self, entry: PoolEntry, method: str, params: Any) -> None:
        if method == "notifications/message":
            self.logs.append(msgspec.json.decode(params)["data"])

    def server_request(self, entry: PoolEntry, upstream: Any, msg: Message) -> str | None:
        return "not in this test"


class Flight:
    """What a session's forwarded request is to the pool: a reply callback naming its handle
    (the session side's `_InFlight`), counted on the handle while it is at the upstream."""

    def __init__(self, handle: Handle) -> None:
        self.handle = handle
        self.answer: Message | None = None
        self.done = trio.Event()
        handle.in_flight += 1

    def __call__(self, msg: Message) -> None:
        self.handle.in_flight -= 1
        self.answer = msg
        self.done.set()

    def text(self) -> str:
        assert self.answer is not None
        if self.answer.result is msgspec.UNSET:
            raise AssertionError(msgspec.json.decode(self.answer.error))
        return str(msgspec.json.decode(self.answer.result)["content"][0]["text"])


async def _call(handle: Handle, tool: str, arguments: dict[str, Any]) -> Flight:
    upstream = handle.entry.upstream
    assert upstream is not None
    flight = Flight(handle)
    params = msgspec.json.encode({"name": tool, "arguments": arguments})
    upstream.send_request("tools/call", params, flight)
    with trio.fail_after(WAIT):
        await flight.done.wait()
    return flight


async def _two_sessions(
    pool: Pool, name: str, settings: ServerSettings
) -> tuple[Handle, Listener, Handle, Listener]:
    ident = identity_of(name, settings)
    a, b = Listener(), Listener()
    with trio.fail_after(WAIT):
        ha = await pool.acquire(ident, settings, "a", a)
        hb = await pool.acquire(ident, settings, "b", b)
    assert ha.entry is hb.entry and ha.entry.upstream is not None, ha.entry.last_error
    return ha, a, hb, b


async def test_a_log_message_on_a_calls_response_stream_reaches_that_session_only(
    nursery: trio.Nursery,
) -> None:
    server = WireServer()
    await server.serve(nursery)
    pool = Pool(nursery, PoolOptions())
    settings = ServerSettings(type="http", url=server.url)
    ha, a, hb, b = await _two_sessions(pool, "wire", settings)
    assert (await _call(ha, "say", {"text": "for a"})).text() == "for a"
    assert (await _call(hb, "say", {"text": "for b"})).text() == "for b"
    assert a.logs == ["for a"]
    assert b.logs == ["for b"]
    await pool.aclose()


async def test_a_stdio_log_message_while_one_session_is_busy_reaches_that_session_only(
    nursery: trio.Nursery,
) -> None:
    pool = Pool(nursery, PoolOptions())
    settings = ServerSettings(command=sys.executable, args=[str(FAKE_UPSTREAM)])
    ha, a, _hb, b = await _two_sessions(pool, "fake", settings)
    arguments = {"level": "info", "message": "for a"}
    assert (await _call(ha, "log", arguments)).text() == "logged"
    assert a.logs == ["for a"]
    assert b.logs == []
    await pool.aclose()


async def test_a_response_stream_ended_after_a_priming_event_is_resumed_after_its_retry(
    nursery: trio.Nursery,
) -> None:
    server = WireServer(poll=True)
    await server.serve(nursery)
    pool = Pool(nursery, PoolOptions())
    settings = ServerSettings(type="http", url=server.url)
    ident = identity_of("poll", settings)
    with trio.fail_after(WAIT):
        handle = await pool.acquire(ident, settings, "a", Listener())
    assert (await _call(handle, "say", {"text": "x"})).text() == "resumed"
    assert [g.get("last-event-id") for g in server.gets] == ["ev-1"]
    await pool.aclose()


async def test_a_401_names_the_status_and_the_challenge(nursery: trio.Nursery) -> None:
    server = WireServer(unauthorized=True)
    await server.serve(nursery)
    pool = Pool(nursery, PoolOptions())
    settings = ServerSettings(type="http", url=server.url)
    ident = identity_of("locked", settings)
    with trio.fail_after(WAIT):
        handle = await pool.acquire(ident, settings, "a", Listener())
    error = handle.entry.last_error or ""
    assert "HTTP 401 Unauthorized" in error, error
    assert f"WWW-Authenticate: {CHALLENGE}" in error, error
    assert "Upstream server unavailable" not in error
    await pool.aclose()
