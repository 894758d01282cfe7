"""Issue 14 end to end (L6): tools at once, with real daemon and upstream processes.

A server that never answers its handshake holds no session hostage; one that answers after a
few seconds arrives by list_changed; `"start": "always"` runs before any session and outlives the
drain grace; `"start": "lazy"` is listed from its last discovery without a process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from e2e.harness import (
    DaemonProcess,
    RawSocketClient,
    fake_server,
    run_daemonctl,
    write_settings,
)

# Well under the never-answering server's 30 s start timeout: an initialize or first list that
# waited for it would miss this.
AT_ONCE = 10.0
WAIT = 20.0  # a late server (4 s) arrives within this
INIT = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "raw", "version": "1"},
}


async def attach_raw(client: RawSocketClient, d: DaemonProcess, settings: Path, name: str) -> str:
    reply = await client.request(
        "mcpool/attach", {"sources": [str(settings)], "cwd": str(d.root), "name": name}
    )
    assert "result" in reply, reply
    return str(reply["result"]["session"])


async def next_notification(client: RawSocketClient, method: str) -> dict[str, Any]:
    with trio.fail_after(WAIT):
        while True:
            for i, msg in enumerate(client.backlog):
                if msg.get("method") == method:
                    return client.backlog.pop(i)
            client.backlog.append(await client.receive())


def tool_names(reply: dict[str, Any]) -> set[str]:
    return {t["name"] for t in reply["result"]["tools"]}


def spawns(log: Path) -> int:
    return len(log.read_text().split()) if log.exists() else 0


async def test_a_hung_server_holds_no_session_hostage_and_a_late_one_arrives_by_list_changed(
    daemon_factory,
):
    d = await daemon_factory(daemon={"startupBudget": 1.0})
    settings = write_settings(
        d.root / "s.json",
        {
            "fast": fake_server(FAKE_TOOLS="quick"),
            "hung": fake_server(FAKE_STARTUP_DELAY=3600, FAKE_TOOLS="never"),
            "late": fake_server(FAKE_STARTUP_DELAY=4, FAKE_TOOLS="tardy"),
        },
    )
    async with d.raw() as client:
        session = await attach_raw(client, d, settings, "client")
        with trio.fail_after(AT_ONCE):
            init = await client.request("initialize", INIT)
            caps = init["result"]["capabilities"]
            assert caps["tools"]["listChanged"] is True
            assert caps["prompts"]["listChanged"] is True
            assert caps["resources"]["listChanged"] is True
            await client.notify("notifications/initialized")
            first = tool_names(await client.request("tools/list"))
        assert "fast__quick" in first
        assert not [n for n in first if n.startswith(("hung__", "late__"))]

        # Still starting: named by daemonctl, never silently absent.
        status = await d.ctl("status")
        not_up = {item["server"]: item for item in status["not_up"]}
        assert not_up["hung"]["state"] == "spawning"
        assert session in not_up["hung"]["sessions"]
        servers = {s["name"]: s for s in await d.ctl("servers")}
        assert servers["hung"]["state"] == "spawning"
        assert servers["fast"]["state"] == "active"
        table = (await run_daemonctl(d.sock, "status", env=d.env)).stdout.decode()
        assert "SERVER NOT UP" in table and "hung" in table

        await next_notification(client, "notifications/tools/list_changed")
        later = tool_names(await client.request("tools/list"))
        assert {"fast__quick", "late__tardy"} <= later
        assert not [n for n in later if n.startswith("hung__")]
        reply = await client.request("tools/call", {"name": "late__tardy", "arguments": {}})
        assert reply["result"]["content"][0]["text"] == "tardy"
    log = d.log_path.read_text()
    assert "'hung' is still starting" in log


async def test_always_runs_before_any_session_and_survives_the_drain_grace(
    daemon_factory, tmp_path
):
    spawn_log = tmp_path / "keep.spawns"
    d = await daemon_factory(
        {"keep": {**fake_server(FAKE_SPAWN_LOG=spawn_log), "start": "always"}},
        daemon={"drainGrace": 0.5},
    )
    with trio.fail_after(WAIT):
        while True:
            servers = {s["name"]: s for s in await d.ctl("servers")}
            if servers.get("keep", {}).get("state") == "active":
                break
            await trio.sleep(0.05)
    assert (await d.ctl("status"))["sessions"] == 0
    pid = servers["keep"]["pid"]
    assert servers["keep"]["refs"] == ["daemon"]
    await trio.sleep(1.5)  # three drain graces with no session at all
    servers = {s["name"]: s for s in await d.ctl("servers")}
    assert servers["keep"]["state"] == "active"
    assert servers["keep"]["pid"] == pid
    # A session attaching shares the running process: no second start.
    async with d.attach([d.config_path], "user") as session:
        listed = await session.list_tools()
        assert "keep__echo" in [t.name for t in listed.tools]
    assert spawns(spawn_log) == 1


async def test_lazy_lists_from_its_last_discovery_and_the_first_call_starts_it(
    daemon_factory, tmp_path
):
    spawn_log = tmp_path / "lazy.spawns"
    d = await daemon_factory(daemon={"drainGrace": 0.5})
    settings = write_settings(
        d.root / "s.json", {"lz": {**fake_server(FAKE_SPAWN_LOG=spawn_log), "start": "lazy"}}
    )
    # Never seen: started once to learn its lists, then it drains.
    async with d.attach([settings], "learner") as session:
        assert "lz__echo" in [t.name for t in (await session.list_tools()).tools]
    assert spawns(spawn_log) == 1
    with trio.fail_after(WAIT):
        while any(s.get("name") == "lz" for s in await d.ctl("servers")):
            await trio.sleep(0.05)

    async with d.attach([settings], "lister") as session:
        assert "lz__echo" in [t.name for t in (await session.list_tools()).tools]
        servers = {s["name"]: s for s in await d.ctl("servers")}
        assert servers["lz"]["state"] == "standby"
        assert servers["lz"]["pid"] is None
        assert spawns(spawn_log) == 1  # listing never started it
        with trio.fail_after(WAIT):
            result = await session.call_tool("lz__echo", {"text": "woken"})
        assert result.content[0].text == "woken"  # type: ignore[union-attr]
        assert spawns(spawn_log) == 2


async def test_prewarm_starts_the_user_files_servers_before_any_session(daemon_factory, tmp_path):
    spawn_log = tmp_path / "warm.spawns"
    d = await daemon_factory(
        {"warm": fake_server(FAKE_SPAWN_LOG=spawn_log)}, daemon={"prewarm": True}
    )
    with trio.fail_after(WAIT):
        while True:
            servers = {s["name"]: s for s in await d.ctl("servers")}
            if servers.get("warm", {}).get("pid") is not None:
                break
            await trio.sleep(0.05)
    assert (await d.ctl("status"))["sessions"] == 0
    async with d.attach([d.config_path], "user") as session:
        assert "warm__echo" in [t.name for t in (await session.list_tools()).tools]
    assert spawns(spawn_log) == 1  # the session took the prewarmed process


async def test_a_reload_that_makes_a_server_always_starts_it_and_one_that_unmakes_it_lets_it_drain(
    daemon_factory,
):
    d = await daemon_factory({"keep": fake_server()}, daemon={"drainGrace": 0.5})
    assert await d.ctl("servers") == []  # eager: nothing runs without a session
    d.write_config({"keep": {**fake_server(), "start": "always"}}, daemon={"drainGrace": 0.5})
    with trio.fail_after(WAIT):
        while not [s for s in await d.ctl("servers") if s.get("state") == "active"]:
            await trio.sleep(0.05)
    d.write_config({"keep": fake_server()}, daemon={"drainGrace": 0.5})
    with trio.fail_after(WAIT):
        while await d.ctl("servers"):
            await trio.sleep(0.05)
