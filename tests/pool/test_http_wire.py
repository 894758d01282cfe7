"""HTTP upstreams against a real socket: a small streamable HTTP server of the tests' own (trio,
HTTP/1.1 with `Connection: close`), driven through the real pool and `HttpUpstream`.

Issue 15: a log message on the response stream of one session's call reaches that session only
(point 2, and the stdio rule next to it); a stream the server ends on purpose after a priming
event is resumed by GET with Last-Event-ID after `retry` (point 3, SEP-1699); a 401 names the
status and the server's WWW-Authenticate challenge (point 12).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgspec
import trio
from wire import CHALLENGE, SAY, WireServer

from mcpool.pool import Handle, Pool, PoolEntry, PoolOptions, ServerSettings, identity_of
from mcpool.protocol import Message

WAIT = 10.0  # loopback only; this turns a hang into a failure
FAKE_UPSTREAM = Path(__file__).resolve().parents[2] / "tools" / "fake_upstream.py"


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


async def test_malformed_listed_items_are_left_out_and_reported(nursery: trio.Nursery) -> None:
    tools = [SAY, {"inputSchema": {"type": "object"}}, {"name": 42}, "not an object"]
    server = WireServer(tools=tools)
    await server.serve(nursery)
    logged: list[str] = []
    pool = Pool(nursery, PoolOptions(), log=lambda level, text, **_: logged.append(text))
    settings = ServerSettings(type="http", url=server.url)
    ident = identity_of("odd", settings)
    with trio.fail_after(WAIT):
        handle = await pool.acquire(ident, settings, "a", Listener())
    snapshot = handle.entry.snapshot
    assert [t["name"] for t in snapshot.tools] == ["say"]
    assert snapshot.notes == (
        "tools/list: 3 malformed items left out: item 2: an item with no name; "
        "item 3: an item whose name is a number (42), not a string; "
        "item 4: a non-object item (a string)",
    )
    assert logged == [f"server 'odd': {snapshot.notes[0]}"]
    await pool.aclose()


# Issue 18, item 2: a 2026-07-28 HTTP upstream gets the revision's request metadata headers.
REGION = {
    "name": "query",
    "inputSchema": {
        "type": "object",
        "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "where": {
                "type": "object",
                "properties": {"shard": {"type": "integer", "x-mcp-header": "Shard"}},
            },
            "note": {"type": "string", "x-mcp-header": "Note"},
        },
    },
}
# x-mcp-header on an array's items: not statically reachable, so the tool is invalid on HTTP.
BAD_HEADER = {
    "name": "bad",
    "inputSchema": {
        "type": "object",
        "properties": {"xs": {"type": "array", "items": {"type": "string", "x-mcp-header": "X"}}},
    },
}


async def test_modern_requests_carry_the_standard_and_parameter_headers(
    nursery: trio.Nursery,
) -> None:
    server = WireServer(modern=True, tools=[SAY, REGION, BAD_HEADER])
    await server.serve(nursery)
    pool = Pool(nursery, PoolOptions())
    settings = ServerSettings(type="http", url=server.url)
    ident = identity_of("modern", settings)
    with trio.fail_after(WAIT):
        handle = await pool.acquire(ident, settings, "a", Listener())
    assert handle.entry.upstream is not None and handle.entry.upstream.era == "modern"
    # The tool whose annotation breaks the rules is left out of the list, the others kept.
    assert [t["name"] for t in handle.entry.snapshot.tools] == ["say", "query"]
    arguments = {"region": "us-west1", "where": {"shard": 7}, "note": "Hello, 世界"}
    await _call(handle, "query", arguments)

    by_method = {msg["method"]: headers for headers, msg in server.posts if "id" in msg}
    discover = by_method["server/discover"]
    assert discover["mcp-method"] == "server/discover"
    assert discover["mcp-protocol-version"] == "2026-07-28"
    assert by_method["tools/list"]["mcp-method"] == "tools/list"
    assert "mcp-name" not in by_method["tools/list"]
    call = by_method["tools/call"]
    assert call["mcp-method"] == "tools/call"
    assert call["mcp-name"] == "query"
    assert call["mcp-protocol-version"] == "2026-07-28"
    assert call["mcp-param-region"] == "us-west1"
    assert call["mcp-param-shard"] == "7"
    assert call["mcp-param-note"] == "=?base64?SGVsbG8sIOS4lueVjA==?="  # the spec's example
    await pool.aclose()


async def test_a_32022_naming_a_version_mcpool_speaks_is_discovered_again(
    nursery: trio.Nursery,
) -> None:
    server = WireServer(modern=True, refuse_discover=1)
    await server.serve(nursery)
    pool = Pool(nursery, PoolOptions())
    settings = ServerSettings(type="http", url=server.url)
    ident = identity_of("again", settings)
    with trio.fail_after(WAIT):
        handle = await pool.acquire(ident, settings, "a", Listener())
    assert handle.entry.upstream is not None, handle.entry.last_error
    assert handle.entry.upstream.era == "modern"
    methods = [msg.get("method") for _headers, msg in server.posts]
    assert methods[:2] == ["server/discover", "server/discover"], methods
    assert "initialize" not in methods
    await pool.aclose()
