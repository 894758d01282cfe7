"""Session churn leaves nothing for the cyclic collector: a session that detached, its views and
handles, and the session-scoped entry and connection that closed after it are freed by reference
counting alone.

The daemon freezes its heap and collects the young generation seldom (daemon/_daemon.py), so
whatever a detach leaves in a reference cycle is memory that grows with every attach. The real
`Daemon` runs in-process with the collector off, on a stdlib fake upstream (a real process).
"""

from __future__ import annotations

import socket
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
import trio.testing
from e2e.harness import fake_server, raw_socket_client, write_settings
from e2e.in_process import running_daemon
from e2e.support import raw_attach, wait_until

from mcpool.daemon._daemon import Daemon

STEP_TIMEOUT = 10.0  # an in-process round trip takes milliseconds; this only bounds a hang
# A session-scoped entry closes this long after its session left (drained), then its process.
DAEMON = {"drainGrace": 0.05, "maxIdle": 0.1}


def new_daemon(sock_dir: Path, tmp_path: Path) -> Daemon:
    servers = {"own": {**fake_server(), "scope": "session"}, "shared": fake_server()}
    config = write_settings(tmp_path / "config.json", servers, daemon=DAEMON)
    return Daemon(str(sock_dir / "daemon.sock"), str(config))


@pytest.fixture
async def daemon(sock_dir: Path, tmp_path: Path, no_collector: None) -> AsyncIterator[Daemon]:
    async with running_daemon(new_daemon(sock_dir, tmp_path)) as d:
        yield d


@pytest.fixture
async def http_daemon(
    sock_dir: Path, tmp_path: Path, no_collector: None
) -> AsyncIterator[tuple[Daemon, int]]:
    d = new_daemon(sock_dir, tmp_path)
    port = free_port()
    d.http_bind = ("127.0.0.1", port, False)
    async with running_daemon(d):
        with trio.fail_after(STEP_TIMEOUT):
            while not await _listening(port):
                await trio.sleep(0.01)
        yield d, port


async def test_a_detached_session_and_its_closed_entry_go_without_the_collector(
    daemon: Daemon,
) -> None:
    assert daemon.pool is not None
    refs: dict[str, weakref.ref[Any]] = {}
    async with raw_socket_client(daemon.sock_path) as client:
        sid = await raw_attach(client, [daemon.config_path], "alpha")
        for rid, name in enumerate(("own__echo", "shared__echo", "own__pid")):
            answer = await client.request("tools/call", {"name": name, "arguments": {"text": "x"}})
            assert "result" in answer, (rid, answer)
        session = daemon.sessions[sid].session
        refs["session"] = weakref.ref(session)
        for server, view in session.views.items():
            assert view.handle is not None
            refs[f"view {server}"] = weakref.ref(view)
            refs[f"handle {server}"] = weakref.ref(view.handle)
        (own,) = [e for e in daemon.pool.entries() if e.name == "own"]
        assert own.upstream is not None
        refs["own entry"] = weakref.ref(own)
        refs["own connection"] = weakref.ref(own.upstream)
        del session, view, own
    with trio.fail_after(STEP_TIMEOUT):
        # Detached, and its session-scoped entry drained and closed; then every task is idle
        # (the entry's supervisor has ended).
        await wait_until(lambda: not daemon.sessions and not _has_entry(daemon, "own"))
        await trio.testing.wait_all_tasks_blocked()
    assert sorted(name for name, ref in refs.items() if ref() is not None) == []


def _has_entry(daemon: Daemon, name: str) -> bool:
    assert daemon.pool is not None
    return any(e.name == name for e in daemon.pool.entries())


async def test_an_ended_http_session_goes_without_the_collector(
    http_daemon: tuple[Daemon, int],
) -> None:
    daemon, port = http_daemon
    url = f"http://127.0.0.1:{port}/mcp"
    headers = {"accept": "application/json, text/event-stream"}
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
    refs: dict[str, weakref.ref[Any]] = {}
    async with httpx2.AsyncClient(timeout=STEP_TIMEOUT) as http:
        r = await http.post(url, json=init, headers=headers)
        assert r.status_code == 200, r.text
        headers["mcp-session-id"] = r.headers["mcp-session-id"]
        call = {"name": "shared__echo", "arguments": {"text": "x"}}
        r = await http.post(
            url,
            json={"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call},
            headers=headers,
        )
        assert r.status_code == 200 and '"x"' in r.text, r.text
        (state,) = daemon.sessions.values()
        refs["session"] = weakref.ref(state.session)
        del state
        r = await http.delete(url, headers={"mcp-session-id": headers["mcp-session-id"]})
        assert r.status_code == 200
    with trio.fail_after(STEP_TIMEOUT):
        await wait_until(lambda: not daemon.sessions)
        await trio.testing.wait_all_tasks_blocked()
    assert sorted(name for name, ref in refs.items() if ref() is not None) == []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _listening(port: int) -> bool:
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        return False
    await stream.aclose()
    return True
