"""L4 for what leaves an upstream's process group (issue 26 item 7): a descendant that calls
setsid() is out of reach of the group kill, yet still ends with its upstream.

The upstream is tools/fake_upstream.py with FAKE_ESCAPE: `setsid` (a child that calls setsid,
still the upstream's child: found in its tree) or `daemon` (a double fork whose middle process
exits: an orphan of init, found by the upstream's id in its environment). Each ends when its
entry closes (daemonctl restart, the server removed from the settings, daemonctl stop) and when
the daemon is SIGKILLed, also when the upstream exits on its own first (it reads end of file on
stdin as the daemon dies, and hands its children to init before the guardian looks).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import psutil
import pytest
import trio
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from mcpool.pool._environ import SPAWN_MARKER, UPSTREAM_MARKER

from .harness import DaemonFactory, DaemonProcess, daemonctl_json, fake_server
from .support import alive, call_text, process, tool_names, wait_until

# Closing an entry: stdin, its grace, SIGTERM (the sleep dies of it), within this.
CLOSE_TIMEOUT = 15.0
# The bound for what outlives a SIGKILLed daemon (TERM_GRACE and a guardian's reads).
ORPHAN_DEADLINE = 5.0
DRAIN_GRACE = 0.3
ESCAPES = ["setsid", "daemon"]


def escaping_server(how: str, pid_log: Path, **env: str | int) -> dict[str, object]:
    return fake_server(FAKE_ESCAPE=how, FAKE_ESCAPE_LOG=str(pid_log), **env)


async def escaped(pid_log: Path, count: int = 1) -> psutil.Process:
    """The `count`-th process the upstreams report in `pid_log` (written just after the fork)."""

    def pids() -> list[int]:
        try:
            return [int(line) for line in pid_log.read_text().split()]
        except FileNotFoundError:
            return []

    with trio.fail_after(CLOSE_TIMEOUT):
        await wait_until(lambda: len(pids()) >= count)
    return process(pids()[count - 1])


async def started(
    daemon_factory: DaemonFactory, tmp_path: Path, how: str, **env: str | int
) -> tuple[DaemonProcess, Path, Path]:
    daemon = await daemon_factory(daemon={"drainGrace": DRAIN_GRACE})
    pid_log = tmp_path / "escaped.log"
    settings = daemon.settings_file("s.json", {"fake": escaping_server(how, pid_log, **env)})
    return daemon, settings, pid_log


def assert_escaped(proc: psutil.Process, upstream: int, how: str) -> None:
    """It really left the upstream's group and session (a group kill would miss it), and, for
    a double fork, the upstream's tree too (a walk from the upstream would miss it)."""
    assert os.getpgid(proc.pid) != os.getpgid(upstream)
    assert os.getsid(proc.pid) != os.getsid(upstream)
    assert (proc.ppid() == upstream) == (how == "setsid"), (how, proc.ppid(), upstream)


def listed(session: ClientSession, tool: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return tool in await tool_names(session)

    return check


async def gone(proc: psutil.Process, within: float = CLOSE_TIMEOUT) -> None:
    with trio.fail_after(within):
        await wait_until(lambda: not alive(proc))


@pytest.mark.parametrize("how", ESCAPES)
async def test_an_escaped_descendant_ends_when_its_server_restarts(
    how: str, daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    daemon, settings, pid_log = await started(daemon_factory, tmp_path, how)
    async with daemon.attach([settings], "one") as one:
        upstream = int(await call_text(one, "fake__pid"))
        first = await escaped(pid_log)
        assert_escaped(first, upstream, how)
        await daemon.ctl("restart", "fake")
        await gone(first)
        # The new upstream (and its own escaped child) serves the same session.
        assert int(await call_text(one, "fake__pid")) != upstream
        assert alive(await escaped(pid_log, 2))


@pytest.mark.parametrize("how", ESCAPES)
async def test_what_a_crashed_server_left_ends_with_it(
    how: str, daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    daemon, settings, pid_log = await started(daemon_factory, tmp_path, how)
    async with daemon.attach([settings], "one") as one:
        upstream = int(await call_text(one, "fake__pid"))
        child = await escaped(pid_log)
        with trio.fail_after(CLOSE_TIMEOUT), pytest.raises(MCPError):
            await one.call_tool("fake__crash", {})  # it dies mid-call
        # Its orphans went to init when it died; its entry's close still finds them.
        await gone(child)
        # And the entry restarts (L3), with an escaped child of its own again. The child is
        # logged while the new upstream starts, before its tools are back in the session's view
        # (L3: they return by list_changed), so the call waits for the list, not the log.
        with trio.fail_after(CLOSE_TIMEOUT):
            await wait_until(lambda: len(pid_log.read_text().split()) >= 2)
            await wait_until(listed(one, "fake__pid"))
        assert upstream != int(await call_text(one, "fake__pid"))


@pytest.mark.parametrize("how", ESCAPES)
async def test_an_escaped_descendant_ends_when_its_server_leaves_the_settings(
    how: str, daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    daemon, settings, pid_log = await started(daemon_factory, tmp_path, how)
    async with daemon.attach([settings], "one") as one:
        upstream = process(int(await call_text(one, "fake__pid")))
        child = await escaped(pid_log)
        settings.write_text(json.dumps({"mcpServers": {}}))
        # Released, drained for DRAIN_GRACE, closed (L2, L4): the upstream and what it left.
        await gone(upstream)
        await gone(child)


@pytest.mark.parametrize("how", ESCAPES)
async def test_escaped_descendants_end_with_daemonctl_stop(
    how: str, daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    daemon, settings, pid_log = await started(daemon_factory, tmp_path, how)
    async with daemon.attach([settings], "one") as one:
        await call_text(one, "fake__pid")
        child = await escaped(pid_log)
        assert await daemon.stop() == 0, daemon.output()
    # `daemonctl stop` returned once the daemon exited, which closes every entry first (L5).
    assert not alive(child)


@pytest.mark.parametrize("exits_on_eof", [True, False], ids=["exits-on-eof", "stays"])
@pytest.mark.parametrize("how", ESCAPES)
async def test_escaped_descendants_end_with_a_sigkilled_daemon(
    how: str, exits_on_eof: bool, daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    # "stays": deaf to stdin's end and to SIGTERM, the upstream is there for the guardian to walk;
    # "exits-on-eof": it goes at once and hands its orphans to init, found by their environment.
    stubborn = {} if exits_on_eof else {"FAKE_IGNORE_STDIN_EOF": 1, "FAKE_IGNORE_SIGTERM": 1}
    daemon, settings, pid_log = await started(daemon_factory, tmp_path, how, **stubborn)
    async with daemon.attach([settings], "one") as one:
        upstream = process(int(await call_text(one, "fake__pid")))
        child = await escaped(pid_log)
        assert daemon.process is not None
        daemon.process.send_signal(signal.SIGKILL)
        await gone(child, ORPHAN_DEADLINE)
        await gone(upstream, ORPHAN_DEADLINE)


async def test_a_daemon_an_upstream_started_is_not_ended_with_that_upstreams_daemon(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    # The first daemon's upstream carries its marks; it runs `daemonctl start` for another socket
    # (another daemon is fine: X6 makes it nobody's, and it must not carry those marks).
    first = await daemon_factory(daemon={"drainGrace": DRAIN_GRACE})
    second = await daemon_factory(start=False)
    settings = first.settings_file("s.json", {"fake": fake_server()})
    async with first.attach([settings], "one") as one:
        upstream = process(int(await call_text(one, "fake__pid")))
        marks = {k: v for k, v in upstream.environ().items() if k.startswith("MCPOOL_UPSTREAM")}
        assert set(marks) == {UPSTREAM_MARKER, SPAWN_MARKER}
        started = await daemonctl_json(second.sock, "start", env={**second.env, **marks})
        assert started["started"] is True
        other = process(int(started["pid"]))
        # That upstream's entry closes: what carries its id ends with it, not the other daemon.
        await first.ctl("restart", "fake")
        await gone(upstream)
        assert alive(other)
        upstream = process(int(await call_text(one, "fake__pid")))
        (guardian,) = (
            p for p in psutil.Process(first.pid).children() if "_guardian.py" in str(p.cmdline())
        )
        assert first.process is not None
        first.process.send_signal(signal.SIGKILL)
        await gone(upstream, ORPHAN_DEADLINE)
        await gone(guardian, ORPHAN_DEADLINE)  # its work is done
    assert alive(other)
    assert (await daemonctl_json(second.sock, "status", env=second.env))["pid"] == other.pid
