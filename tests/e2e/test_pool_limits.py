"""Issue 12, the pool's part, end to end with a real daemon and real upstream processes:
a call to a stopped upstream times out (item 8), an edit storm leaves no process per edit
(item 10), a killed guardian is replaced (item 11), a crash-looped server comes back (item 12).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio
from mcp.shared.exceptions import MCPError

from e2e.harness import FAKE_UPSTREAM, DaemonProcess, fake_server, run_daemonctl, write_settings
from e2e.support import alive, process, raw_attach, raw_call, tool_names, wait_until

WAIT = 20.0  # any one step below: a spawn, a reload, a timeout of a few seconds, a group kill
UPSTREAM_TIMEOUT = -31003  # protocol/_errors.py
CALL_LIMIT_MS = 1500  # the stopped server's limit: short, so the test does not wait long
# The edit storm's drain grace: far longer than the storm's settling wait (STORM_SETTLE), so the
# processes left behind could only be gone in time by being closed at once.
STORM_DRAIN_GRACE = 300.0
STORM_SETTLE = 60.0
STORM_WRITES = 50
STORM_INTERVAL = 0.02  # 50 writes in about a second


def atomic_write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def fake_processes(d: DaemonProcess) -> list[psutil.Process]:
    """The daemon's live fake upstreams (its guardian and anything else are not counted)."""
    out = []
    for child in psutil.Process(d.pid).children(recursive=True):
        try:
            if str(FAKE_UPSTREAM) in " ".join(child.cmdline()) and alive(child):
                out.append(child)
        except psutil.NoSuchProcess:
            pass
    return out


def guardians(pid: int) -> list[int]:
    out = []
    for child in psutil.Process(pid).children():
        try:
            if any(part.endswith("_guardian.py") for part in child.cmdline()) and alive(child):
                out.append(child.pid)
        except psutil.NoSuchProcess:
            pass
    return out


async def log_lines(d: DaemonProcess, *args: str) -> list[str]:
    logs = await d.ctl("logs", *args)
    lines = logs["lines"]
    assert isinstance(lines, list)
    return [str(line) for line in lines]


# -- item 8 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("limit_from", ["entry", "daemon"])
async def test_a_call_to_a_stopped_upstream_times_out_naming_the_server_and_is_cancelled(
    daemon_factory: Any, limit_from: str
) -> None:
    if limit_from == "entry":
        d = await daemon_factory()
        entry = {**fake_server(), "timeout": CALL_LIMIT_MS}
    else:
        d = await daemon_factory(daemon={"requestTimeout": CALL_LIMIT_MS / 1000})
        entry = fake_server()
    settings = write_settings(d.root / "s.json", {"stuck": entry})
    async with d.attach([settings], "t") as session:
        pid = (await session.call_tool("stuck__pid", {})).structured_content["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            with trio.fail_after(WAIT):
                try:
                    await session.call_tool("stuck__echo", {"text": "hello"})
                except MCPError as exc:
                    error = exc.error
                else:
                    raise AssertionError("a call to a stopped server returned")
        finally:
            os.kill(pid, signal.SIGCONT)
        assert error.code == UPSTREAM_TIMEOUT, error
        assert "'stuck'" in error.message and "1.5 s" in error.message, error
        assert isinstance(error.data, dict)
        assert error.data["server"] == "stuck" and error.data["timeout"] == 1.5, error.data
        # Running again, it reads the cancel that waited in its stdin (and its late answer to
        # the cancelled call is dropped): the next call is answered normally.
        with trio.fail_after(WAIT):
            await wait_until(
                lambda: _logged(d, "stuck", "fake-upstream: cancelled request", "1.5 s")
            )
        echoed = await session.call_tool("stuck__echo", {"text": "again"})
        assert not echoed.is_error and echoed.content[0].text == "again"  # type: ignore[union-attr]


async def _logged(d: DaemonProcess, server: str | None, *needles: str) -> bool:
    """Whether a line of that server's stderr (None: of the daemon's log) has every needle."""
    args = (server,) if server else ()
    lines = await log_lines(d, *args, "-n", "2000")
    return any(all(n in line for n in needles) for line in lines)


# -- item 10 -----------------------------------------------------------------------------------


async def test_fifty_transport_edits_in_a_second_leave_at_most_two_upstream_processes(
    daemon_factory: Any, tmp_path: Path
) -> None:
    d = await daemon_factory(daemon={"drainGrace": STORM_DRAIN_GRACE})
    spawn_log = tmp_path / "spawns"
    entry = fake_server(FAKE_SPAWN_LOG=str(spawn_log))

    def edit(n: int) -> dict[str, Any]:
        return {"mcpServers": {"fake": {**entry, "args": [*entry["args"], f"--edit={n}"]}}}

    settings = write_settings(d.root / "s.json", edit(0)["mcpServers"])
    async with d.attach([settings], "storm") as session:
        assert "fake__echo" in await tool_names(session)
        for n in range(1, STORM_WRITES + 1):
            atomic_write(settings, edit(n))
            await trio.sleep(STORM_INTERVAL)
        with trio.fail_after(STORM_SETTLE):
            await wait_until(lambda: _serving_edit(d, STORM_WRITES))
            await wait_until(lambda: len(fake_processes(d)) <= 2)
        spawns = spawn_log.read_text().split()
        print(f"{len(spawns)} processes started for {STORM_WRITES} edits")
        assert len(spawns) >= 3, spawns  # the storm did start a process per applied edit
        servers = await d.ctl("servers")
        assert len([s for s in servers if s["pid"] is not None]) <= 2, servers
        assert "fake__echo" in await tool_names(session)


async def _serving_edit(d: DaemonProcess, n: int) -> bool:
    for server in await d.ctl("servers"):
        args = (server.get("transport_detail") or {}).get("args") or []
        if server["state"] == "active" and f"--edit={n}" in args and server["refs"]:
            return True
    return False


# -- item 11 -----------------------------------------------------------------------------------


async def test_a_killed_guardian_is_replaced_and_upstreams_still_die_with_the_daemon(
    daemon_factory: Any,
) -> None:
    d = await daemon_factory()
    # The upstream ignores stdin EOF: only the guardian kills it when the daemon is SIGKILLed.
    settings = write_settings(d.root / "s.json", {"fake": fake_server(FAKE_IGNORE_STDIN_EOF=1)})
    async with d.raw() as client:
        await raw_attach(client, [str(settings)], "g")
        reply = await raw_call(client, "fake__pid", {})
        upstream = process(reply["result"]["structuredContent"]["pid"])
        [first] = guardians(d.pid)
        os.kill(first, signal.SIGKILL)
        with trio.fail_after(WAIT):
            await wait_until(lambda: bool(guardians(d.pid)) and guardians(d.pid) != [first])
            await wait_until(lambda: _logged(d, None, f"guardian process {first} exited"))
        assert alive(upstream)
        os.kill(d.pid, signal.SIGKILL)
        with trio.fail_after(WAIT):
            await wait_until(lambda: not alive(upstream))


# -- item 12 -----------------------------------------------------------------------------------


async def test_a_crash_looped_server_comes_back_when_a_session_attaches_after_it_was_fixed(
    daemon_factory: Any, tmp_path: Path
) -> None:
    d = await daemon_factory(daemon={"backoffInitial": 0.01, "backoffMax": 0.02})
    script = tmp_path / "server.sh"
    script.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    script.chmod(0o755)
    settings = write_settings(d.root / "s.json", {"flaky": {"command": str(script)}})
    async with d.attach([settings], "first"):
        with trio.fail_after(WAIT):
            await wait_until(lambda: _state_is(d, "crash-loop"))
        [server] = await d.ctl("servers")
        assert isinstance(server["retry_at"], float), server  # the cooldown retry is due then
        table = (await run_daemonctl(d.sock, "servers")).stdout.decode()
        assert "crash-loop (retry in" in table, table
        # Fixed on disk, same settings: the next session to attach brings it back, and sees
        # its tools at once.
        script.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_UPSTREAM}\n")
        async with d.attach([settings], "second") as second:
            assert "flaky__echo" in await tool_names(second)
        [server] = await d.ctl("servers")
        assert server["state"] == "active" and server["retry_at"] is None, server


async def _state_is(d: DaemonProcess, state: str) -> bool:
    servers = await d.ctl("servers")
    return bool(servers) and servers[0]["state"] == state
