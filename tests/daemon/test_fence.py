"""Issue 12, item 1: the daemon's per-connection fence, with the real `Daemon` run in-process.

No client input reaches an unexpected exception any more (the fuzzers check that), so the bug
the fence exists for is injected: one session's line handling, or one connection's attach,
raises. The fence logs it with its traceback, ends that connection only, and everyone else,
new connections included, carries on.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from e2e.harness import raw_socket_client
from e2e.in_process import running_daemon
from e2e.support import raw_attach

from mcpool.daemon._connections import ConnectionServer
from mcpool.daemon._daemon import Daemon
from mcpool.session._requests import Requests

STEP_TIMEOUT = 10.0  # an in-process round trip takes milliseconds; this only bounds a hang


@pytest.fixture
async def daemon(sock_dir: Path, tmp_path: Path) -> AsyncIterator[Daemon]:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"mcpServers": {}}))
    d = Daemon(str(sock_dir / "daemon.sock"), str(config))
    async with running_daemon(d):
        yield d


def _faults(d: Daemon) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in d.log_lines]
    return [r for r in records if r["msg"].startswith("internal error while")]


async def test_an_unexpected_error_in_one_session_ends_that_connection_only(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Requests.handle_line

    def sabotaged(self: Requests, line: bytes) -> None:
        if b"boom" in line:
            raise RuntimeError("a bug, injected by the test")
        real(self, line)

    monkeypatch.setattr(Requests, "handle_line", sabotaged)
    config = daemon.config_path
    async with (
        raw_socket_client(daemon.sock_path) as victim,
        raw_socket_client(daemon.sock_path) as bystander,
    ):
        await raw_attach(bystander, [config], "bystander")
        await raw_attach(victim, [config], "victim")
        await victim.send_raw(b'{"jsonrpc":"2.0","method":"boom"}\n')
        with trio.fail_after(STEP_TIMEOUT):
            assert await victim.receive_line() is None  # that connection, and only it, ends
        assert "result" in await bystander.request("ping")
        async with raw_socket_client(daemon.sock_path) as newcomer:
            await raw_attach(newcomer, [config], "newcomer")
            assert "result" in await newcomer.request("ping")
    (fault,) = _faults(daemon)
    assert fault["level"] == "error"
    assert "RuntimeError('a bug, injected by the test')" in fault["msg"]
    assert "Traceback" in fault["traceback"] and "sabotaged" in fault["traceback"]
    assert not any(st.session.name == "victim" for st in daemon.sessions.values())


async def test_an_unexpected_error_opening_a_connection_ends_that_connection_only(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ConnectionServer._open_connection_session

    def sabotaged(self: ConnectionServer, fd: int, writer: Any, first: Any, *args: Any) -> Any:
        if b"doomed" in bytes(first.params):
            raise KeyError("a bug, injected by the test")
        return real(self, fd, writer, first, *args)

    monkeypatch.setattr(ConnectionServer, "_open_connection_session", sabotaged)
    config = daemon.config_path
    async with raw_socket_client(daemon.sock_path) as bystander:
        await raw_attach(bystander, [config], "bystander")
        async with raw_socket_client(daemon.sock_path) as doomed:
            await doomed.send(
                {"jsonrpc": "2.0", "id": 1, "method": "mcpool/attach", "params": {"name": "doomed"}}
            )
            with trio.fail_after(STEP_TIMEOUT):
                assert await doomed.receive_line() is None
        assert "result" in await bystander.request("ping")
    (fault,) = _faults(daemon)
    assert "serving a connection" in fault["msg"] and "KeyError" in fault["msg"]
    assert "Traceback" in fault["traceback"]
