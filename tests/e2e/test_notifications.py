"""Issue 4 integration: list_changed over real sockets, with real and fake upstreams."""

from __future__ import annotations

import socket
from typing import Any

import trio

from e2e.harness import DaemonProcess, RawSocketClient, fake_server, write_settings

WAIT = 15.0
INIT = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "raw", "version": "1"},
}


async def attach_raw(client: RawSocketClient, d: DaemonProcess, settings: Any, name: str) -> str:
    reply = await client.request(
        "mcpool/attach", {"sources": [str(settings)], "cwd": str(d.root), "name": name}
    )
    assert "result" in reply, reply
    return str(reply["result"]["session"])


async def handshake(client: RawSocketClient) -> None:
    reply = await client.request("initialize", INIT)
    assert reply["result"]["capabilities"]["tools"]["listChanged"] is True
    await client.notify("notifications/initialized")


async def next_notification(client: RawSocketClient, method: str) -> dict[str, Any]:
    with trio.fail_after(WAIT):
        while True:
            for i, msg in enumerate(client.backlog):
                if msg.get("method") == method:
                    return client.backlog.pop(i)
            client.backlog.append(await client.receive())


async def test_blocked_session_does_not_delay_another_session_and_is_disconnected(daemon_factory):
    # A small outgoing buffer so the stuck session reaches its limit quickly.
    d = await daemon_factory(daemon={"sessionBufferBytes": 256 * 1024})
    settings = write_settings(d.root / "s.json", {"fake": fake_server(FAKE_TOOL_COUNT=200)})
    async with d.raw() as stuck, d.raw() as live:
        stuck_id = await attach_raw(stuck, d, settings, "stuck")
        await attach_raw(live, d, settings, "live")
        await handshake(stuck)
        await handshake(live)
        # The stuck client asks for big lists and never reads: its socket fills up.
        stuck.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        listing = b'{"jsonrpc":"2.0","id":7,"method":"tools/list"}\n'
        for _ in range(20):
            await stuck.send_raw(listing)
        # The live session changes the shared upstream's tools and is told at once.
        reply = await live.request(
            "tools/call", {"name": "fake__set_tools", "arguments": {"names": ["fresh"]}}
        )
        assert "result" in reply, reply
        note = await next_notification(live, "notifications/tools/list_changed")
        assert note == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
        listed = await live.request("tools/list")
        assert "fake__fresh" in [t["name"] for t in listed["result"]["tools"]]
        # Keep the stuck one asking until the daemon gives up on it.
        with trio.fail_after(WAIT):
            while True:
                sessions = await d.ctl("sessions")
                if stuck_id not in [s["id"] for s in sessions]:
                    break
                try:
                    for _ in range(20):
                        await stuck.send_raw(listing)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                await trio.sleep(0.05)
        # Everyone else carries on.
        reply = await live.request(
            "tools/call", {"name": "fake__echo", "arguments": {"text": "ok"}}
        )
        assert reply["result"]["content"][0]["text"] == "ok"


async def test_no_list_changed_before_initialized_and_none_queued(daemon_factory):
    d = await daemon_factory()
    settings = write_settings(d.root / "s.json", {"fake": fake_server()})
    async with d.raw() as early, d.raw() as other:
        await attach_raw(early, d, settings, "early")
        await attach_raw(other, d, settings, "other")
        await handshake(other)
        # `early` answered initialize but never sent initialized: changes now are not for it.
        reply = await early.request("initialize", INIT)
        assert "result" in reply
        reply = await other.request(
            "tools/call", {"name": "fake__set_tools", "arguments": {"names": ["one"]}}
        )
        await next_notification(other, "notifications/tools/list_changed")
        await early.notify("notifications/initialized")
        # A ping round trip: anything queued for `early` would arrive before its answer.
        pong = await early.request("ping")
        assert pong["result"] == {}
        assert [m for m in early.backlog if "list_changed" in str(m.get("method"))] == []
        # After initialized, a real change does reach it, exactly once.
        await other.request(
            "tools/call", {"name": "fake__set_tools", "arguments": {"names": ["two"]}}
        )
        await next_notification(early, "notifications/tools/list_changed")
        await early.request("ping")
        assert [m for m in early.backlog if "list_changed" in str(m.get("method"))] == []


async def test_real_server_resource_list_change_reaches_only_sessions_of_that_entry(
    daemon_factory, peers
):
    d = await daemon_factory()
    everything = {"command": "node", "args": [peers["PEER_EVERYTHING_JS"], "stdio"]}
    with_everything = write_settings(d.root / "e.json", {"everything": everything})
    only_fake = write_settings(d.root / "f.json", {"fake": fake_server()})
    async with d.raw() as caller, d.raw() as watcher, d.raw() as bystander:
        await attach_raw(caller, d, with_everything, "caller")
        await attach_raw(watcher, d, with_everything, "watcher")
        await attach_raw(bystander, d, only_fake, "bystander")
        for c in (caller, watcher, bystander):
            caller.receive_timeout = watcher.receive_timeout = 30
            await handshake(c)
        before = await watcher.request("resources/list")
        reply = await caller.request(
            "tools/call",
            {
                "name": "everything__gzip-file-as-resource",
                "arguments": {
                    "name": "hello.gz",
                    "data": "data:text/plain;base64,aGVsbG8gd29ybGQ=",
                    "outputType": "resourceLink",
                },
            },
        )
        assert "result" in reply and not reply["result"].get("isError"), reply
        await next_notification(caller, "notifications/resources/list_changed")
        await next_notification(watcher, "notifications/resources/list_changed")
        after = await watcher.request("resources/list")
        assert len(after["result"]["resources"]) == len(before["result"]["resources"]) + 1
        # server-everything's own tools/list_changed right after initialize changed nothing.
        await caller.request("ping")
        assert not [
            m for m in caller.backlog if m.get("method") == "notifications/tools/list_changed"
        ]
        await bystander.request("ping")
        assert not [m for m in bystander.backlog if "list_changed" in str(m.get("method"))]
