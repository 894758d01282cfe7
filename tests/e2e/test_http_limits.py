"""Issue 26, items 3 and 4 on `mcpool daemon --http`: another uid's connections cost the owner
nothing, and every byte a peer can make the endpoint hold is bounded (X7, X8).

Real daemons, real sockets written byte by byte (what a hostile client sends is exactly what the
test writes), a second local uid (tests/other_user.py) for the attacker. Each limit is set small
through the daemon's own options; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from other_user import SYSTEM_PYTHON, OtherUser

from e2e.harness import DaemonFactory, DaemonProcess, fake_server
from e2e.support import STEP_TIMEOUT, raw_attach, raw_call, raw_text, wait_until
from e2e.test_http_fence import INITIALIZE, READ_CHUNK, _session_id, exchange, free_port, post, rpc
from mcpool.daemon._http import STREAMLESS_LOSSY_BYTES

pytest.importorskip("h11")

LISTEN_POLL = 0.02  # the endpoint listens at an unknown moment in another process
# The attacker's connections: as many as the attack held.
HELD = 2000
CHURN_SECONDS = 6.0  # the owner works while the attacker churns for this long
# The attacker's own start, 2,000 connects and its report (a Python start, then milliseconds).
ATTACKER_TIMEOUT = 60.0
# The daemon's open fds while the attacker holds 2,000 connections: its own (sockets, the log,
# an upstream's pipes, epoll) and a few connections being refused, never the attacker's 2,000.
FD_BOUND = 300
# Refusal lines in the log for the whole attack: the first of each kind at once, then one a
# minute per kind and uid, then each count at shutdown.
REFUSAL_LINES_BOUND = 8


async def http_daemon(
    daemon_factory: DaemonFactory,
    options: dict[str, Any] | None = None,
    servers: dict[str, Any] | None = None,
) -> tuple[DaemonProcess, int]:
    daemon = await daemon_factory(
        servers if servers is not None else {"fake": fake_server()}, daemon=options, start=False
    )
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


async def read_reply(stream: trio.SocketStream) -> tuple[int, str, bytes, bool]:
    """One response read to its Content-Length: (status, head, body, closed after it)."""
    buf = bytearray()
    while (end := buf.find(b"\r\n\r\n")) < 0:
        chunk = await stream.receive_some(READ_CHUNK)
        assert chunk, bytes(buf)
        buf += chunk
    head = buf[:end].decode("latin-1")
    length = next(
        int(value)
        for name, _, value in (line.partition(":") for line in head.split("\r\n")[1:])
        if name.strip().lower() == "content-length"
    )
    while len(buf) < end + 4 + length:
        chunk = await stream.receive_some(READ_CHUNK)
        assert chunk, bytes(buf)
        buf += chunk
    closed = "connection: close" in head.lower()
    return int(head.split(" ", 2)[1]), head, bytes(buf[end + 4 : end + 4 + length]), closed


async def at_eof(stream: trio.SocketStream) -> bool:
    """The daemon closed the connection (EOF or a reset)."""
    try:
        return await stream.receive_some(READ_CHUNK) == b""
    except trio.BrokenResourceError:
        return True


def limit_of(body: bytes) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(body)["error"]["data"]
    return data


# -- (c) one deadline for a request's head, one for its body --------------------------------------


async def test_a_head_dribbled_past_its_deadline_is_refused_and_closed(
    daemon_factory: DaemonFactory,
) -> None:
    """One byte a second, each within any per-read bound, the head never whole by the deadline."""
    daemon, port = await http_daemon(daemon_factory, {"httpHeadTimeout": 1.5})
    head = post(INITIALIZE).partition(b"\r\n\r\n")[0]
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    sent = 0
    async with trio.open_nursery() as nursery:

        async def dribble() -> None:
            nonlocal sent
            for byte in head:
                await stream.send_all(bytes([byte]))
                sent += 1
                await trio.sleep(1.0)

        nursery.start_soon(dribble)
        with trio.fail_after(STEP_TIMEOUT):
            status, _, body, closed = await read_reply(stream)
            assert await at_eof(stream)
        nursery.cancel_scope.cancel()
    assert status == 408 and closed, body
    assert limit_of(body)["option"] == "daemon.httpHeadTimeout"
    assert 2 <= sent < len(head)  # it was dribbling, and the head was never whole
    await stream.aclose()
    # The body has its own deadline, for the whole body, too.
    daemon.write_config({"fake": fake_server()}, {"httpBodyTimeout": 1.5})
    with trio.fail_after(STEP_TIMEOUT):
        await wait_until(lambda: _option_is(daemon, "httpBodyTimeout", 1.5))
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    whole = post(INITIALIZE)
    cut = whole.index(b"\r\n\r\n") + 4
    await stream.send_all(whole[:cut])
    async with trio.open_nursery() as nursery:

        async def dribble_body() -> None:
            for byte in whole[cut:]:
                await stream.send_all(bytes([byte]))
                await trio.sleep(0.5)

        nursery.start_soon(dribble_body)
        with trio.fail_after(STEP_TIMEOUT):
            status, _, body, closed = await read_reply(stream)
        nursery.cancel_scope.cancel()
    assert status == 408 and closed, body
    assert limit_of(body)["option"] == "daemon.httpBodyTimeout"
    await stream.aclose()


async def _option_is(daemon: DaemonProcess, name: str, value: Any) -> bool:
    status = await daemon.ctl("status")
    return bool(status["options"].get(name) == value)


# -- (d) the head decides before the body is read --------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "status", "why"),
    [
        ("Origin: http://evil.example\r\n", 403, "Origin"),
        ("Origin: null\r\n", 403, "Origin"),
        ("", 403, "Host"),  # Host: evil.example, below
        ("", 413, "maxMessageBytes"),  # Content-Length past it
    ],
)
async def test_a_refused_head_is_answered_before_its_body_is_sent(
    daemon_factory: DaemonFactory, extra: str, status: int, why: str
) -> None:
    _, port = await http_daemon(daemon_factory)
    length = 15 * 1024 * 1024 if status != 413 else 17 * 1024 * 1024
    host = "evil.example" if why == "Host" else "127.0.0.1"
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json, text/event-stream\r\nContent-Length: {length}\r\n{extra}\r\n"
    ).encode()
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(head)  # and not a byte of the body
    with trio.fail_after(STEP_TIMEOUT):
        got, _, body, closed = await read_reply(stream)
        assert await at_eof(stream)
    assert got == status and closed, body
    assert why in body.decode(), body
    await stream.aclose()
    # The daemon goes on serving.
    got, _, body = await exchange(port, post(INITIALIZE), until=b"protocolVersion")
    assert got == 200, body


async def test_a_head_past_its_size_bound_is_a_431_naming_the_bound(
    daemon_factory: DaemonFactory,
) -> None:
    _, port = await http_daemon(daemon_factory)
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    head = b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"p" * 200_000 + b"\r\n\r\n"
    with contextlib.suppress(trio.BrokenResourceError):
        await stream.send_all(head)
    with trio.fail_after(STEP_TIMEOUT):
        status, _, body, closed = await read_reply(stream)
    assert status == 431 and closed, body
    assert limit_of(body)["limit"] == 65536
    await stream.aclose()


# -- (e) caps: connections, sessions, pending bodies ----------------------------------------------


@asynccontextmanager
async def held_connections(port: int, n: int) -> AsyncIterator[list[trio.SocketStream]]:
    """`n` connections the daemon serves, each proven served by one request, then kept open."""
    streams: list[trio.SocketStream] = []
    try:
        for _ in range(n):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            streams.append(stream)
            await stream.send_all(b"GET /elsewhere HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            with trio.fail_after(STEP_TIMEOUT):
                status, _, _, closed = await read_reply(stream)
            assert status == 404 and not closed  # served, and kept alive
        yield streams
    finally:
        for stream in streams:
            await stream.aclose()


async def one_more(port: int) -> tuple[int, bytes]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        await stream.send_all(post_json(INITIALIZE))
        with trio.fail_after(STEP_TIMEOUT):
            status, _, body, _ = await read_reply(stream)
        return status, body
    finally:
        await stream.aclose()


async def test_connections_past_the_caps_get_503_and_429_naming_their_option(
    daemon_factory: DaemonFactory,
) -> None:
    daemon, port = await http_daemon(
        daemon_factory, {"httpMaxConnections": 3, "httpMaxConnectionsPerUid": 10}
    )
    async with held_connections(port, 3) as held:
        status, body = await one_more(port)
        assert status == 503, body
        assert limit_of(body)["option"] == "daemon.httpMaxConnections"
        assert limit_of(body)["limit"] == 3
        await held.pop().aclose()
        with trio.fail_after(STEP_TIMEOUT):
            await wait_until(lambda: _served(port))
    # Per uid (the owner's here): the same, with its own status and option; read live.
    daemon.write_config(
        {"fake": fake_server()}, {"httpMaxConnections": 10, "httpMaxConnectionsPerUid": 2}
    )
    with trio.fail_after(STEP_TIMEOUT):
        await wait_until(lambda: _option_is(daemon, "httpMaxConnectionsPerUid", 2))
    async with held_connections(port, 2):
        status, body = await one_more(port)
        assert status == 429, body
        assert limit_of(body)["option"] == "daemon.httpMaxConnectionsPerUid"


async def _served(port: int) -> bool:
    status, _ = await one_more(port)
    return status == 200


async def initialize_session(port: int) -> str:
    status, head, body = await exchange(port, post(INITIALIZE), until=b"protocolVersion")
    assert status == 200, body
    sid = _session_id(head)
    status, _, body = await exchange(
        port, post(b'{"jsonrpc":"2.0","method":"notifications/initialized"}', session=sid)
    )
    assert status == 202, body
    return sid


async def ping(port: int, sid: str) -> int:
    status, _, _ = await exchange(port, post(rpc(9, "ping"), session=sid), until=b'"id":9')
    return status


@asynccontextmanager
async def get_stream(port: int, sid: str) -> AsyncIterator[tuple[trio.SocketStream, bytes]]:
    """The session's GET stream, open (its head read) until the block ends: the stream, and
    what of its body came with the head."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        await stream.send_all(
            f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
            f"Mcp-Session-Id: {sid}\r\n\r\n".encode()
        )
        got = b""
        with trio.fail_after(STEP_TIMEOUT):
            while b"\r\n\r\n" not in got:
                chunk = await stream.receive_some(READ_CHUNK)
                assert chunk, got
                got += chunk
        assert got.startswith(b"HTTP/1.1 200"), got
        yield stream, got.partition(b"\r\n\r\n")[2]
    finally:
        await stream.aclose()


async def test_sessions_past_the_cap_evict_the_oldest_idle_and_ended_ids_answer_404(
    daemon_factory: DaemonFactory,
) -> None:
    daemon, port = await http_daemon(daemon_factory, {"httpMaxSessions": 2})
    a = await initialize_session(port)
    b = await initialize_session(port)
    c = await initialize_session(port)  # a, the oldest idle, is ended for it
    assert await ping(port, a) == 404
    assert await ping(port, b) == 200 and await ping(port, c) == 200
    status, _, _ = await exchange(
        port, f"DELETE /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nMcp-Session-Id: {c}\r\n\r\n".encode()
    )
    assert status == 200
    assert await ping(port, c) == 404
    async with get_stream(port, b):  # b is busy now, however old
        d = await initialize_session(port)
        e = await initialize_session(port)  # d is the only idle one: it goes
        assert await ping(port, d) == 404
        assert await ping(port, b) == 200 and await ping(port, e) == 200
        async with get_stream(port, e):
            status, _, body = await exchange(port, post(INITIALIZE))
            assert status == 503, body
            assert limit_of(body)["option"] == "daemon.httpMaxSessions"
    with trio.fail_after(STEP_TIMEOUT):
        await wait_until(lambda: _http_sessions(daemon, 2))
    log = daemon.log_path.read_text()
    assert log.count("evicted: the oldest idle") >= 2, log


async def _http_sessions(daemon: DaemonProcess, n: int) -> bool:
    return len([s for s in await daemon.ctl("sessions") if s["via"] == "http"]) == n


async def test_bodies_past_the_pending_cap_get_503_before_they_are_read(
    daemon_factory: DaemonFactory,
) -> None:
    _, port = await http_daemon(daemon_factory, {"httpMaxPendingBodyBytes": 1_000_000})
    size = 700_000
    body = b'{"jsonrpc":"2.0","id":1,"method":"ping","pad":"' + b"x" * (size - 49) + b'"}'
    assert len(body) == size
    whole = post(body)
    head = whole[: whole.index(b"\r\n\r\n") + 2]
    slow = await trio.open_tcp_stream("127.0.0.1", port)
    # Its 100 Continue says its head was read and its body's bytes reserved.
    await slow.send_all(head + b"Expect: 100-continue\r\n\r\n")
    with trio.fail_after(STEP_TIMEOUT):
        interim = await slow.receive_some(READ_CHUNK)
    assert interim.startswith(b"HTTP/1.1 100 ") and interim.endswith(b"\r\n\r\n"), interim
    # Another body as large: refused on its head, without waiting for its body.
    other = await trio.open_tcp_stream("127.0.0.1", port)
    await other.send_all(head + b"\r\n")
    with trio.fail_after(STEP_TIMEOUT):
        status, _, answer, closed = await read_reply(other)
    assert status == 503 and closed, answer
    assert limit_of(answer)["option"] == "daemon.httpMaxPendingBodyBytes"
    assert limit_of(answer)["limit"] == 1_000_000
    await other.aclose()
    # The first body is read and answered, and the budget given back for the next.
    await slow.send_all(body)
    with trio.fail_after(STEP_TIMEOUT):
        status, _, answer, _ = await read_reply(slow)
    assert status == 400, answer  # a ping without a session: read whole, then answered
    await slow.aclose()
    status, _, answer = await exchange(port, whole)
    assert status == 400, answer


async def test_bytes_sent_during_a_streamed_answer_past_a_heads_worth_end_the_connection(
    daemon_factory: DaemonFactory,
) -> None:
    """While a GET stream is open the client may pipeline its next request, no more: what it
    sends is kept (by h11) until the stream ends, so it is bounded like a head."""
    _, port = await http_daemon(daemon_factory)
    sid = await initialize_session(port)
    async with get_stream(port, sid) as (stream, _):
        with trio.fail_after(STEP_TIMEOUT):
            with contextlib.suppress(trio.BrokenResourceError):
                for _ in range(64):
                    await stream.send_all(b"x" * 4096)  # 256 KiB of anything
            while not await at_eof(stream):
                pass
    assert await ping(port, sid) == 200  # the session itself goes on


# -- (b) a stream-less session's messages are bounded in bytes -------------------------------------


async def test_a_streamless_sessions_log_messages_past_a_small_bound_are_dropped_and_counted(
    daemon_factory: DaemonFactory,
) -> None:
    """A client that posts in JSON mode and never opens a GET stream: the log messages of its
    calls have nowhere to go. A few are kept for a GET stream, the rest dropped and counted."""
    daemon, port = await http_daemon(daemon_factory)
    status, head, body = await exchange(port, post_json(INITIALIZE), until=b"protocolVersion")
    assert status == 200, body
    sid = _session_id(head)
    await exchange(port, post_json(b'{"jsonrpc":"2.0","method":"notifications/initialized"}', sid))
    message = "x" * 20_000
    calls = 20
    highest = 0
    for n in range(calls):
        args = {"level": "info", "message": message}
        call = rpc(10 + n, "tools/call", {"name": "fake__log", "arguments": args})
        status, _, body = await exchange(port, post_json(call, sid))
        assert status == 200 and b"logged" in body, body
        if n % 5 == 4:
            (mine,) = [s for s in await daemon.ctl("sessions") if s["via"] == "http"]
            highest = max(highest, mine["queued_bytes"])
    (mine,) = [s for s in await daemon.ctl("sessions") if s["via"] == "http"]
    highest = max(highest, mine["queued_bytes"])
    kept = calls - mine["lossy_dropped"]
    # Each is 20,000 bytes and an envelope: at most this many fit the bound.
    assert 1 <= kept <= STREAMLESS_LOSSY_BYTES // 20_000, mine
    assert kept * 20_000 <= highest <= STREAMLESS_LOSSY_BYTES, mine
    # What was kept reaches the GET stream when it opens, nothing more, and nothing waits.
    async with get_stream(port, sid) as (stream, got):
        with trio.fail_after(STEP_TIMEOUT):
            while got.count(b"notifications/message") < kept:
                got += await stream.receive_some(READ_CHUNK)
            await wait_until(lambda: _queued(daemon, 0))
        with trio.move_on_after(0.5):
            got += await stream.receive_some(READ_CHUNK)
        assert got.count(b"notifications/message") == kept


def post_json(body: bytes, session: str | None = None) -> bytes:
    """A POST that accepts a JSON answer only: no SSE stream for anything else."""
    head = (
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Accept: application/json\r\nContent-Length: {len(body)}\r\n"
    )
    if session is not None:
        head += f"Mcp-Session-Id: {session}\r\n"
    return (head + "\r\n").encode() + body


async def _queued(daemon: DaemonProcess, n: int) -> bool:
    (mine,) = [s for s in await daemon.ctl("sessions") if s["via"] == "http"]
    return bool(mine["queued_bytes"] == n)


# -- (a) another uid's connections cost the owner nothing ----------------------------------------

ATTACKER = """
import json, resource, socket, sys, time

port, hold, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft < hold + 256:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hold + 256, hard), hard))


def connect():
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setblocking(False)
    return s


def refused(s):
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


held = [connect() for _ in range(hold)]
deadline = time.monotonic() + 10
while time.monotonic() < deadline and not all(refused(s) for s in held):
    time.sleep(0.05)
print(json.dumps({"held": hold, "refused": sum(refused(s) for s in held)}), flush=True)
churned = errors = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    for i, s in enumerate(held):
        if refused(s):
            s.close()
            try:
                held[i] = connect()
                churned += 1
            except OSError:
                errors += 1  # kept closed: retried on the next pass
print(json.dumps({"churned": churned, "errors": errors}), flush=True)
"""


async def test_another_users_2000_connections_are_refused_unread_and_the_owner_is_served(
    daemon_factory: DaemonFactory, other_user: OtherUser
) -> None:
    daemon, port = await http_daemon(daemon_factory, {"sessionBufferBytes": 1 << 22})
    settings = str(daemon.config_path)
    script = other_user.script("hold_connections.py", ATTACKER)
    async with daemon.raw() as owner:
        await raw_attach(owner, [settings], "owner")
        assert raw_text(await raw_call(owner, "fake__echo", {"text": "before"})) == "before"
        attacker = other_user.popen(
            [SYSTEM_PYTHON, str(script), str(port), str(HELD), str(CHURN_SECONDS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert attacker.stdout is not None
            with trio.fail_after(ATTACKER_TIMEOUT):
                first = json.loads(
                    await trio.to_thread.run_sync(attacker.stdout.readline, abandon_on_cancel=True)
                    or b"{}"
                )
            assert first == {"held": HELD, "refused": HELD}, (first, attacker.stderr)
            # While the attacker churns its 2,000 connections, the owner is served, on the
            # socket and over HTTP, and the daemon holds none of the attacker's connections.
            fds = len(os.listdir(f"/proc/{daemon.pid}/fd"))
            assert fds < FD_BOUND, fds
            for n in range(20):
                with trio.fail_after(STEP_TIMEOUT):
                    got = await raw_call(owner, "fake__echo", {"text": f"during {n}"})
                assert raw_text(got) == f"during {n}"
            for _ in range(3):
                with trio.fail_after(STEP_TIMEOUT):
                    status, _, body = await exchange(
                        port, post(INITIALIZE), until=b"protocolVersion"
                    )
                assert status == 200, body
            with trio.fail_after(ATTACKER_TIMEOUT):
                last = json.loads(
                    await trio.to_thread.run_sync(attacker.stdout.readline, abandon_on_cancel=True)
                    or b"{}"
                )
            assert last.get("churned", 0) > 0, last
        finally:
            attacker.kill()
            attacker.wait(timeout=ATTACKER_TIMEOUT)
    assert await daemon.stop() == 0
    refusals = [
        record
        for record in map(json.loads, daemon.log_path.read_text().splitlines())
        if record["msg"].startswith("refused")
    ]
    assert 1 <= len(refusals) <= REFUSAL_LINES_BOUND, refusals
    theirs = [r for r in refusals if r.get("uid") == other_user.uid]
    assert theirs and theirs[0]["refusal"] == "foreign", refusals
    # Every refusal is counted in those few lines.
    assert sum(r["count"] for r in refusals) >= HELD + last["churned"] // 2, refusals
