"""Issue 29 item 6: a page walk sees one list.

A cursor names the list it was cut from: a walk that goes on after the list changed is served
the rest of the list it began on (never a mix of two lists, never a skip), a new walk gets the
new list, and a cursor mcpool never issued to this session is refused with -32602 naming it.

Real processes: a daemon with `pageSize` 2, the fake upstream (whose `set_tools` changes its
list and sends list_changed), a raw socket session.
"""

from __future__ import annotations

import base64
from typing import Any

import trio

from e2e.harness import DaemonFactory, RawSocketClient, fake_server, write_settings
from e2e.test_startup import attach_raw, next_notification

STEP = 15.0  # bounds a hang
INITIAL = [f"a{n}" for n in range(1, 7)]


def names(page: dict[str, Any]) -> list[str]:
    return [t["name"].removeprefix("up__") for t in page["result"]["tools"]]


async def walk_from(client: RawSocketClient, cursor: str | None) -> list[str]:
    seen: list[str] = []
    while True:
        page = await client.request("tools/list", {"cursor": cursor} if cursor else {})
        seen += names(page)
        cursor = page["result"].get("nextCursor")
        if cursor is None:
            return seen


async def test_a_walk_across_a_list_change_sees_the_list_it_began_on(
    daemon_factory: DaemonFactory,
) -> None:
    d = await daemon_factory(daemon={"pageSize": 2})
    upstream = {**fake_server(), "includeTools": [*INITIAL, "b1", "set_tools"]}
    settings = write_settings(d.root / "s.json", {"up": upstream})
    async with d.raw() as client:
        await attach_raw(client, d, settings, "walker")
        with trio.fail_after(STEP):
            await client.request(
                "initialize",
                {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "walker", "version": "1"},
                },
            )
            await client.notify("notifications/initialized")
            reply = await client.request(
                "tools/call", {"name": "up__set_tools", "arguments": {"names": INITIAL}}
            )
            assert "result" in reply, reply
            await next_notification(client, "notifications/tools/list_changed")
            first = await client.request("tools/list", {})
            assert names(first) == ["set_tools", "a1"]
            # The list changes mid-walk: a1 goes, b1 comes.
            changed = ["a2", "a3", "a4", "a5", "a6", "b1"]
            await client.request(
                "tools/call", {"name": "up__set_tools", "arguments": {"names": changed}}
            )
            await next_notification(client, "notifications/tools/list_changed")
            rest = await walk_from(client, first["result"]["nextCursor"])
            # By offsets into the new list it was a3..a6, b1: a2 skipped, b1 from another list.
            assert rest == ["a2", "a3", "a4", "a5", "a6"], rest
            assert await walk_from(client, None) == ["set_tools", *changed]

            made_up = base64.urlsafe_b64encode(b"c:999999:2").decode()
            refused = await client.request("tools/list", {"cursor": made_up})
            theirs = (await client.request("tools/list", {}))["result"]["nextCursor"]
    assert refused["error"]["code"] == -32602, refused
    assert made_up in refused["error"]["data"]["reason"]
    assert "list again" in refused["error"]["data"]["reason"]

    # Another session, whose policy hides the a-tools, cannot read their list by a cursor.
    other = write_settings(d.root / "o.json", {"up": {**upstream, "excludeTools": INITIAL}})
    async with d.raw() as client:
        await attach_raw(client, d, other, "other")
        with trio.fail_after(STEP):
            await client.request(
                "initialize",
                {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "other", "version": "1"},
                },
            )
            stolen = await client.request("tools/list", {"cursor": theirs})
    assert stolen["error"]["code"] == -32602, stolen
    assert "not one of this session's lists" in stolen["error"]["data"]["reason"]
