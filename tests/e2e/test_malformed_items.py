"""Malformed items an upstream lists are reported, never dropped without a word (issue 15, 8):
a tool with no name, a numeric name and a non-object item, served by the tests' own HTTP
upstream to a real daemon, show in `servers --json` (`notes`) and `daemonctl status`."""

from __future__ import annotations

import trio
from wire import SAY, WireServer

from e2e.harness import DaemonFactory, DaemonProcess
from e2e.support import wait_until

WAIT = 20.0  # a cold daemon, its first connection and discovery on a loaded machine


async def test_malformed_tools_are_named_in_servers_and_status(
    daemon_factory: DaemonFactory, nursery: trio.Nursery
) -> None:
    server = WireServer(tools=[SAY, {"description": "no name"}, {"name": 7}, ["x"]])
    await server.serve(nursery)
    d = await daemon_factory({"odd": {"type": "http", "url": server.url}})
    settings = d.settings_file("s.json", {"odd": {"type": "http", "url": server.url}})
    async with d.attach([settings], "t") as session:
        names = [t.name for t in (await session.list_tools()).tools]
        assert names == ["odd__say"]
        with trio.fail_after(WAIT):
            await wait_until(lambda: _has_notes(d))
        servers = await d.ctl("servers")
        notes = servers[0]["notes"]
        assert len(notes) == 1
        assert notes[0].startswith("tools/list: 3 malformed items left out: "), notes
        assert "item 2: an item with no name" in notes[0]
        assert "item 3: an item whose name is a number (7), not a string" in notes[0]
        assert "item 4: a non-object item (an array)" in notes[0]
        status = await d.ctl("status")
        assert f"server 'odd': {notes[0]}" in status["notes"], status["notes"]
    assert f"server 'odd': {notes[0]}" in d.output()


async def _has_notes(d: DaemonProcess) -> bool:
    servers = await d.ctl("servers")
    return bool(servers) and bool(servers[0].get("notes"))
