"""Issue 12, item 1 on `mcpool daemon --http`: garbage, half requests, hostile values and clients
that disconnect mid-response end their own request or connection only.

Raw TCP on loopback against a real daemon: what a broken or hostile client sends is exactly what
the test writes. After each onslaught the daemon still answers `daemonctl status` and a proper
MCP request over HTTP.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import trio

from e2e.harness import DaemonFactory, DaemonProcess, fake_server
from e2e.support import PROTOCOL_VERSION, STEP_TIMEOUT

pytest.importorskip("h11")

TRIES = 5  # each hostile client, this many times
LISTEN_POLL = 0.02  # the endpoint listens at an unknown moment in another process
READ_CHUNK = 65536


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def http_daemon(daemon_factory: DaemonFactory) -> tuple[DaemonProcess, int]:
    daemon = await daemon_factory({"fake": fake_server()}, start=False)
    port = free_port()
    argv = daemon.argv()
    daemon.argv = lambda: [*argv, "--http", f"127.0.0.1:{port}"]  # type: ignore[method-assign]
    await daemon.start()
    with trio.fail_after(STEP_TIMEOUT):
        while True:
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                assert daemon.process is not None
                assert daemon.process.poll() is None, daemon.output()
                await trio.sleep(LISTEN_POLL)
                continue
            await stream.aclose()
            return daemon, port


def post(body: bytes, *, session: str | None = None, extra: str = "") -> bytes:
    head = (
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Accept: application/json, text/event-stream\r\n"
        f"Content-Length: {len(body)}\r\n"
    )
    if session is not None:
        head += f"Mcp-Session-Id: {session}\r\n"
    return (head + extra + "\r\n").encode() + body


def rpc(msg_id: int, method: str, params: dict[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
    if params is not None:
        message["params"] = params
    return json.dumps(message).encode()


INITIALIZE = rpc(
    1,
    "initialize",
    {
        "protocolVersion": PROTOCOL_VERSION,
        "capabilities": {},
        "clientInfo": {"name": "fence", "version": "0"},
    },
)


async def send_and_leave(port: int, data: bytes) -> None:
    """Connect, send `data`, close without reading."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        await stream.send_all(data)
    finally:
        await stream.aclose()


async def exchange(port: int, data: bytes, until: bytes | None = None) -> tuple[int, str, bytes]:
    """Send `data`; read the response (to EOF, to its Content-Length, or until `until` appears
    in the body); (status, head, body)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        await stream.send_all(data)
        buf = bytearray()
        with trio.fail_after(STEP_TIMEOUT):
            while True:
                end = buf.find(b"\r\n\r\n")
                if end >= 0:
                    head = buf[:end].decode("latin-1")
                    body = bytes(buf[end + 4 :])
                    length = _content_length(head)
                    if until is not None and until in body:
                        break
                    if length is not None and len(body) >= length:
                        break
                chunk = await stream.receive_some(READ_CHUNK)
                if not chunk:
                    break
                buf += chunk
    finally:
        await stream.aclose()
    end = buf.find(b"\r\n\r\n")
    assert end >= 0, bytes(buf)
    head = buf[:end].decode("latin-1")
    return int(head.split(" ", 2)[1]), head, bytes(buf[end + 4 :])


def _content_length(head: str) -> int | None:
    for line in head.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            return int(value.strip())
    return None


def _session_id(head: str) -> str:
    for line in head.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "mcp-session-id":
            return value.strip()
    raise AssertionError(f"no Mcp-Session-Id in {head!r}")


async def still_serving(daemon: DaemonProcess, port: int) -> None:
    assert daemon.process is not None
    assert daemon.process.poll() is None, daemon.output()
    assert (await daemon.ctl("status"))["pid"] == daemon.pid
    status, _, body = await exchange(port, post(INITIALIZE), until=b"protocolVersion")
    assert status == 200, body
    assert PROTOCOL_VERSION.encode() in body


async def test_garbage_half_requests_and_hang_ups_end_only_their_connection(
    daemon_factory: DaemonFactory,
) -> None:
    daemon, port = await http_daemon(daemon_factory)
    hostile = [
        b"\x00\xff\xfe garbage \r\n\r\n",
        b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n",  # a head cut short
        b'POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{"jsonrpc"',
        b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: x\r\n\r\n",
        post(b"\xff\xfe{not json"),
        post(INITIALIZE),  # a valid request whose client leaves before its response
        post(rpc(2, "initialize", {"protocolVersion": {}, "capabilities": []})),
    ]
    for _ in range(TRIES):
        for data in hostile:
            await send_and_leave(port, data)
    await still_serving(daemon, port)


async def test_broken_http_gets_a_400_and_a_close(daemon_factory: DaemonFactory) -> None:
    daemon, port = await http_daemon(daemon_factory)
    status, head, _ = await exchange(port, b"\x00\xff\xfe garbage \r\n\r\n")
    assert status == 400, head
    assert "connection: close" in head.lower()
    status, _, _ = await exchange(
        port, b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: x\r\n\r\n"
    )
    assert status == 400
    await still_serving(daemon, port)


async def test_a_progress_token_of_the_wrong_type_routes_nothing_and_breaks_nothing(
    daemon_factory: DaemonFactory,
) -> None:
    daemon, port = await http_daemon(daemon_factory)
    status, head, body = await exchange(port, post(INITIALIZE), until=b"protocolVersion")
    assert status == 200, body
    sid = _session_id(head)
    for token in ({}, [1], True, None):
        # A token is a string or an integer: anything else is invalid params naming the field
        # (session/_params.py), answered to this request only; the HTTP layer routes nothing.
        listed = rpc(7, "tools/list", {"_meta": {"progressToken": token}})
        status, _, body = await exchange(port, post(listed, session=sid), until=b'"id":7')
        assert status == 200, (token, body)
        assert b'"code":-32602' in body, (token, body)
        assert b"params._meta.progressToken" in body, (token, body)
    # The same session still lists its tools.
    status, _, body = await exchange(port, post(rpc(8, "tools/list"), session=sid), until=b'"id":8')
    assert status == 200, body
    assert b"fake__echo" in body, body
    await still_serving(daemon, port)


async def test_a_client_that_leaves_mid_stream_ends_only_its_request(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    daemon, port = await http_daemon(daemon_factory)
    status, head, body = await exchange(port, post(INITIALIZE), until=b"protocolVersion")
    assert status == 200, body
    sid = _session_id(head)
    slow = rpc(
        3,
        "tools/call",
        {
            "name": "fake__progress",
            "arguments": {"steps": 50, "delay": 0.02},
            "_meta": {"progressToken": "t"},
        },
    )
    for _ in range(TRIES):
        # Read the stream's head and its first event, then hang up while events still come.
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(post(slow, session=sid))
        with trio.fail_after(STEP_TIMEOUT):
            got = b""
            while b"data:" not in got:
                chunk = await stream.receive_some(READ_CHUNK)
                assert chunk, got
                got += chunk
        await stream.aclose()
    # The session itself goes on.
    status, _, body = await exchange(
        port,
        post(
            rpc(4, "tools/call", {"name": "fake__echo", "arguments": {"text": "on"}}), session=sid
        ),
        until=b'"id":4',
    )
    assert status == 200, body
    assert b'"text":"on"' in body.replace(b" ", b""), body
    await still_serving(daemon, port)
