"""Sharing: sessions with the same transport identity share one upstream process (I1, L1),
policy-only differences share it with different projections, transport differences do not."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import trio
from mcp import ClientSession

from .harness import DaemonFactory, fake_server

# One MCP round trip through bridge, daemon and fake upstream: milliseconds; bounds a hang.
STEP_TIMEOUT = 10.0


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def call_text(session: ClientSession, tool: str, args: dict[str, Any] | None = None) -> str:
    with trio.fail_after(STEP_TIMEOUT):
        result = await session.call_tool(tool, args or {})
    assert not result.is_error, result
    return text_of(result)


async def test_two_sessions_with_the_same_settings_share_one_upstream(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    settings = daemon.settings_file("settings.json", {"fake": fake_server()})
    async with daemon.attach([settings], "one") as one, daemon.attach([settings], "two") as two:
        pid_one = await call_text(one, "fake__pid")
        pid_two = await call_text(two, "fake__pid")
        servers = await daemon.ctl("servers")
        sessions = await daemon.ctl("sessions")
    assert pid_one == pid_two
    assert len(servers) == 1, servers
    (entry,) = servers
    assert entry["name"] == "fake"
    assert entry["pid"] == int(pid_one)
    assert sorted(entry["refs"]) == sorted(s["id"] for s in sessions)
    assert len(entry["refs"]) == 2
