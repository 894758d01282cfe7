"""Issue 5 end to end: settings watching, upstream supervision, bounded shutdown.

Real daemon, real files written the way editors write them, real upstream processes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import trio
from mcp.shared.exceptions import MCPError

from e2e.harness import DaemonProcess, fake_server, write_settings
from e2e.support import alive, descendants, process, wait_until

WAIT = 20.0


class Recorder:
    def __init__(self) -> None:
        self.tools_changed = 0

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.tools_changed += 1


def atomic_write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def in_place_write(path: Path, data: dict[str, Any]) -> None:
    with open(path, "r+") as f:
        f.seek(0)
        f.write(json.dumps(data))
        f.truncate()


async def names(session: Any) -> set[str]:
    return {t.name for t in (await session.list_tools()).tools}


async def file_status(d: DaemonProcess, path: Path) -> dict[str, Any]:
    status = await d.ctl("status")
    for f in status["config"]:
        if f["path"] == str(path):
            return f
    raise AssertionError(f"{path} not in status: {status['config']}")


@pytest.mark.parametrize("writer", [atomic_write, in_place_write])
async def test_settings_writes_apply_without_a_reload_command(daemon_factory, writer):
    d = await daemon_factory()
    entry = fake_server()
    settings = write_settings(d.root / "s.json", {"fake": entry})
    async with d.attach([settings], "w") as session:
        assert "fake__echo" in await names(session)
        writer(settings, {"mcpServers": {"fake": {**entry, "excludeTools": ["echo"]}}})
        with trio.fail_after(WAIT):
            await wait_until(lambda: _lacks(session, "fake__echo"))


async def _lacks(session: Any, name: str) -> bool:
    return name not in await names(session)


async def test_broken_settings_keep_the_previous_generation_until_fixed(daemon_factory):
    d = await daemon_factory()
    entry = fake_server()
    settings = write_settings(d.root / "s.json", {"fake": entry})
    async with d.attach([settings], "b") as session:
        pid = (await session.call_tool("fake__pid", {})).structured_content["pid"]
        settings.write_text('{"mcpServers": {"fake": {"command": "x",, }}}')
        with trio.fail_after(WAIT):
            await wait_until(lambda: _status_is(d, settings, "error"))
        err = (await file_status(d, settings))["error"]
        assert str(settings) in err and ":1:" in err, err  # file, line and column
        # The previous settings stay in force: same tools, same process.
        assert (await session.call_tool("fake__pid", {})).structured_content["pid"] == pid
        # A validation error names the server and the field.
        settings.write_text(json.dumps({"mcpServers": {"fake": {**entry, "args": "notalist"}}}))
        with trio.fail_after(WAIT):
            await wait_until(lambda: _error_mentions(d, settings, "args"))
        err = (await file_status(d, settings))["error"]
        assert "'fake'" in err and "'args'" in err, err
        settings.write_text(json.dumps({"mcpServers": {"other": {**entry, "trust": True}}}))
        with trio.fail_after(WAIT):
            await wait_until(lambda: _status_is(d, settings, "ok"))
            await wait_until(lambda: _has(session, "other__echo"))
        assert "fake__echo" not in await names(session)
        # A server with neither command nor url is named too.
        settings.write_text(json.dumps({"mcpServers": {"empty": {"args": []}}}))
        with trio.fail_after(WAIT):
            await wait_until(lambda: _error_mentions(d, settings, "neither command nor url"))
        assert "other__echo" in await names(session)


async def _has(session: Any, name: str) -> bool:
    return name in await names(session)


async def _status_is(d: DaemonProcess, path: Path, status: str) -> bool:
    return (await file_status(d, path))["status"] == status


async def _error_mentions(d: DaemonProcess, path: Path, text: str) -> bool:
    return text in ((await file_status(d, path))["error"] or "")


async def test_fifty_rapid_writes_end_with_the_newest_content(daemon_factory):
    d = await daemon_factory()
    entry = fake_server(FAKE_TOOLS=",".join(f"t{i}" for i in range(50)))
    settings = write_settings(d.root / "s.json", {"fake": {**entry, "includeTools": ["t0"]}})
    async with d.attach([settings], "r") as session:
        assert await names(session) == {"fake__t0"}
        for i in range(50):
            atomic_write(settings, {"mcpServers": {"fake": {**entry, "includeTools": [f"t{i}"]}}})
        with trio.fail_after(WAIT):
            await wait_until(lambda: _names_are(session, {"fake__t49"}))
        # And it stays there: no older generation lands afterwards.
        await d.ctl("status")
        assert await names(session) == {"fake__t49"}
        sessions = await d.ctl("sessions")
        assert sessions[0]["handles"][0]["policy"]["includeTools"] == ["t49"]


async def _names_are(session: Any, expected: set[str]) -> bool:
    return await names(session) == expected


async def test_reload_command_reports_each_file(daemon_factory):
    d = await daemon_factory()
    settings = write_settings(d.root / "s.json", {"fake": fake_server()})
    async with d.attach([settings], "rep"):
        result = await d.ctl("reload")
        by_path = {f["path"]: f for f in result["files"]}
        assert by_path[str(settings)]["status"] == "ok"
        assert by_path[str(d.config_path)]["status"] == "ok"


async def test_kill_9_during_a_call_fails_it_at_once_and_the_server_recovers(daemon_factory):
    d = await daemon_factory(daemon={"backoffInitial": 0.05, "backoffMax": 0.2})
    settings = write_settings(d.root / "s.json", {"fake": fake_server()})
    rec = Recorder()
    async with d.attach([settings], "k", message_handler=rec) as session:
        pid = (await session.call_tool("fake__pid", {})).structured_content["pid"]
        failure: list[BaseException] = []

        async def long_call() -> None:
            try:
                await session.call_tool("fake__sleep", {"seconds": 60})
            except MCPError as exc:
                failure.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_call)
            servers = await d.ctl("servers")
            with trio.fail_after(WAIT):
                await wait_until(lambda: _in_flight_started(d))
            os.kill(pid, signal.SIGKILL)
            with trio.fail_after(WAIT):
                await wait_until(lambda: bool(failure))
        err = failure[0]
        assert err.error.code == -31002
        data = err.error.data
        assert data["server"] == "fake" and data["exitStatus"] == -9, data
        assert servers[0]["pid"] == pid
        # Recovery: a new process, and the next call succeeds.
        with trio.fail_after(WAIT):
            await wait_until(lambda: _active_with_new_pid(d, pid))
            await wait_until(lambda: _has(session, "fake__pid"))
        new_pid = (await session.call_tool("fake__pid", {})).structured_content["pid"]
        assert new_pid != pid
        # The session lost the tools and got them back: two list_changed.
        assert rec.tools_changed >= 2
        logs = await d.ctl("logs", "fake")
        assert any("fake-upstream" in line for line in logs["lines"]), logs


async def _in_flight_started(d: DaemonProcess) -> bool:
    servers = await d.ctl("servers")
    return bool(servers) and servers[0]["in_flight"] >= 1


async def _active_with_new_pid(d: DaemonProcess, old: int) -> bool:
    servers = await d.ctl("servers")
    return bool(servers) and servers[0]["state"] == "active" and servers[0]["pid"] != old


async def test_crash_loop_until_restart_or_settings_change(daemon_factory, tmp_path: Path):
    d = await daemon_factory(daemon={"backoffInitial": 0.01, "backoffMax": 0.02})
    script = tmp_path / "server.sh"
    script.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    script.chmod(0o755)
    settings = write_settings(d.root / "s.json", {"flaky": {"command": str(script)}})
    async with d.attach([settings], "c") as session:
        with trio.fail_after(WAIT):
            await wait_until(lambda: _state_is(d, "crash-loop"))
        servers = await d.ctl("servers")
        assert "3" in (servers[0]["last_error"] or ""), servers
        # Fixed binary, same settings: `daemonctl restart` brings it back.
        fake = Path(__file__).resolve().parents[2] / "tools" / "fake_upstream.py"
        script.write_text(f"#!/bin/sh\nexec {sys.executable} {fake}\n")
        result = await d.ctl("restart", "flaky")
        assert result["entries"][0]["result"] == "active", result
        with trio.fail_after(WAIT):
            await wait_until(lambda: _has(session, "flaky__echo"))


async def _has_pid(d: DaemonProcess) -> bool:
    servers = await d.ctl("servers")
    return bool(servers) and servers[0]["pid"] is not None


async def _state_is(d: DaemonProcess, state: str) -> bool:
    servers = await d.ctl("servers")
    return bool(servers) and servers[0]["state"] == state


async def test_spawn_timeout_closes_the_process_and_counts_as_a_failure(daemon_factory):
    d = await daemon_factory(daemon={"backoffInitial": 5, "backoffMax": 5})
    slow = {**fake_server(FAKE_STARTUP_DELAY=30), "timeout": 300}
    settings = write_settings(d.root / "s.json", {"slow": slow})
    async with d.attach([settings], "t"):
        with trio.fail_after(WAIT):
            await wait_until(lambda: _state_is(d, "restarting"))
        servers = await d.ctl("servers")
        assert "did not start within 0.3 s" in servers[0]["last_error"], servers
        assert servers[0]["pid"] is None


async def test_shutdown_is_bounded_despite_a_stuck_client_and_a_stubborn_upstream(
    daemon_factory,
):
    d = await daemon_factory(daemon={"shutdownTimeout": 3, "sessionBufferBytes": 1 << 24})
    stubborn = fake_server(FAKE_IGNORE_SIGTERM=1, FAKE_IGNORE_STDIN_EOF=1, FAKE_TOOL_COUNT=100)
    settings = write_settings(d.root / "s.json", {"stubborn": stubborn})
    async with d.raw() as stuck:
        reply = await stuck.request(
            "mcpool/attach", {"sources": [str(settings)], "cwd": str(d.root), "name": "stuck"}
        )
        assert "result" in reply
        listing = b'{"jsonrpc":"2.0","id":5,"method":"tools/list"}\n'
        await stuck.send_raw(listing * 50)  # never read: the daemon's writes to it back up
        with trio.fail_after(WAIT):  # the attach's upstream may still be starting
            await wait_until(lambda: _has_pid(d))
        servers = await d.ctl("servers")
        upstream = process(servers[0]["pid"])
        family = [upstream, *descendants(upstream.pid)]
        assert d.process is not None
        d.process.send_signal(signal.SIGTERM)
        with trio.fail_after(3 + 5):  # the bound, plus process start/exit slack
            code = await d.process.wait()
        assert code == 0
        assert not d.sock.exists()
        left = [p for p in family if alive(p)]
        assert not left, (left, [p.cmdline() for p in left], d.output())


async def test_daemon_options_reload_live_and_a_socket_change_asks_for_a_restart(daemon_factory):
    d = await daemon_factory(daemon={"drainGrace": 30})
    d.write_config({}, {"drainGrace": 7, "socket": "/tmp/elsewhere.sock"})
    with trio.fail_after(WAIT):
        await wait_until(lambda: _option_is(d, "drainGrace", 7))
    notes = (await d.ctl("status"))["notes"]
    assert any("restart the daemon" in n for n in notes), notes
    assert d.sock.exists()  # still listening where it started


async def _option_is(d: DaemonProcess, name: str, value: Any) -> bool:
    return bool((await d.ctl("status"))["options"].get(name) == value)


async def test_a_handshake_era_server_is_not_probed_again_after_a_crash(daemon_factory):
    d = await daemon_factory(daemon={"backoffInitial": 0.01, "backoffMax": 0.02})
    settings = write_settings(d.root / "s.json", {"fake": fake_server()})
    async with d.attach([settings], "era") as session:
        first = (await session.call_tool("fake__pid", {})).structured_content["pid"]
        logs = (await d.ctl("logs", "fake"))["lines"]
        assert "fake-upstream: unknown method server/discover" in logs  # probed once
        with pytest.raises(MCPError):
            await session.call_tool("fake__crash", {})
        with trio.fail_after(WAIT):
            await wait_until(lambda: _active_with_new_pid(d, first))
        logs = (await d.ctl("logs", "fake"))["lines"]
        assert "fake-upstream: unknown method server/discover" not in logs, logs
        assert (await d.ctl("servers"))[0]["era"] == "handshake"
