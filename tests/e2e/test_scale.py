"""Issue 17 end to end: many sessions come and go, and the daemon's answers stay those of a
daemon that only ever had the few that remain (refs, log levels, watched settings files), and a
stop with many sessions attached is a clean, bounded one.

Sizes are small enough for a shared CI machine; tools/bench/scale.py measures the costs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import trio

from .harness import DaemonFactory, RawSocketClient, attach_args, fake_server, write_settings
from .support import STEP_TIMEOUT, raw_attach

SESSIONS = 120
KEPT = 10
FILES = 4  # kept sessions are spread over this many project settings files
ONLY_LEAVING = 2  # and departing sessions over these too, which no kept session reads
# Attaching and closing this many sessions on a shared machine stays well under this.
BULK_TIMEOUT = 60.0


def project(root: Path, index: int, **policy: object) -> Path:
    return write_settings(
        root / f"project{index}" / ".mcp.json", {"fake": {**fake_server(), **policy}}
    )


async def test_bulk_detach_leaves_what_the_remaining_sessions_hold(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory({})
    files = [project(daemon.root, i) for i in range(FILES + ONLY_LEAVING)]
    async with contextlib.AsyncExitStack() as stack:
        clients: list[tuple[RawSocketClient, str, int]] = []
        with trio.fail_after(BULK_TIMEOUT):
            for n in range(SESSIONS):
                client = await stack.enter_async_context(daemon.raw())
                which = n % FILES if n < KEPT else n % (FILES + ONLY_LEAVING)
                sid = await raw_attach(client, [str(files[which])], f"s{n}")
                # Every departing session asks for debug; the kept ones for warning at most.
                level = "debug" if n >= KEPT else "warning"
                assert "result" in await client.request("logging/setLevel", {"level": level})
                clients.append((client, sid, which))
        kept, leaving = clients[:KEPT], clients[KEPT:]
        with trio.fail_after(BULK_TIMEOUT):
            async with trio.open_nursery() as nursery:
                for client, _, _ in leaving:
                    nursery.start_soon(client.aclose)
            # Until the daemon has seen every close: its session list is the kept ones.
            while len(sessions := await daemon.ctl("sessions")) != KEPT:
                await trio.sleep(0.05)
        assert sorted(s["id"] for s in sessions) == sorted(sid for _, sid, _ in kept)
        servers = await daemon.ctl("servers")
        refs = [r for e in servers if e["state"] == "active" for r in e["refs"]]
        assert sorted(refs) == sorted(sid for _, sid, _ in kept)
        # Files only departed sessions read are forgotten; the kept sessions' files are not.
        status = await daemon.ctl("status")
        assert {c["path"] for c in status["config"]} == {
            str(daemon.config_path),
            *(str(f) for f in files[:FILES]),
        }

        # The kept sessions still call, and their settings files are still watched: a change to
        # one of them reaches its sessions as a list_changed.
        for client, _, _ in kept:
            reply = await client.request(
                "tools/call", {"name": "fake__echo", "arguments": {"text": "hi"}}
            )
            assert "result" in reply, reply
        project(daemon.root, 0, includeTools=["echo"])
        watching = [c for c, _, which in kept if which == 0]
        with trio.fail_after(STEP_TIMEOUT):
            for client in watching:
                while True:
                    message = await client.receive()
                    if message.get("method") == "notifications/tools/list_changed":
                        break
            listed = await watching[0].request("tools/list")
        assert [t["name"] for t in listed["result"]["tools"]] == ["fake__echo"]


async def test_a_stop_with_many_sessions_closes_each_and_exits_cleanly(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory({"fake": fake_server()}, daemon={"shutdownTimeout": 10})
    settings = [str(daemon.config_path)]
    async with contextlib.AsyncExitStack() as stack:
        clients: list[RawSocketClient] = []
        with trio.fail_after(BULK_TIMEOUT):
            for n in range(SESSIONS * 2):
                client = await stack.enter_async_context(daemon.raw())
                await raw_attach(client, settings, f"s{n}", initialize=n % 2 == 0)
                clients.append(client)
        os.kill(daemon.pid, signal.SIGTERM)
        with trio.fail_after(BULK_TIMEOUT):
            for client in clients:
                client.receive_timeout = STEP_TIMEOUT
                while await client.receive_line() is not None:
                    pass  # every session's connection is closed by the daemon
            assert daemon.process is not None
            assert await daemon.process.wait() == 0, daemon.output()
    log = [json.loads(line) for line in daemon.log_path.read_text().splitlines() if line]
    assert not [r for r in log if "timed out" in r.get("msg", r.get("message", ""))], log[-5:]


async def _reap(proc: trio.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with trio.fail_after(STEP_TIMEOUT):
        await proc.wait()


# More bridges than the daemon closes per loop pass (daemon/_daemon.py DETACH_BATCH).
BRIDGES = 20


async def test_bridges_exiting_at_once_end_their_sessions_only(
    daemon_factory: DaemonFactory,
) -> None:
    """Handed-off sessions whose bridges all exit at once (an editor quitting) end, every one,
    while the client pipes stay open: the bridge's end is the session's end. The sessions on
    the socket keep being served."""
    daemon = await daemon_factory({"fake": fake_server()})
    settings = [str(daemon.config_path)]
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "bridge", "version": "0"},
        },
    }
    async with contextlib.AsyncExitStack() as stack:
        kept = [await stack.enter_async_context(daemon.raw()) for _ in range(KEPT)]
        for n, client in enumerate(kept):
            await raw_attach(client, settings, f"kept{n}")
        bridges: list[trio.Process] = []
        env = {**os.environ, **daemon.attach_env()}
        with trio.fail_after(BULK_TIMEOUT):
            for n in range(BRIDGES):
                proc = await trio.lowlevel.open_process(
                    [sys.executable, *attach_args(daemon.sock, settings, f"bridge{n}")],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env=env,
                    cwd=daemon.root,
                )
                stack.push_async_callback(_reap, proc)
                assert proc.stdin is not None
                assert proc.stdout is not None
                await proc.stdin.send_all(json.dumps(init).encode() + b"\n")
                answer = await proc.stdout.receive_some()
                assert b'"result"' in answer, answer
                bridges.append(proc)
            assert len(await daemon.ctl("sessions")) == KEPT + BRIDGES
            for proc in bridges:
                proc.send_signal(signal.SIGKILL)
            while len(sessions := await daemon.ctl("sessions")) != KEPT:
                await trio.sleep(0.05)
            assert {s["name"] for s in sessions} == {f"kept{n}" for n in range(KEPT)}
            # Each ended session's stdout is closed by the daemon: its client reads the end.
            for proc in bridges:
                assert proc.stdout is not None
                while await proc.stdout.receive_some():
                    pass
        for client in kept:
            reply = await client.request(
                "tools/call", {"name": "fake__echo", "arguments": {"text": "hi"}}
            )
            assert "result" in reply, reply
