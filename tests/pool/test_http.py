"""HttpUpstream against an in-memory streamable HTTP server (httpx2.MockTransport): the
handshake and its session id, headers from the identity, a server that forgets the session
(404) leading to a fresh handshake and a fresh listing through the pool, a dropped connection
failing in-flight requests at once, a broken response stream resumed from its last event id
(or failing when it cannot be), and the factory choosing the class by transport."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest
import trio

from mcpool.pool import Pool, PoolEntry, PoolOptions, ServerSettings, StdioUpstream, identity_of
from mcpool.pool._http import HttpUpstream
from mcpool.pool._pool import default_upstream_factory
from mcpool.protocol import McpoolError

WAIT = 10.0  # everything here is in memory; this only turns a hang into a failure


class FakeHttpServer:
    """A streamable HTTP MCP server in memory: JSON answers, one live session at a time."""

    def __init__(self) -> None:
        self.generation = 1
        self.sessions: set[str] = set()
        self.requests: list[httpx2.Request] = []
        self.down = False

    def forget_sessions(self) -> None:
        """What a restarted server knows: nothing."""
        self.sessions.clear()
        self.generation += 1

    async def handle(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        if self.down:
            raise httpx2.ConnectError("connection refused", request=request)
        if request.method == "GET":
            return httpx2.Response(405)
        if request.method == "DELETE":
            return httpx2.Response(200)
        msg = json.loads(request.content)
        method, msg_id = msg.get("method"), msg.get("id")
        sid = request.headers.get("mcp-session-id")
        if method == "initialize":
            new = f"sess-{self.generation}-{len(self.sessions)}"
            self.sessions.add(new)
            result = {
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": "fake-http", "version": "1"},
            }
            return _json(
                {"jsonrpc": "2.0", "id": msg_id, "result": result}, {"mcp-session-id": new}
            )
        if sid is None:
            err = {"code": -32000, "message": "Bad Request: no session"}
            return httpx2.Response(400, json={"jsonrpc": "2.0", "id": msg_id, "error": err})
        if sid not in self.sessions:
            return httpx2.Response(404)
        if msg_id is None:
            return httpx2.Response(202)
        if method == "tools/list":
            tools = [{"name": f"tool_g{self.generation}", "inputSchema": {"type": "object"}}]
            return _json({"jsonrpc": "2.0", "id": msg_id, "result": {"tools": tools}})
        if method == "tools/call":
            text = request.headers.get("x-token", "none")
            result = {"content": [{"type": "text", "text": text}]}
            return _json({"jsonrpc": "2.0", "id": msg_id, "result": result})
        err = {"code": -32601, "message": "Method not found"}
        return _json({"jsonrpc": "2.0", "id": msg_id, "error": err})


def _json(body: Any, headers: dict[str, str] | None = None) -> httpx2.Response:
    return httpx2.Response(200, json=body, headers=headers)


class Events:
    def __init__(self) -> None:
        self.notifications: list[str] = []

    def on_notification(self, method: str, params: Any) -> None:
        self.notifications.append(method)

    def on_server_request(self, upstream: Any, msg: Any) -> None:
        pass


def upstream_class(server: FakeHttpServer) -> type[HttpUpstream]:
    class Mocked(HttpUpstream):
        transport_factory = staticmethod(lambda: httpx2.MockTransport(server.handle))

    return Mocked


def settings(**extra: Any) -> ServerSettings:
    return ServerSettings(type="http", url="http://127.0.0.1:1/mcp", **extra)


async def test_handshake_keeps_the_session_id_and_sends_the_identitys_headers(
    nursery: trio.Nursery,
) -> None:
    server = FakeHttpServer()
    ident = identity_of("web", settings(headers={"X-Token": "secret"}))
    up = upstream_class(server)(ident, Events(), max_line=1 << 20, handshake_timeout=WAIT)
    with trio.fail_after(WAIT):
        await nursery.start(up.run)
        result = await up.call("tools/call", {"name": "x"}, timeout=WAIT)
    assert result == {"content": [{"type": "text", "text": "secret"}]}
    assert up.session_id == "sess-1-0"
    assert up.protocol_version == "2025-06-18"
    posted = [r for r in server.requests if r.method == "POST"]
    # The era probe carries no session; everything after the handshake carries ours.
    assert posted[-1].headers["mcp-session-id"] == "sess-1-0"
    assert posted[-1].headers["mcp-protocol-version"] == "2025-06-18"
    up.request_close("drained")


async def test_a_forgotten_session_gets_a_fresh_handshake_and_listing(
    nursery: trio.Nursery,
) -> None:
    server = FakeHttpServer()
    pool = Pool(
        nursery,
        PoolOptions(backoff_initial=0.01, backoff_max=0.05),
        upstream_factory=upstream_class(server),
    )
    ident = identity_of("web", settings())
    listener = Listener()
    with trio.fail_after(WAIT):
        handle = await pool.acquire(ident, settings(), "s1", listener)
    entry = handle.entry
    first = entry.upstream
    assert first is not None
    assert [t["name"] for t in entry.snapshot.tools] == ["tool_g1"]
    server.forget_sessions()
    with pytest.raises(McpoolError) as failed, trio.fail_after(WAIT):
        await first.call("tools/call", {"name": "x"}, timeout=WAIT)
    # The in-flight request fails at once, saying why (its error's data.reason).
    assert "no longer knows our session (HTTP 404)" in str(failed.value.data)
    with trio.fail_after(WAIT):
        while not (
            entry.upstream is not None
            and entry.upstream is not first
            and entry.state.value == "active"
        ):
            await entry.state_changed.wait()
    assert isinstance(entry.upstream, HttpUpstream)
    assert entry.upstream.session_id == "sess-2-0"
    assert [t["name"] for t in entry.snapshot.tools] == ["tool_g2"]
    assert entry.restarts == 1
    assert "HTTP 404" in (first.closed_reason or "")
    pool.release(handle)
    await pool.aclose()


async def test_a_dropped_connection_fails_in_flight_requests_and_ends_run(
    nursery: trio.Nursery,
) -> None:
    server = FakeHttpServer()
    ident = identity_of("web", settings())
    up = upstream_class(server)(ident, Events(), max_line=1 << 20, handshake_timeout=WAIT)
    ended = trio.Event()

    async def run(task_status: trio.TaskStatus[None]) -> None:
        await up.run(task_status=task_status)
        ended.set()

    with trio.fail_after(WAIT):
        await nursery.start(run)
    server.down = True
    with pytest.raises(McpoolError) as failed, trio.fail_after(WAIT):
        await up.call("tools/call", {"name": "x"}, timeout=WAIT)
    assert "lost its connection" in str(failed.value.data)
    with trio.fail_after(WAIT):
        await ended.wait()
    assert not up.alive
    assert "ConnectError" in (up.closed_reason or "")


class ResumableServer(FakeHttpServer):
    """tools/call answers on an SSE stream that breaks after its first (numbered) event; a GET
    with that event's id as Last-Event-ID replays the rest of it: the answer. With
    `resumable=False` the server has no GET stream at all (405)."""

    def __init__(self, resumable: bool) -> None:
        super().__init__()
        self.resumable = resumable
        self.resumed_after: list[str] = []
        self.call_id: Any = None

    async def handle(self, request: httpx2.Request) -> httpx2.Response:
        resume_from = request.headers.get("last-event-id")
        if request.method == "GET" and resume_from is not None:
            self.requests.append(request)
            self.resumed_after.append(resume_from)
            if not self.resumable:
                return httpx2.Response(405)
            answer = {"jsonrpc": "2.0", "id": self.call_id, "result": {"content": []}}
            return _sse(b"id: ev-2\ndata: " + json.dumps(answer).encode() + b"\n\n")
        if request.method == "POST" and json.loads(request.content).get("method") == "tools/call":
            self.requests.append(request)
            self.call_id = json.loads(request.content)["id"]
            log = {
                "jsonrpc": "2.0",
                "method": "notifications/message",
                "params": {"level": "info", "data": "working"},
            }

            async def breaks_after_one_event() -> Any:
                yield b"id: ev-1\ndata: " + json.dumps(log).encode() + b"\n\n"
                raise httpx2.ReadError("connection reset by peer")

            return _sse(breaks_after_one_event())
        return await super().handle(request)


def _sse(content: Any) -> httpx2.Response:
    return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=content)


async def test_a_broken_response_stream_is_resumed_from_its_last_event(
    nursery: trio.Nursery,
) -> None:
    server = ResumableServer(resumable=True)
    events = Events()
    up = upstream_class(server)(
        identity_of("web", settings()), events, max_line=1 << 20, handshake_timeout=WAIT
    )
    with trio.fail_after(WAIT):
        await nursery.start(up.run)
        result = await up.call("tools/call", {"name": "x"}, timeout=WAIT)
    assert result == {"content": []}
    assert server.resumed_after == ["ev-1"]
    assert events.notifications == ["notifications/message"]  # the event before the break
    assert up.alive  # nothing was lost: the connection carries on
    up.request_close("drained")


async def test_a_stream_that_cannot_be_resumed_fails_its_request_and_the_connection(
    nursery: trio.Nursery,
) -> None:
    server = ResumableServer(resumable=False)
    up = upstream_class(server)(
        identity_of("web", settings()), Events(), max_line=1 << 20, handshake_timeout=WAIT
    )
    with trio.fail_after(WAIT):
        await nursery.start(up.run)
    with pytest.raises(McpoolError) as failed, trio.fail_after(WAIT):
        await up.call("tools/call", {"name": "x"}, timeout=WAIT)
    assert "lost its connection" in str(failed.value.data)
    assert server.resumed_after == ["ev-1"]
    assert not up.alive


def test_the_default_factory_picks_the_class_by_transport() -> None:
    http = identity_of("web", settings())
    sse = identity_of("old", ServerSettings(url="http://127.0.0.1:1/sse"))
    stdio = identity_of("cmd", ServerSettings(command="true"))
    opts: dict[str, Any] = {"guardian": None, "max_line": 1024, "handshake_timeout": 1.0}
    assert type(default_upstream_factory(http, Events(), **opts)) is HttpUpstream
    assert type(default_upstream_factory(sse, Events(), **opts)) is HttpUpstream
    assert type(default_upstream_factory(stdio, Events(), **opts)) is StdioUpstream


class Listener:
    def snapshot_changed(self, entry: PoolEntry) -> None:
        pass

    def upstream_notification(self, entry: PoolEntry, method: str, params: object) -> None:
        pass

    def server_request(self, entry: PoolEntry, upstream: object, msg: object) -> str | None:
        return "no"


async def test_a_refused_header_value_never_reaches_errors_or_the_log(
    nursery: trio.Nursery,
) -> None:
    """Defence behind the settings check (daemon/_expand.py refuses such a value): the real
    HTTP client against a real socket refuses the header and quotes it; nothing mcpool keeps
    or shows repeats it."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def hold(stream: trio.SocketStream) -> None:
        await stream.receive_some()

    nursery.start_soon(trio.serve_listeners, hold, listeners)
    secret = "Bearer s3cr3t-in-a-header\n"
    entry = ServerSettings(
        type="http", url=f"http://127.0.0.1:{port}/mcp", headers={"Authorization": secret}
    )
    pool = Pool(nursery, PoolOptions(backoff_initial=10, backoff_max=10))
    ident = identity_of("web", entry)
    with trio.fail_after(WAIT):
        handle = await pool.acquire(ident, entry, "s1", Listener())
        while handle.entry.last_error is None:
            await handle.entry.state_changed.wait()
    shown = [handle.entry.last_error, *handle.entry.stderr_history]
    assert "Illegal header value" in "\n".join(shown)  # the real client did refuse it
    assert not any("s3cr3t" in line for line in shown), shown
    pool.release(handle)
    await pool.aclose()


class TwoMessageServer(FakeHttpServer):
    """Answers tools/call with an application/json body of two messages, one a line: a log
    notification and the answer; `garbage` instead sends a body that is no JSON at all."""

    def __init__(self, garbage: bool = False) -> None:
        super().__init__()
        self.garbage = garbage

    async def handle(self, request: httpx2.Request) -> httpx2.Response:
        if request.method == "POST" and json.loads(request.content).get("method") == "tools/call":
            msg_id = json.loads(request.content)["id"]
            if self.garbage:
                return httpx2.Response(
                    200, headers={"content-type": "application/json"}, content=b"<html>oops"
                )
            log = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "x"}}
            answer = {"jsonrpc": "2.0", "id": msg_id, "result": {"content": []}}
            body = json.dumps(log).encode() + b"\n" + json.dumps(answer).encode() + b"\n"
            return httpx2.Response(200, headers={"content-type": "application/json"}, content=body)
        return await super().handle(request)


async def test_a_json_body_of_several_messages_is_read_message_by_message(
    nursery: trio.Nursery,
) -> None:
    events = Events()
    up = upstream_class(TwoMessageServer())(
        identity_of("web", settings()), events, max_line=1 << 20, handshake_timeout=WAIT
    )
    with trio.fail_after(WAIT):
        await nursery.start(up.run)
        result = await up.call("tools/call", {"name": "x"}, timeout=WAIT)
    assert result == {"content": []}
    assert events.notifications == ["notifications/message"]
    up.request_close("drained")


async def test_a_json_body_that_is_no_message_fails_its_request_naming_what_came(
    nursery: trio.Nursery,
) -> None:
    up = upstream_class(TwoMessageServer(garbage=True))(
        identity_of("web", settings()), Events(), max_line=1 << 20, handshake_timeout=WAIT
    )
    with trio.fail_after(WAIT):
        await nursery.start(up.run)
    with pytest.raises(McpoolError) as failed, trio.fail_after(WAIT):
        await up.call("tools/call", {"name": "x"}, timeout=WAIT)
    assert "server 'web' answered with an application/json body" in str(failed.value.data)
    assert "<html>oops" in str(failed.value.data)
    assert any("an HTTP response" in line or "JSON body" in line for line in up.stderr_tail)
