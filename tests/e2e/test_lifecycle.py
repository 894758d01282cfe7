"""Lifecycle (L2, L4, L5): entries close after the drain grace, `daemonctl stop` leaves nothing
behind, and upstream processes (with their grandchildren) die with a SIGKILLed daemon."""

from __future__ import annotations

import signal

import psutil
import trio

from .harness import DaemonFactory, fake_server
from .support import alive, call_text, process, servers_of, wait_until

# The drain grace the tests configure: short, so the real process exit is observed quickly.
DRAIN_GRACE = 0.5
# Grace, then L4's close (stdin EOF is enough for the fake), then the reap: well within this.
DRAIN_CLOSE_TIMEOUT = 10.0
# The bound: no upstream process remains 5 s after the daemon is SIGKILLed.
ORPHAN_DEADLINE = 5.0


def upstream_and_grandchild(upstream_pid: int) -> list[psutil.Process]:
    """The fake upstream (FAKE_CHILD=1) and the long-lived `sleep` it spawned."""
    upstream = process(upstream_pid)
    children = upstream.children()
    assert len(children) == 1, children
    assert children[0].name() == "sleep", children
    return [upstream, children[0]]


async def test_entry_closes_after_the_drain_grace_once_the_last_session_detaches(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory(daemon={"drainGrace": DRAIN_GRACE})
    settings = daemon.settings_file("settings.json", {"fake": fake_server()})
    async with daemon.attach([settings], "one") as one:
        async with daemon.attach([settings], "two") as two:
            pid = int(await call_text(two, "fake__pid"))
        upstream = process(pid)
        # One session left: the entry stays, with that session's reference only. The daemon
        # sees the other bridge's end of file in its own time, so the reference count is polled.
        assert int(await call_text(one, "fake__pid")) == pid

        async def one_ref() -> bool:
            (entry,) = await servers_of(daemon)
            return len(entry["refs"]) == 1

        with trio.fail_after(DRAIN_CLOSE_TIMEOUT):
            await wait_until(one_ref)
        assert alive(upstream)
    with trio.fail_after(DRAIN_CLOSE_TIMEOUT):
        await wait_until(lambda: not alive(upstream))

    async def no_entries() -> bool:
        return await servers_of(daemon) == []

    with trio.fail_after(DRAIN_CLOSE_TIMEOUT):
        await wait_until(no_entries)
    # The daemon itself keeps running and serves the next session with a fresh process.
    async with daemon.attach([settings], "three") as three:
        assert int(await call_text(three, "fake__pid")) != pid


async def test_daemonctl_stop_exits_0_removes_the_socket_and_leaves_no_upstream(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    settings = daemon.settings_file("settings.json", {"fake": fake_server(FAKE_CHILD=1)})
    async with daemon.attach([settings], "one") as one:
        upstreams = upstream_and_grandchild(int(await call_text(one, "fake__pid")))
        # Deaf to stdin EOF: closing it takes L4's SIGTERM step.
        other = daemon.settings_file("other.json", {"other": fake_server(FAKE_IGNORE_STDIN_EOF=1)})
        async with daemon.attach([other], "two") as two:
            # A detached-but-draining entry must be closed by the shutdown too.
            upstreams.append(process(int(await call_text(two, "other__pid"))))
        assert daemon.sock.exists()
        returncode = await daemon.stop()
    assert returncode == 0, daemon.output()
    assert not daemon.sock.exists()
    # `daemonctl stop` returned after the daemon exited, which closes every entry first (L5).
    remaining = [proc for proc in upstreams if alive(proc)]
    assert remaining == [], remaining


async def test_upstreams_and_grandchildren_die_with_a_sigkilled_daemon(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    # An upstream that outlives its stdin and ignores SIGTERM: only a SIGKILL of its group ends
    # it (and its grandchild), so surviving the daemon's death is the failure mode under test.
    stubborn = fake_server(FAKE_CHILD=1, FAKE_IGNORE_STDIN_EOF=1, FAKE_IGNORE_SIGTERM=1)
    settings = daemon.settings_file("settings.json", {"fake": stubborn})
    async with daemon.attach([settings], "one") as one:
        upstreams = upstream_and_grandchild(int(await call_text(one, "fake__pid")))
        # Everything the daemon started (upstreams, grandchildren, any helper of its own).
        spawned = psutil.Process(daemon.pid).children(recursive=True)
        assert {p.pid for p in upstreams} <= {p.pid for p in spawned}
        assert daemon.process is not None
        daemon.process.send_signal(signal.SIGKILL)
        with trio.fail_after(ORPHAN_DEADLINE):
            await wait_until(lambda: not any(alive(proc) for proc in spawned))
    assert daemon.process.poll() == -signal.SIGKILL
