"""Issue 7 end to end: HTTP and SSE upstreams, the daemon's own streamable HTTP endpoint, the
`"prefix": false` setting (the conformance parity script is tests/e2e/test_conformance_server.py).

Real processes only: server-everything in its streamableHttp and sse modes (with
tools/bench/loopback.cjs preloaded, so it listens on 127.0.0.1 and nowhere else), the daemon,
attach bridges and the SDK's own streamable HTTP client. Every wait is bounded.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
import trio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from .harness import REPO, DaemonFactory, DaemonProcess, fake_server, run_daemonctl
from .support import STEP_TIMEOUT, call_text, servers_of, text_of, tool_names, wait_until

pytestmark = pytest.mark.peers

LOOPBACK_PRELOAD = REPO / "tools" / "bench" / "loopback.cjs"
# A cold node start of server-everything is about half a second; this bounds a hang.
LISTEN_TIMEOUT = 20.0
# After the HTTP server comes back, the pool reconnects within its backoff (1 s, 2 s, ...).
RECOVERY_TIMEOUT = 30.0
CONNECT_POLL = 0.05  # the server listens at an unknown moment in another process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def wait_listening(port: int, proc: trio.Process, log: Path) -> None:
    with trio.fail_after(LISTEN_TIMEOUT):
        while True:
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                assert proc.poll() is None, f"exited early:\n{log.read_text(errors='replace')}"
                await trio.sleep(CONNECT_POLL)
                continue
            await stream.aclose()
            return


@asynccontextmanager
async def everything_http(
    peers: dict[str, str], mode: str, tmp_path: Path, port: int | None = None
) -> AsyncIterator[int]:
    """server-everything in `mode` (streamableHttp or sse) on 127.0.0.1:<port>; yields the port."""
    port = port or free_port()
    log = tmp_path / f"everything-{mode}-{port}.log"
    with log.open("ab") as out:
        proc = await trio.lowlevel.open_process(
            [
                peers["PEER_NODE22"],
                "--require",
                str(LOOPBACK_PRELOAD),
                peers["PEER_EVERYTHING_JS"],
                mode,
            ],
            env={**os.environ, "PORT": str(port)},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    try:
        await wait_listening(port, proc, log)
        yield port
    finally:
        proc.kill()
        with trio.move_on_after(5):
            await proc.wait()


def http_server(port: int, **extra: Any) -> dict[str, Any]:
    return {"type": "http", "url": f"http://127.0.0.1:{port}/mcp", **extra}


async def test_http_upstream_is_shared_by_equal_headers_only(
    daemon_factory: DaemonFactory, peers: dict[str, str], tmp_path: Path
) -> None:
    async with everything_http(peers, "streamableHttp", tmp_path) as port:
        daemon = await daemon_factory()
        # Credentials in the URL and its query must never be shown (X2).
        url = f"http://user:hunter2@127.0.0.1:{port}/mcp?token=hunter2"
        a = daemon.settings_file("a.json", {"web": {"httpUrl": url, "headers": {"X-T": "one"}}})
        b = daemon.settings_file("b.json", {"web": {"httpUrl": url, "headers": {"x-t": "one"}}})
        c = daemon.settings_file("c.json", {"web": {"httpUrl": url, "headers": {"X-T": "two"}}})
        async with daemon.attach([a], "a") as sa, daemon.attach([b], "b") as sb:
            assert "web__echo" in await tool_names(sa)
            assert await call_text(sa, "web__echo", {"message": "hi"}) == "Echo: hi"
            assert await call_text(sb, "web__echo", {"message": "ho"}) == "Echo: ho"
            servers = await servers_of(daemon)
            assert len(servers) == 1, servers
            assert len(servers[0]["refs"]) == 2
            assert servers[0]["transport"] == "http"
            assert servers[0]["state"] == "active"
            assert servers[0]["transport_detail"]["url"] == f"http://127.0.0.1:{port}/mcp"
            async with daemon.attach([c], "c") as sc:
                assert await call_text(sc, "web__echo", {"message": "x"}) == "Echo: x"
                servers = await servers_of(daemon)
                assert len(servers) == 2, servers
                assert len({s["fingerprint"] for s in servers}) == 2
            table = await run_daemonctl(daemon.sock, "servers", env=daemon.env)
            assert "hunter2" not in table.stdout.decode() + str(servers)
            assert f"127.0.0.1:{port}/mcp" in table.stdout.decode().replace("\n", "")


async def test_sse_upstream_is_listed_and_called(
    daemon_factory: DaemonFactory, peers: dict[str, str], tmp_path: Path
) -> None:
    async with everything_http(peers, "sse", tmp_path) as port:
        daemon = await daemon_factory()
        settings = daemon.settings_file("s.json", {"old": {"url": f"http://127.0.0.1:{port}/sse"}})
        async with daemon.attach([settings], "sse") as session:
            names = await tool_names(session)
            assert "old__echo" in names and "old__get-sum" in names, names
            assert await call_text(session, "old__get-sum", {"a": 2, "b": 3}) == (
                "The sum of 2 and 3 is 5."
            )
            servers = await servers_of(daemon)
            assert [s["transport"] for s in servers] == ["sse"]


async def test_http_server_restart_mid_session_recovers(
    daemon_factory: DaemonFactory, peers: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    daemon = await daemon_factory(daemon={"backoffInitial": 0.2, "backoffMax": 1})
    settings = daemon.settings_file("h.json", {"web": http_server(port)})
    async with everything_http(peers, "streamableHttp", tmp_path, port):
        session_cm = daemon.attach([settings], "restart")
        session = await session_cm.__aenter__()
        try:
            assert await call_text(session, "web__echo", {"message": "1"}) == "Echo: 1"
            first = (await servers_of(daemon))[0]
        except BaseException:
            await session_cm.__aexit__(None, None, None)
            raise
    try:
        # The server is gone: the entry notices (its GET stream breaks) and leaves "active".
        with trio.fail_after(RECOVERY_TIMEOUT):
            await wait_until(lambda: _state_is_not(daemon, "active"))
        async with everything_http(peers, "streamableHttp", tmp_path, port):
            with trio.fail_after(RECOVERY_TIMEOUT):
                await wait_until(lambda: _echoes(session))
            again = (await servers_of(daemon))[0]
            assert again["state"] == "active"
            assert again["restarts"] > first["restarts"]
    finally:
        await session_cm.__aexit__(None, None, None)


async def _state_is_not(daemon: DaemonProcess, state: str) -> bool:
    servers = await servers_of(daemon)
    return bool(servers) and servers[0]["state"] != state


async def _echoes(session: ClientSession) -> bool:
    """One call; while the server is being reconnected the tool is unknown or unavailable."""
    try:
        with trio.fail_after(STEP_TIMEOUT):
            result = await session.call_tool("web__echo", {"message": "back"})
    except MCPError:
        return False
    return not result.is_error and text_of(result) == "Echo: back"


async def test_http_upstream_routes_sampling_by_the_stream_it_came_on(
    daemon_factory: DaemonFactory, peers: dict[str, str], tmp_path: Path
) -> None:
    """Over stdio a sampling request with two busy sessions is refused (no owner can be told
    apart); over streamable HTTP it arrives on the calling request's stream, which names it."""
    from .test_server_requests import Callbacks, client

    async with everything_http(peers, "streamableHttp", tmp_path) as port:
        daemon = await daemon_factory()
        settings = daemon.settings_file("h.json", {"web": http_server(port)})
        a, b = Callbacks("a"), Callbacks("b")
        async with client(daemon, settings, a) as sa, client(daemon, settings, b) as sb:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    sa.call_tool,
                    "web__trigger-long-running-operation",
                    {"duration": 2, "steps": 2},
                )
                with trio.fail_after(STEP_TIMEOUT):
                    await wait_until(lambda: _in_flight(daemon))
                with trio.fail_after(STEP_TIMEOUT):
                    result = await sb.call_tool(
                        "web__trigger-sampling-request", {"prompt": "hi", "maxTokens": 5}
                    )
            assert not result.is_error, result
            assert "sampled by b" in " ".join(
                c.text for c in result.content if isinstance(c, types.TextContent)
            )
            assert a.sampled == [] and len(b.sampled) == 1


async def _in_flight(daemon: DaemonProcess) -> bool:
    servers = await servers_of(daemon)
    return bool(servers) and servers[0]["in_flight"] >= 1


# -- the daemon's own endpoint -------------------------------------------------------------------


async def http_daemon(
    daemon_factory: DaemonFactory, servers: dict[str, Any]
) -> tuple[DaemonProcess, int]:
    daemon = await daemon_factory(servers, start=False)
    port = free_port()
    argv = daemon.argv()
    daemon.argv = lambda: [*argv, "--http", f"127.0.0.1:{port}"]  # type: ignore[method-assign]
    await daemon.start()
    assert daemon.process is not None
    await wait_listening(port, daemon.process, daemon.stderr_path)
    return daemon, port


async def test_endpoint_refuses_foreign_origins_and_hosts(daemon_factory: DaemonFactory) -> None:
    daemon, port = await http_daemon(daemon_factory, {"fake": fake_server()})
    url = f"http://127.0.0.1:{port}/mcp"
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    headers = {"accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient(timeout=STEP_TIMEOUT) as http:
        for bad in (
            {"origin": "http://evil.example"},
            {"origin": "null"},
            {"host": "evil.example"},
        ):
            r = await http.post(url, json=init, headers={**headers, **bad})
            assert r.status_code == 403, (bad, r.status_code, r.text)
        r = await http.post(
            url, json=init, headers={**headers, "origin": f"http://localhost:{port}"}
        )
        assert r.status_code == 200, r.text
        sid = r.headers["mcp-session-id"]
        assert '"protocolVersion":"2025-06-18"' in r.text
        r = await http.post(
            url, json={"jsonrpc": "2.0", "id": 2, "method": "ping"}, headers=headers
        )
        assert r.status_code == 400  # no session id
        r = await http.post(
            url,
            json={"jsonrpc": "2.0", "id": 2, "method": "ping"},
            headers={**headers, "mcp-session-id": "nope"},
        )
        assert r.status_code == 404
        r = await http.delete(url, headers={"mcp-session-id": sid})
        assert r.status_code == 200
        r = await http.post(
            url,
            json={"jsonrpc": "2.0", "id": 3, "method": "ping"},
            headers={**headers, "mcp-session-id": sid},
        )
        assert r.status_code == 404
    with trio.fail_after(STEP_TIMEOUT):
        await wait_until(lambda: _sessions(daemon, 0))


async def _sessions(daemon: DaemonProcess, n: int) -> bool:
    return len(await daemon.ctl("sessions")) == n


async def test_endpoint_serves_the_sdk_streamable_http_client(
    daemon_factory: DaemonFactory, peers: dict[str, str], tmp_path: Path
) -> None:
    """Two SDK clients, the daemon's settings and a named settings file; progress and sampling
    on the request's own stream."""
    everything = {"command": peers["PEER_NODE22"], "args": [peers["PEER_EVERYTHING_JS"], "stdio"]}
    daemon, port = await http_daemon(daemon_factory, {"everything": everything})
    named = daemon.settings_file("named.json", {"fake": {**fake_server(), "prefix": False}})
    url = f"http://127.0.0.1:{port}/mcp"
    progress: list[float] = []
    sampled: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async def sampling(context: Any, params: types.CreateMessageRequestParams) -> Any:
        sampled.append("yes")
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="sampled"), model="m"
        )

    async with (
        httpx2.AsyncClient(timeout=httpx2.Timeout(STEP_TIMEOUT, read=60)) as http1,
        streamable_http_client(url, http_client=http1) as (read, write),
        ClientSession(read, write, sampling_callback=sampling) as session,
        httpx2.AsyncClient(headers={"X-Mcpool-Settings": str(named)}) as http2,
        streamable_http_client(url, http_client=http2) as (read2, write2),
        ClientSession(read2, write2) as other,
    ):
        with trio.fail_after(STEP_TIMEOUT * 2):
            await session.initialize()
            await other.initialize()
        assert "everything__echo" in await tool_names(session)
        assert "echo" in await tool_names(other)  # "prefix": false
        assert await call_text(session, "everything__echo", {"message": "hi"}) == "Echo: hi"
        assert "everything" not in str(await tool_names(other))
        with trio.fail_after(STEP_TIMEOUT * 2):
            result = await session.call_tool(
                "everything__trigger-long-running-operation",
                {"duration": 0.3, "steps": 3},
                progress_callback=on_progress,
            )
        assert not result.is_error, result
        with trio.fail_after(STEP_TIMEOUT):
            await wait_until(lambda: len(progress) == 3)
        with trio.fail_after(STEP_TIMEOUT):
            result = await session.call_tool(
                "everything__trigger-sampling-request", {"prompt": "hi", "maxTokens": 5}
            )
        assert not result.is_error, result
        assert sampled == ["yes"]
        sessions = await daemon.ctl("sessions")
        assert sorted(len(s["sources"]) for s in sessions) == [1, 1]
        assert {s["sources"][0] for s in sessions} == {str(daemon.config_path), str(named)}


async def test_prefix_false_exposes_upstream_names_and_a_collision_rejects_the_candidate(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    alone = daemon.settings_file(
        "alone.json", {"one": {**fake_server(FAKE_TOOLS="extra"), "prefix": False}}
    )
    clash = daemon.settings_file(
        "clash.json",
        {
            "one": {**fake_server(FAKE_TOOLS="extra"), "prefix": False},
            "two": {**fake_server(FAKE_TOOLS="other"), "prefix": False},
        },
    )
    async with daemon.attach([alone], "alone") as session:
        names = await tool_names(session)
        assert "extra" in names and "echo" in names, names
        assert not any("__" in n for n in names), names
        assert await call_text(session, "extra") == "extra"
        async with daemon.attach([clash], "clash") as clashing:
            status = await daemon.ctl("status")
            errors = [e["error"] for e in status["registry_errors"]]
            assert len(errors) == 1, status
            assert "server 'two'" in errors[0] and "server 'one' uses" in errors[0], errors
            # The rejected candidate was never published: none of `two`'s tools are served.
            assert "other" not in await tool_names(clashing)
        assert await call_text(session, "extra") == "extra"
