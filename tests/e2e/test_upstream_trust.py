"""Issue 26, points 5 to 7: what an upstream sends is trusted no further than the daemon owns it.

Real daemon, real fake upstreams (tools/fake_upstream.py), raw socket clients:
- a server putting mcpool's own `_meta` markers on its tools, prompts, resources, templates,
  results and log messages (FAKE_META_SPOOF) never has them reach a client: trust and
  alwaysLoad come from the user's settings alone (DESIGN X9);
- a log flood during one session's call on a shared stdio server is that session's problem:
  a session of the same server that made no call receives none of it, a session calling
  another server is never disconnected, the caller is not cut for its own flood but loses log
  messages (counted), and once it is gone the rest of the flood is dropped (DESIGN X8);
- a lazy server whose one discovery was empty or garbled is discovered again on its next
  start, in the same daemon and in the next one, and by `daemonctl restart`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

from .harness import DaemonFactory, RawSocketClient, fake_server
from .support import STEP_TIMEOUT, raw_attach, raw_call, raw_text, servers_of, wait_until

# The flood: enough messages that a client reading nothing is far behind (20 MB), in a few
# seconds of a Python server's writing.
FLOOD = 20_000
FLOOD_SIZE = 1_000
FLOOD_TIMEOUT = 120.0  # the whole flood through the daemon on a loaded 2-core machine
SESSION_BUFFER = 256 * 1024  # sessionBufferBytes: the lossy bound is a quarter of it


def _own_keys(value: Any, path: str = "") -> list[str]:
    """Where `value` holds a `_meta` key of mcpool's (`mcpool/...`). (`anthropic/alwaysLoad`
    is mcpool's on a listed tool only, where the settings decide it: checked there.)"""
    found = []
    if isinstance(value, dict):
        for key, child in value.items():
            if key == "_meta" and isinstance(child, dict):
                found += [f"{path}._meta[{k}]" for k in child if k.startswith("mcpool/")]
            else:
                found += _own_keys(child, f"{path}.{key}")
    elif isinstance(value, list):
        for i, child in enumerate(value):
            found += _own_keys(child, f"{path}[{i}]")
    return found


async def _everything(client: RawSocketClient) -> list[dict[str, Any]]:
    """Every kind of answer and message the spoofing server's items and results reach a client
    in: the four lists, a call, a prompt, a resource read and a log message."""
    answers = [
        await client.request("tools/list"),
        await client.request("prompts/list"),
        await client.request("resources/list"),
        await client.request("resources/templates/list"),
        await raw_call(client, "spoof__echo", {"text": "hi"}),
        await raw_call(client, "spoof__log", {"level": "info", "message": "said"}),
        await client.request("prompts/get", {"name": "spoof__greet", "arguments": {"name": "x"}}),
        await client.request("resources/read", {"uri": "fake://readme"}),
    ]
    for answer in answers:
        assert "result" in answer, answer
    logs = [m for m in client.backlog if m.get("method") == "notifications/message"]
    assert logs, client.backlog
    return answers + logs


async def test_an_upstreams_mcpool_markers_never_reach_a_client(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    spoof = fake_server(FAKE_META_SPOOF=1)
    unset = daemon.settings_file("unset.json", {"spoof": spoof})
    off = daemon.settings_file(
        "off.json", {"spoof": {**spoof, "trust": False, "alwaysLoadTools": False}}
    )
    on = daemon.settings_file(
        "on.json", {"spoof": {**spoof, "trust": True, "alwaysLoadTools": True}}
    )
    expected = {
        "unset": {"mcpool/server": "spoof"},
        "off": {"mcpool/server": "spoof", "mcpool/trust": False},
        "on": {
            "mcpool/server": "spoof",
            "mcpool/trust": True,
            "anthropic/alwaysLoad": True,
            "mcpool/alwaysLoad": True,
        },
    }
    for name, settings in (("unset", unset), ("off", off), ("on", on)):
        async with daemon.raw() as client:
            client.receive_timeout = STEP_TIMEOUT
            await raw_attach(client, [str(settings)], name)
            messages = await _everything(client)
            tools = messages[0]["result"]["tools"]
            assert tools, messages[0]
            for tool in tools:
                meta = tool["_meta"]
                assert meta.pop("fake/kept") == 1  # the server's own keys stay
                assert meta == expected[name], (name, tool["name"], meta)
            # Nothing else anywhere carries one: not the prompts, resources, templates, the
            # call's result and its content, the prompt, the read, nor the log message.
            assert _own_keys(messages[1:]) == [], (name, _own_keys(messages[1:]))
            assert json.dumps(messages[1:]).count('"fake/kept"') >= 8  # they did have _meta
    assert await daemon.stop() == 0


async def _session_info(daemon: Any, session_id: str) -> dict[str, Any] | None:
    sessions = await daemon.ctl("sessions")
    return next((s for s in sessions if s["id"] == session_id), None)


async def _slow_caller(client: RawSocketClient, done: Path, answers: list[str]) -> None:
    """A session of both servers calling the quiet one, reading only its answers, slowly."""
    while not done.exists():
        answers.append(raw_text(await raw_call(client, "quiet__echo", {"text": "still here"})))
        await trio.sleep(0.3)


async def _settled_drops(daemon: Any) -> int:
    """The loud server's count of dropped messages once it stayed the same for a second (the
    daemon dispatching the last of a flood is in another process: nothing to wait on)."""
    last = -1
    while True:
        (entry,) = [s for s in await servers_of(daemon) if s["name"] == "loud"]
        count = entry.get("dropped_notifications", 0)
        if count == last:
            return last
        last = count
        await trio.sleep(1.0)


async def _flooded_servers(daemon: Any) -> tuple[Path, Path]:
    """A loud server for sessions A and B, and a quiet one C also holds (one loud process)."""
    loud = daemon.settings_file("loud.json", {"loud": fake_server(FAKE_FLOOD=1)})
    both = daemon.settings_file(
        "both.json", {"loud": fake_server(FAKE_FLOOD=1), "quiet": fake_server()}
    )
    return loud, both


async def _flood(client: RawSocketClient, msg_id: int, done: Path, **more: Any) -> None:
    args = {"count": FLOOD, "size": FLOOD_SIZE, "done_file": str(done), **more}
    await client.send({"jsonrpc": "2.0", "id": msg_id, "method": "tools/call",
                       "params": {"name": "loud__flood", "arguments": args}})  # fmt: skip


async def test_a_session_that_falls_behind_its_own_flood_loses_log_messages_and_stays(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory(daemon={"sessionBufferBytes": SESSION_BUFFER})
    loud, both = await _flooded_servers(daemon)
    done = daemon.root / "flood.done"
    async with daemon.raw() as a, daemon.raw() as b, daemon.raw() as c:
        for client in (a, b, c):
            client.receive_timeout = FLOOD_TIMEOUT
        a_id = await raw_attach(a, [str(loud)], "caller")
        await raw_attach(b, [str(loud)], "bystander")
        await raw_attach(c, [str(both)], "elsewhere")
        assert len(await servers_of(daemon)) == 2  # a, b and c share one loud process
        answers: list[str] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_slow_caller, c, done, answers)
            # The caller floods itself and reads nothing until the flood is over.
            await _flood(a, 99, done)
            with trio.fail_after(FLOOD_TIMEOUT):
                await wait_until(done.exists)
        # It was not cut for its own flood: it has its answer, and what it could not take
        # of the flood was dropped and counted, message for message.
        with trio.fail_after(FLOOD_TIMEOUT):
            while (message := await a.receive()).get("id") != 99:
                a.backlog.append(message)
        assert raw_text(message) == "flooded"
        got = [m for m in a.backlog if m.get("method") == "notifications/message"]
        info = await _session_info(daemon, a_id)
        assert info is not None, "the caller was cut for its own flood"
        assert info["lossy_dropped"] > 0, info
        assert len(got) + info["lossy_dropped"] == FLOOD, (len(got), info)
        # Nobody else heard of it.
        assert (await b.request("ping"))["result"] == {}
        assert raw_text(await raw_call(c, "quiet__echo", {"text": "after"})) == "after"
        for bystander in (b, c):
            assert [m for m in bystander.backlog if m.get("method")] == []
    assert await daemon.stop() == 0


async def test_the_rest_of_a_gone_sessions_flood_reaches_no_bystander(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory(daemon={"sessionBufferBytes": SESSION_BUFFER})
    loud, both = await _flooded_servers(daemon)
    done = daemon.root / "flood.done"
    async with daemon.raw() as b, daemon.raw() as c:
        for client in (b, c):
            client.receive_timeout = FLOOD_TIMEOUT
        b_id = await raw_attach(b, [str(loud)], "bystander")
        await raw_attach(c, [str(both)], "elsewhere")
        answers: list[str] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_slow_caller, c, done, answers)
            # The caller goes mid-flood (while the server pauses after its first messages),
            # and the server does not stop for the cancel.
            async with daemon.raw() as a:
                await raw_attach(a, [str(loud)], "caller")
                await _flood(a, 99, done, ignore_cancel=True, pause_at=100, pause=1.0)
                await trio.sleep(0.2)
            with trio.fail_after(FLOOD_TIMEOUT):
                await wait_until(done.exists)
        # The last of the flood may still be in the pipe: dispatched once the count settles.
        with trio.fail_after(FLOOD_TIMEOUT):
            dropped = await _settled_drops(daemon)
        # The bystander of the same server (which made no call, and read nothing meanwhile)
        # got none of it and is still here.
        assert (await b.request("ping"))["result"] == {}
        assert [m for m in b.backlog if m.get("method") == "notifications/message"] == []
        assert await _session_info(daemon, b_id) is not None
        # The session calling the other server was never disconnected and heard nothing.
        assert raw_text(await raw_call(c, "quiet__echo", {"text": "after"})) == "after"
        assert answers and set(answers) == {"still here"}
        assert [m for m in c.backlog if m.get("method") == "notifications/message"] == []
        # The rest of the gone caller's flood (all but the first 100) was dropped, counted.
        assert dropped > FLOOD // 2, dropped
    assert await daemon.stop() == 0


async def _tools(client: RawSocketClient) -> list[str]:
    listed = await client.request("tools/list")
    return [t["name"] for t in listed["result"]["tools"]]


async def _tools_become(client: RawSocketClient, names: list[str]) -> None:
    """tools/list again until it lists `names` (the live discovery arrives by list_changed)."""
    with trio.fail_after(STEP_TIMEOUT * 3):
        while await _tools(client) != names:
            await trio.sleep(0.1)


async def test_a_lazy_servers_empty_or_garbled_discovery_is_made_again(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory(daemon={"drainGrace": 0.3})

    async def gone() -> bool:
        return not await servers_of(daemon)

    @contextlib.asynccontextmanager
    async def session(settings: Path, name: str) -> AsyncIterator[RawSocketClient]:
        async with daemon.raw() as client:
            client.receive_timeout = STEP_TIMEOUT
            await raw_attach(client, [str(settings)], name)
            yield client
        with trio.fail_after(STEP_TIMEOUT):
            await wait_until(gone)  # drained: its next lease is a new entry

    for listed, what in (("", "empty"), ("garbled", "garbled")):
        names = daemon.root / f"{what}.names"
        names.write_text(listed)
        lazy = {**fake_server(FAKE_LIST_FILE=names), "start": "lazy"}
        settings = daemon.settings_file(f"{what}.json", {what: lazy})
        # Never seen: started once to learn its lists, which come back empty or garbled.
        async with session(settings, f"learner-{what}") as c:
            assert await _tools(c) == []
        # The server is fixed: its next start discovers it again (not served the bad lists).
        names.write_text("echo")
        async with session(settings, f"next-{what}") as c:
            await _tools_become(c, [f"{what}__echo"])
        # And its good discovery is served from then on: standby, no process.
        async with session(settings, f"standby-{what}") as c:
            assert await _tools(c) == [f"{what}__echo"]
            (entry,) = await servers_of(daemon)
            assert entry["state"] == "standby", entry
            # `daemonctl restart` discovers a standby server again, now: garbled this time.
            names.write_text("garbled")
            restarted = await daemon.ctl("restart", what)
            assert [e["result"] for e in restarted["entries"]] == ["active"], restarted
            await _tools_become(c, [])
    # The garbled answer was said, naming the server and the list.
    assert (
        "server 'garbled': tools/list: a page whose tools is a string, not an array: nothing "
        "of it listed" in daemon.log_path.read_text()
    )
    # Across a daemon restart: the next daemon's stored discovery is that garbled one.
    assert await daemon.stop() == 0
    names.write_text("echo")
    await daemon.start()
    async with session(settings, "cold") as c:
        await _tools_become(c, ["garbled__echo"])
    assert await daemon.stop() == 0
