"""Chaos and soak (issue 9): attach/detach churn, upstreams SIGKILLed under load, a stuck client.

Every loop here is bounded in count and in time, and all traffic is on loopback (Unix sockets and
pipes). The soak's duration comes from MCPOOL_CHAOS_SECONDS (default 60); CI may shorten it.
No timing is asserted: the stuck client's effect on the other sessions' latency is a benchmark
(tools/bench/stuck.py); here only its disconnection and the others' success are checked.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
from typing import Any

import psutil
import pytest
import trio

from .harness import FAKE_UPSTREAM, DaemonFactory, DaemonProcess, RawSocketClient, fake_server
from .support import STEP_TIMEOUT, raw_attach, raw_call, wait_until

pytestmark = pytest.mark.slow

CYCLES = 300  # measured, after the warm-up, in two halves (see RSS_LEAK_PER_CYCLE)
# The churn keeps at most this many sessions attached at once.
MAX_OPEN = 4
# Entries close this long after their last session leaves: short, so the churn's leftovers are
# gone quickly and the end state (no upstream) is reached within the drain wait below.
DRAIN_GRACE = 0.2
# Grace + L4 close of a fake (stdin EOF) + reap, for every entry at once, on a loaded machine.
DRAIN_WAIT = 20.0
# Cycles before the fd, heap and RSS baseline: imports, caches and the allocator's arenas reach
# their working size first, so the measured cycles compare a steady daemon with itself.
WARMUP_CYCLES = 100
# Live interpreter blocks the daemon may gain per measured cycle: its in-memory log (about two
# lines a cycle, kept up to 2,000) and tables that grew to the churn's peak and keep their size.
# One leaked session (its view, handles, task and buffers) is hundreds of blocks, a leaked entry
# thousands: a leak of either is far above this.
HEAP_BLOCKS_PER_CYCLE = 30
# RSS keeps rising for a few hundred cycles after the warm-up with no live memory growing:
# closed sessions' and entries' reference cycles that outlived a young collection wait for a full
# one (rare with GC_GEN0_THRESHOLD), and the interpreter keeps the 1 MiB arenas that peak needed;
# the in-memory log fills up to its 2,000 lines. Measured over cycles 100..300: +5% to +8.5% (once
# +10.3% under load) in one or two 1-2 MiB steps; over 300..500 +0.7% to +1.2%, and flat from
# about 1,000 to 3,000. So RSS is compared over the second half (the issue's 10% bound, once the
# first half has taken the steps), and a leak is growth in both halves beyond one arena step
# (RSS_ARENA_STEP) and RSS_LEAK_PER_CYCLE a cycle: a step can land in either half (seen in a
# clean-clone CI run: +1,776 then +1,216 KiB, heap blocks falling), a leaked session's objects
# (about 250, tens of KiB a cycle) grow each half by several MiB. Second halves measured: +276 to
# +1,216 KiB; +920 KiB with the 4 MiB settings reads daemon/_files.py read_bounded replaced, and
# about +1,860 KiB with a probe leaking 10 KiB a session: leaks that small are the unit tests'
# (tests/daemon/test_files.py), not this check's.
RSS_TOLERANCE = 0.10
RSS_LEAK_PER_CYCLE = 8 * 1024
RSS_ARENA_STEP = 1024 * 1024  # one obmalloc arena (1 MiB since Python 3.10)
FD_SETTLE_WAIT = 5.0  # a closed connection's fd is released within a loop turn or two
# An answer to any call, even a failure, well within this: a crash fails in-flight calls at once.
CALL_TIMEOUT = 15.0
KILL_INTERVAL = 2.0
CHAOS_SECONDS = float(os.environ.get("MCPOOL_CHAOS_SECONDS", "60"))
CALLERS = 4
STUCK_BUFFER = 256 * 1024  # the daemon's sessionBufferBytes in the stuck-client test
STUCK_DISCONNECT_TIMEOUT = 30.0


# -- helpers -----------------------------------------------------------------------------------


async def admin(daemon: DaemonProcess, command: str, params: dict[str, Any] | None = None) -> Any:
    """One admin request on its own connection (what daemonctl sends, minus its start-up)."""
    async with daemon.raw() as client:
        reply = await client.request(f"mcpool/admin/{command}", params or {})
    assert "result" in reply, reply
    return reply["result"]


def upstreams_of(daemon: DaemonProcess) -> list[psutil.Process]:
    """The daemon's fake upstream processes (its descendants running fake_upstream.py)."""
    found = []
    for child in psutil.Process(daemon.pid).children(recursive=True):
        try:
            if str(FAKE_UPSTREAM) in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def random_settings(rng: random.Random) -> dict[str, Any]:
    """1-3 of four servers, each one of two transports, with a random policy and scope."""
    servers: dict[str, Any] = {}
    for name in rng.sample(["alpha", "beta", "gamma", "delta"], rng.randint(1, 3)):
        spec: dict[str, Any] = fake_server(
            FAKE_TOOLS="one,two,three", FAKE_INSTRUCTIONS=f"{name} v{rng.randint(0, 1)}"
        )
        if rng.random() < 0.2:
            spec["scope"] = "session"
        if rng.random() < 0.4:
            spec["includeTools"] = rng.sample(
                ["one", "two", "three", "echo", "pid"], rng.randint(1, 4)
            )
        if rng.random() < 0.4:
            spec["excludeTools"] = rng.sample(["one", "two", "three"], rng.randint(0, 2))
        if rng.random() < 0.3:
            spec["trust"] = rng.random() < 0.5
        if rng.random() < 0.3:
            spec["alwaysLoadTools"] = True
        servers[name] = spec
    return servers


class Churn:
    """Attach and detach raw sessions with random settings, a bounded number at a time."""

    def __init__(self, daemon: DaemonProcess, rng: random.Random) -> None:
        self.daemon = daemon
        self.rng = rng
        self.open: list[tuple[RawSocketClient, Any]] = []
        self.attached = 0

    async def attach_one(self) -> None:
        d = self.daemon
        # A new file per session, as for a new project: rewriting one that an attached session
        # reads would race the watcher's reload (attach reads the daemon's cached copy).
        settings = d.settings_file(f"churn{self.attached}.json", random_settings(self.rng))
        stream = await trio.open_unix_socket(str(d.sock))
        client = RawSocketClient(stream)
        self.attached += 1
        await raw_attach(client, [str(settings)], f"churn{self.attached}")
        listed = await client.request("tools/list")
        # Harmless tools only (the fake also has crash, sleep, set_tools...).
        tools = [
            t["name"]
            for t in listed["result"]["tools"]
            if t["name"].rpartition("__")[2] in ("one", "two", "three", "echo", "pid")
        ]
        if tools:
            reply = await raw_call(client, self.rng.choice(tools), {"text": "x", "name": "x"})
            assert "result" in reply, reply
        self.open.append((client, stream))

    async def detach_one(self) -> None:
        client, _ = self.open.pop(self.rng.randrange(len(self.open)))
        await client.aclose()

    async def cycles(self, n: int) -> None:
        for _ in range(n):
            with trio.fail_after(STEP_TIMEOUT):
                while len(self.open) >= MAX_OPEN or (self.open and self.rng.random() < 0.4):
                    await self.detach_one()
                await self.attach_one()

    async def close_all(self) -> None:
        while self.open:
            await self.detach_one()


async def settled(daemon: DaemonProcess) -> tuple[int, int, int]:
    """Once no session and no entry remain and no upstream runs: the daemon's fd count, RSS and
    live heap blocks (after a collection)."""

    async def no_entries() -> bool:
        return not upstreams_of(daemon) and await admin(daemon, "servers") == []

    with trio.fail_after(DRAIN_WAIT):
        await wait_until(no_entries)
    assert await admin(daemon, "sessions") == []
    # The admin connections used above are closed by now; let the daemon finish closing them.
    await trio.sleep(0.2)
    status = await admin(daemon, "status", {"collect": True})
    return fd_count(daemon.pid), rss(daemon.pid), int(status["heap"]["blocks"])


# -- tests -------------------------------------------------------------------------------------


async def test_attach_detach_churn_leaves_no_process_fd_or_memory_behind(
    daemon_factory: DaemonFactory,
) -> None:
    seed = int(os.environ.get("MCPOOL_CHAOS_SEED", random.randrange(1 << 30)))
    print(f"churn seed: {seed} (MCPOOL_CHAOS_SEED reproduces it)")
    rng = random.Random(seed)
    daemon = await daemon_factory(daemon={"drainGrace": DRAIN_GRACE, "maxIdle": 5})
    churn = Churn(daemon, rng)

    await churn.cycles(WARMUP_CYCLES)
    await churn.close_all()
    fds_before, rss_before, blocks_before = await settled(daemon)

    half = CYCLES // 2
    await churn.cycles(half)
    await churn.close_all()
    _, rss_half, _ = await settled(daemon)
    await churn.cycles(CYCLES - half)
    assert churn.attached == WARMUP_CYCLES + CYCLES
    await churn.close_all()
    fds_after, rss_after, blocks_after = await settled(daemon)
    # The daemon may still be closing the admin connection `settled` used: a leak is an fd
    # that stays.
    with trio.move_on_after(FD_SETTLE_WAIT):
        await wait_until(lambda: fd_count(daemon.pid) <= fds_before)
    fds_after = fd_count(daemon.pid)

    print(
        f"daemon fds {fds_before} -> {fds_after},"
        f" RSS {rss_before >> 10} -> {rss_half >> 10} -> {rss_after >> 10} KiB,"
        f" heap blocks {blocks_before} -> {blocks_after}"
    )
    assert upstreams_of(daemon) == []
    assert fds_after <= fds_before, (
        f"fd leak: {fds_before} -> {fds_after}: {sorted(os.listdir(f'/proc/{daemon.pid}/fd'))}"
    )
    assert blocks_after - blocks_before <= HEAP_BLOCKS_PER_CYCLE * CYCLES, (
        f"heap grew by {blocks_after - blocks_before} blocks over {CYCLES} cycles"
    )
    assert rss_after <= rss_half * (1 + RSS_TOLERANCE), (rss_before, rss_half, rss_after)
    growth = min(rss_half - rss_before, rss_after - rss_half)
    assert growth <= RSS_ARENA_STEP + RSS_LEAK_PER_CYCLE * half, (
        f"RSS grew in both halves: {rss_before >> 10} -> {rss_half >> 10} -> {rss_after >> 10} KiB"
    )


async def test_upstream_sigkilled_every_two_seconds_while_four_sessions_call_it(
    daemon_factory: DaemonFactory,
) -> None:
    # Restarts quickly, so calls land on live, dying and restarting upstreams alike.
    daemon = await daemon_factory(
        {"f": fake_server()}, daemon={"backoffInitial": 0.1, "backoffMax": 0.5}
    )
    outcomes = {"result": 0, "error": 0}
    kills = 0
    restarts = 0

    async def caller(i: int, stop: trio.Event) -> None:
        rng = random.Random(i)
        async with daemon.raw() as client:
            await raw_attach(client, [str(daemon.config_path)], f"caller{i}")
            client.receive_timeout = CALL_TIMEOUT
            while not stop.is_set():
                # Half instant, half in flight long enough to be hit by a kill.
                tool, args = rng.choice(
                    [("f__echo", {"text": "x"}), ("f__sleep", {"seconds": 0.3})]
                )
                with trio.fail_after(CALL_TIMEOUT):
                    reply = await raw_call(client, tool, args)
                assert ("result" in reply) != ("error" in reply), reply
                outcomes["result" if "result" in reply else "error"] += 1
                client.backlog.clear()  # list_changed as the server comes and goes
                if "error" in reply:
                    await trio.sleep(0.05)  # not a hot loop while the server is down

    async def killer(stop: trio.Event) -> None:
        nonlocal kills, restarts
        deadline = trio.current_time() + CHAOS_SECONDS
        while trio.current_time() < deadline:
            await trio.sleep(KILL_INTERVAL)
            for entry in await admin(daemon, "servers"):
                if entry["state"] == "crash-loop":
                    # Five crashes in the window stop the restarts (L3); start it again so the
                    # soak keeps hitting live upstreams.
                    await admin(daemon, "restart", {"name": "f"})
                    restarts += 1
                elif entry.get("pid"):
                    try:
                        os.kill(entry["pid"], signal.SIGKILL)
                        kills += 1
                    except ProcessLookupError:
                        pass
        stop.set()

    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        for i in range(CALLERS):
            nursery.start_soon(caller, i, stop)
        nursery.start_soon(killer, stop)
    print(f"kills: {kills}, crash-loop restarts: {restarts}, outcomes: {outcomes}")
    assert kills >= CHAOS_SECONDS // KILL_INTERVAL // 2
    assert outcomes["result"] > 0
    assert outcomes["error"] > 0
    # And the daemon is still healthy: a fresh session gets a fresh upstream's answer (after
    # `daemonctl restart` if the last kills left the server in its crash loop, as L3 intends).
    async with daemon.raw() as client:
        await raw_attach(client, [str(daemon.config_path)], "after")

        async def answers() -> bool:
            reply = await raw_call(client, "f__echo", {"text": "ok"})
            if "result" in reply:
                return True
            if any(e["state"] == "crash-loop" for e in await admin(daemon, "servers")):
                await admin(daemon, "restart", {"name": "f"})
            return False

        with trio.fail_after(STEP_TIMEOUT):
            await wait_until(answers)


async def test_a_session_that_stops_reading_is_disconnected_and_others_are_served(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory(
        {"f": fake_server(FAKE_INLINE=1)}, daemon={"sessionBufferBytes": STUCK_BUFFER}
    )
    settings = [str(daemon.config_path)]
    answered = 0
    stuck_gone = trio.Event()

    async def caller(i: int) -> None:
        nonlocal answered
        async with daemon.raw() as client:
            await raw_attach(client, settings, f"caller{i}")
            while not stuck_gone.is_set():
                with trio.fail_after(CALL_TIMEOUT):
                    reply = await raw_call(client, "f__echo", {"text": f"c{i}"})
                assert reply.get("result", {}).get("content", [{}])[0].get("text") == f"c{i}", reply
                answered += 1
            # A few more once the stuck one is gone.
            for _ in range(10):
                reply = await raw_call(client, "f__echo", {"text": f"c{i}"})
                assert "result" in reply, reply
                answered += 1

    async def stuck() -> None:
        async with daemon.raw() as client:
            session = await raw_attach(client, settings, "stuck")
            big = "y" * 65536
            sent = 0
            with trio.fail_after(STUCK_DISCONNECT_TIMEOUT):
                # Never read: answers pile up in the socket, then in the daemon's buffer.
                while session in {s["id"] for s in await admin(daemon, "sessions")}:
                    line = {
                        "jsonrpc": "2.0",
                        "id": 1000 + sent,
                        "method": "tools/call",
                        "params": {"name": "f__echo", "arguments": {"text": big}},
                    }
                    # The daemon may have hung up on us already; the sessions list confirms it.
                    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                        await client.send_raw(json.dumps(line).encode() + b"\n")
                    sent += 1
                    # Bounded: far past the limit the daemon must have dropped us.
                    assert sent * len(big) < 64 * STUCK_BUFFER + (16 << 20), "never disconnected"
        stuck_gone.set()

    async with trio.open_nursery() as nursery:
        for i in range(CALLERS):
            nursery.start_soon(caller, i)
        nursery.start_soon(stuck)
    assert answered >= CALLERS * 10
