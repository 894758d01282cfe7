"""`daemonctl tools` through the admin API, with the real `Daemon` run in-process and a stdlib
fake upstream: a row says what a call of it does now.

While a reload waits for a new server to start, the session is still served its previous
generation (S7), and what the new settings no longer allow is refused at call time (S8). The
listing keeps such a tool, marked with why its calls are refused, as the client still lists it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from e2e.harness import fake_server, raw_socket_client, write_settings
from e2e.in_process import running_daemon
from e2e.support import raw_attach, wait_until

from mcpool.daemon._daemon import Daemon

STEP_TIMEOUT = 10.0  # an in-process round trip takes milliseconds; this only bounds a hang
# The new server's start outlasts the test: the reload waits for it all along (the daemon's
# shutdown ends it).
SLOW_START = 60
DAEMON = {"startupBudget": 120}  # longer than the slow start: the reload waits it out


@pytest.fixture
async def daemon(sock_dir: Path, tmp_path: Path) -> AsyncIterator[Daemon]:
    config = write_settings(tmp_path / "config.json", {"good": fake_server()}, daemon=DAEMON)
    d = Daemon(str(sock_dir / "daemon.sock"), str(config))
    async with running_daemon(d):
        yield d


async def test_tools_marks_what_the_settings_refuse_while_a_reload_waits(daemon: Daemon) -> None:
    config = Path(daemon.config_path)
    async with (
        raw_socket_client(daemon.sock_path) as client,
        raw_socket_client(daemon.sock_path) as admin,
        raw_socket_client(daemon.sock_path) as reloader,
    ):
        await raw_attach(client, [str(config)], "alpha")

        async def tools() -> dict[str, dict[str, Any]]:
            answer = await admin.request("mcpool/admin/tools", {"session": "alpha"})
            return {row["exposed"]: row for row in answer["result"]}

        async def policy() -> dict[str, Any]:
            (session,) = (await admin.request("mcpool/admin/sessions"))["result"]
            (good,) = [h for h in session["handles"] if h["server"] == "good"]
            return dict(good["policy"])

        first = await client.request("tools/list")  # answered once the first generation is up
        assert "good__echo" in [t["name"] for t in first["result"]["tools"]]
        before = await tools()
        assert before["good__echo"]["callable"] is True
        assert before["good__echo"]["refused"] is None
        # Narrow good's tools, and add a server that is slow to start: the reload waits for it.
        servers = {
            "good": {**fake_server(), "excludeTools": ["echo"]},
            "slow": fake_server(FAKE_STARTUP_DELAY=SLOW_START),
        }
        write_settings(config, servers, daemon=DAEMON)
        await reloader.send({"jsonrpc": "2.0", "id": 1, "method": "mcpool/admin/reload"})
        with trio.fail_after(STEP_TIMEOUT):
            await wait_until(lambda: _excludes_echo(policy))
        served = await client.request("tools/list")
        assert "good__echo" in [t["name"] for t in served["result"]["tools"]]  # still served
        during = await tools()
        assert set(during) == set(before)
        echo = during["good__echo"]
        assert echo["callable"] is False
        assert echo["refused"] == (
            "hidden by policy (excluded by excludeTools); still listed until the reload ends"
        )
        assert all(row["callable"] for name, row in during.items() if name != "good__echo")
        # What it says is what a call does.
        called = await client.request("tools/call", {"name": "good__echo", "arguments": {}})
        assert called["result"]["isError"] is True
        assert called["result"]["content"][0]["text"].startswith("Unknown tool: good__echo ")
        pid = await client.request("tools/call", {"name": "good__pid", "arguments": {}})
        assert "isError" not in pid["result"] or pid["result"]["isError"] is False
        only = await admin.request("mcpool/admin/tools", {"session": "alpha", "server": "good"})
        assert {row["server"] for row in only["result"]} == {"good"}
        assert [row["exposed"] for row in only["result"] if not row["callable"]] == ["good__echo"]


async def _excludes_echo(policy: Any) -> bool:
    return bool((await policy())["excludeTools"] == ["echo"])
