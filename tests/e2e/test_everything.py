"""A real third-party server through the daemon: @modelcontextprotocol/server-everything, spoken to
by the real SDK client through `mcpool attach`. Progress (P3) reaches the calling session only."""

from __future__ import annotations

import re
import shutil
from typing import Any

import mcp_types as types
import pytest
import trio

from .harness import DaemonFactory
from .support import STEP_TIMEOUT, Inbox, call_text, servers_of, text_of

pytestmark = pytest.mark.peers

# A cold node start plus server-everything's module graph: about half a second; bounds a hang.
EVERYTHING_TIMEOUT = 20.0
LONG_RUNNING = re.compile(r"long.?running", re.IGNORECASE)
STEPS = 3


def everything_server(peers: dict[str, str]) -> dict[str, Any]:
    node = shutil.which("node") or peers.get("PEER_NODE22")
    assert node, "no node interpreter for server-everything"
    return {"command": node, "args": [peers["PEER_EVERYTHING_JS"], "stdio"]}


async def test_server_everything_lists_calls_and_sends_progress_to_the_caller_only(
    daemon_factory: DaemonFactory, peers: dict[str, str]
) -> None:
    daemon = await daemon_factory()
    settings = daemon.settings_file("settings.json", {"everything": everything_server(peers)})
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    caller_inbox, bystander_inbox = Inbox(), Inbox()
    async with (
        daemon.attach([settings], "caller", message_handler=caller_inbox) as caller,
        daemon.attach([settings], "bystander", message_handler=bystander_inbox) as bystander,
    ):
        with trio.fail_after(EVERYTHING_TIMEOUT):
            tools = (await caller.list_tools()).tools
        names = [tool.name for tool in tools]
        assert "everything__echo" in names, names
        long_running = [name for name in names if LONG_RUNNING.search(name)]
        assert len(long_running) == 1, names

        echoed = await call_text(caller, "everything__echo", {"message": "through mcpool"})
        assert "through mcpool" in echoed

        with trio.fail_after(EVERYTHING_TIMEOUT):
            result = await caller.call_tool(
                long_running[0],
                {"duration": 0.3, "steps": STEPS},
                progress_callback=on_progress,
            )
        assert not result.is_error, result
        assert "completed" in text_of(result).lower()

        # Everything the bystander could have been sent was written before this reply.
        with trio.fail_after(STEP_TIMEOUT):
            await bystander.send_ping()
        (entry,) = await servers_of(daemon)

    assert [(value, total) for value, total, _ in progress] == [
        (float(i), float(STEPS)) for i in range(1, STEPS + 1)
    ]
    assert bystander_inbox.of_type(types.ProgressNotification) == []
    assert len(entry["refs"]) == 2  # the bystander really shares the caller's upstream
