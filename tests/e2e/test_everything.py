"""A real third-party server through the daemon: @modelcontextprotocol/server-everything, spoken to
by the real SDK client through `mcpool attach`. Progress (P3) reaches the calling session only."""

from __future__ import annotations

import re
import shutil
from typing import Any

import pytest
import trio

from .harness import DaemonFactory
from .support import call_text, raw_attach, servers_of, text_of

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
    progress: list[tuple[float, float | None]] = []
    all_progress = trio.Event()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        # The SDK runs each progress callback in a task of its own: count, don't assume order.
        progress.append((value, total))
        if len(progress) == STEPS:
            all_progress.set()

    # The bystander is a raw connection, so "nothing arrived before the ping's reply" is exact.
    async with daemon.attach([settings], "caller") as caller, daemon.raw() as bystander:
        await raw_attach(bystander, [str(settings)], "bystander")
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
            await all_progress.wait()
        assert not result.is_error, result
        assert "completed" in text_of(result).lower()

        # Any progress misrouted to the bystander was written before this reply.
        pong = await bystander.request("ping")
        assert pong.get("result") == {}, pong
        (entry,) = await servers_of(daemon)

    assert sorted(progress) == [(float(i), float(STEPS)) for i in range(1, STEPS + 1)]
    assert [m for m in bystander.backlog if m.get("method") == "notifications/progress"] == []
    assert len(entry["refs"]) == 2  # the bystander really shares the caller's upstream
