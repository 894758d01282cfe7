"""Issue 27 item 5: the daemon owns its interning tables. It makes one `Interner`, hands it to
its pool, its settings and its sessions, and reports it in `status`; nothing a daemon's session
does reaches the tables a session made alone uses (`UNSHARED`).

The real `Daemon` in-process, real sockets, and a real stdio upstream (tools/fake_upstream.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from e2e.harness import fake_server, raw_socket_client
from e2e.in_process import running_daemon
from e2e.support import raw_attach

from mcpool.daemon._daemon import Daemon
from mcpool.session import UNSHARED

STEP_TIMEOUT = 20.0  # bounds a hang; a real upstream starts in well under a second


@pytest.fixture
async def daemon(sock_dir: Path, tmp_path: Path) -> AsyncIterator[Daemon]:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"mcpServers": {"fake": fake_server()}}))
    d = Daemon(str(sock_dir / "daemon.sock"), str(config))
    async with running_daemon(d):
        yield d


def _interned(stats: dict[str, dict[str, int]]) -> dict[str, int]:
    return {table: counts["interned"] for table, counts in stats.items()}


async def test_a_daemons_sessions_share_its_own_tables_and_status_reports_them(
    daemon: Daemon,
) -> None:
    unshared_before = _interned(UNSHARED.statistics())
    config = daemon.config_path
    async with (
        raw_socket_client(daemon.sock_path) as first,
        raw_socket_client(daemon.sock_path) as second,
    ):
        with trio.fail_after(STEP_TIMEOUT):
            await raw_attach(first, [config], "first")
            await raw_attach(second, [config], "second")
            listed = [await c.request("tools/list") for c in (first, second)]
            async with raw_socket_client(daemon.sock_path) as admin:
                status: dict[str, Any] = (await admin.request("mcpool/admin/status"))["result"]
    assert listed[0]["result"] == listed[1]["result"] and listed[0]["result"]["tools"]
    interner = status["caches"]["interner"]
    assert set(interner) == {
        "settings",
        "identities",
        "policies",
        "projections",
        "latest",
        "restricted",
        "aggregates",
        "canonical",
    }
    # Two sessions of one file: one policy key, one projection, one aggregate, held now.
    for table in ("settings", "identities", "policies", "projections", "aggregates"):
        assert interner[table]["entries"] >= 1, (table, interner)
    assert interner["policies"]["entries"] == 1
    assert interner["aggregates"]["entries"] == 1
    assert interner["canonical"]["bytes"] > 0
    # Nothing of it went to the tables of sessions made alone.
    assert _interned(UNSHARED.statistics()) == unshared_before
