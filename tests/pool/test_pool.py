"""Pool: leases, drain timing, restarts, refresh (DESIGN L1-L3, R3-R5), on a fake upstream.

No processes: `Pool(upstream_factory=FakeNet.factory)` hands every entry a `FakeUpstream`. Time
is trio's MockClock (`autojump_clock`), so the drain and backoff assertions are exact.
"""

from __future__ import annotations

import math
import random
import weakref

import pytest
import trio
import trio.testing
from fakes import FakeNet, FakeServer, make_pool, stdio, tool

from mcpool.pool import (
    CRASH_LOOP_COOLDOWN,
    EntryState,
    Handle,
    Pool,
    PoolEntry,
    RefreshRejected,
    backoff_delay,
    identity_of,
)
from mcpool.pool._pool import IN_FLIGHT_SLACK

GRACE = 30.0
MAX_IDLE = 300.0
EPSILON = 1e-6  # virtual seconds either side of an exact MockClock deadline


class Listener:
    def __init__(self) -> None:
        self.snapshots: list[int] = []
        self.notifications: list[str] = []

    def snapshot_changed(self, entry: PoolEntry) -> None:
        self.snapshots.append(entry.snapshot.generation)

    def upstream_notification(self, entry: PoolEntry, method: str, params: object) -> None:
        self.notifications.append(method)

    def server_request(self, entry: PoolEntry, upstream: object, msg: object) -> bool:
        return False


def new_pool(nursery: trio.Nursery, net: FakeNet, **options: float) -> Pool:
    opts: dict[str, float] = {"drain_grace": GRACE, "max_idle": MAX_IDLE, **options}
    return make_pool(nursery, net, **opts)


async def acquire(pool: Pool, name: str = "srv", session: str = "s1", **fields: object) -> Handle:
    settings = stdio(name, **fields)
    return await pool.acquire(identity_of(name, settings), settings, session, Listener())


# -- L1 ------------------------------------------------------------------------------------------


async def test_concurrent_leases_of_one_key_create_one_entry_and_one_upstream(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("read")])
    server.start_gate = trio.Event()
    pool = new_pool(nursery, FakeNet(srv=server))
    handles: list[Handle] = []

    async def one(i: int) -> None:
        handles.append(await acquire(pool, session=f"s{i}"))

    async with trio.open_nursery() as inner:
        for i in range(10):
            inner.start_soon(one, i)
        await trio.testing.wait_all_tasks_blocked()
        assert len(pool.entries()) == 1
        assert server.starts == 1
        server.start_gate.set()

    assert len(handles) == 10
    assert len({id(h.entry) for h in handles}) == 1
    entry = handles[0].entry
    assert entry.leases == 10
    assert entry.state is EntryState.ACTIVE
    assert server.starts == 1


async def test_session_scope_servers_get_one_unpooled_entry_per_lease(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("read")])
    pool = new_pool(nursery, FakeNet(srv=server))
    a = await acquire(pool, scope="session", session="a")
    b = await acquire(pool, scope="session", session="b")
    assert a.entry is not b.entry
    assert a.lifecycle_id.startswith("srv::unpooled-")
    assert a.lifecycle_id != b.lifecycle_id
    assert a.identity == b.identity
    assert server.starts == 2


async def test_shared_lease_key_is_name_and_fingerprint(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    pool = new_pool(nursery, FakeNet(srv=FakeServer()))
    h = await acquire(pool)
    assert h.lifecycle_id == f"srv::{h.identity.fingerprint}"


async def test_different_identities_get_different_entries(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer()
    pool = new_pool(nursery, FakeNet(srv=server))
    a = await acquire(pool, args=["1"])
    b = await acquire(pool, args=["2"])
    assert a.entry is not b.entry
    assert server.starts == 2


async def test_policy_only_difference_shares_one_entry(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer()
    pool = new_pool(nursery, FakeNet(srv=server))
    a = await acquire(pool, trust=True, session="a")
    b = await acquire(pool, includeTools=[], session="b")
    assert a.entry is b.entry
    assert server.starts == 1


async def test_discovery_publishes_an_available_snapshot(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("read"), tool("write")], prompts=[{"name": "p"}])
    pool = new_pool(nursery, FakeNet(srv=server))
    entry = (await acquire(pool)).entry
    assert entry.snapshot.available
    assert entry.snapshot.generation == 1
    assert [t["name"] for t in entry.snapshot.tools] == ["read", "write"]
    assert [p["name"] for p in entry.snapshot.prompts] == ["p"]


# -- L2 ------------------------------------------------------------------------------------------


async def test_drain_grace_closes_an_idle_entry_exactly_at_grace(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer()
    pool = new_pool(nursery, FakeNet(srv=server))
    handle = await acquire(pool)
    entry = handle.entry
    await trio.sleep(5)
    released_at = trio.current_time()
    pool.release(handle)
    assert entry.state is EntryState.DRAINING
    await entry.closed.wait()
    assert trio.current_time() == released_at + GRACE
    assert entry.state is EntryState.CLOSED
    assert server.current.closed_reason == "drained"
    assert pool.entries() == []


async def test_lease_within_grace_keeps_the_entry_and_its_upstream(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer()
    pool = new_pool(nursery, FakeNet(srv=server))
    first = await acquire(pool)
    pool.release(first)
    await trio.sleep(GRACE - 1)
    second = await acquire(pool)
    assert second.entry is first.entry
    assert second.entry.state is EntryState.ACTIVE
    await trio.sleep(10 * MAX_IDLE)
    assert not second.entry.closed.is_set()
    assert server.starts == 1


async def test_max_idle_cap_counts_from_first_idle_moment_despite_flapping(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer()
    pool = new_pool(nursery, FakeNet(srv=server))
    handle = await acquire(pool)
    entry = handle.entry
    first_idle = trio.current_time()
    pool.release(handle)

    async def flap() -> None:
        # Attach for 1 s every 11 s: each detach alone would push the close to now + grace.
        while True:
            await trio.sleep(10)
            h = await acquire(pool, session="flapper")
            if h.entry is not entry:
                pool.release(h)
                return
            await trio.sleep(1)
            pool.release(h)

    nursery.start_soon(flap)
    await entry.closed.wait()
    assert trio.current_time() == first_idle + MAX_IDLE
    assert entry.state is EntryState.CLOSED


async def test_flapping_within_grace_keeps_entry_alive_without_a_cap(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer()
    pool = new_pool(nursery, FakeNet(srv=server), max_idle=math.inf)
    handle = await acquire(pool)
    entry = handle.entry
    pool.release(handle)
    for _ in range(60):
        await trio.sleep(10)
        h = await acquire(pool, session="flapper")
        await trio.sleep(1)
        pool.release(h)
    assert h.entry is entry
    assert not entry.closed.is_set()
    assert server.starts == 1


async def test_a_lease_as_long_as_the_grace_restarts_the_idle_stretch(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    pool = new_pool(nursery, FakeNet(srv=FakeServer()))
    handle = await acquire(pool)
    entry = handle.entry
    pool.release(handle)
    await trio.sleep(GRACE - 1)
    held = await acquire(pool)
    await trio.sleep(MAX_IDLE)  # real use, longer than the grace
    second_idle = trio.current_time()
    pool.release(held)
    await entry.closed.wait()
    assert trio.current_time() == second_idle + GRACE


async def test_release_is_idempotent(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    pool = new_pool(nursery, FakeNet(srv=FakeServer()))
    a = await acquire(pool, session="a")
    b = await acquire(pool, session="b")
    pool.release(a)
    pool.release(a)
    assert a.entry.leases == 1
    assert a.entry.state is EntryState.ACTIVE
    pool.release(b)
    assert b.entry.leases == 0


@pytest.mark.usefixtures("no_collector")
async def test_a_closed_entry_and_its_connection_go_without_the_collector(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    net = FakeNet(srv=FakeServer([tool("a")]))
    pool = new_pool(nursery, net)
    handle = await acquire(pool)
    entry = handle.entry
    refs = {"entry": weakref.ref(entry), "upstream": weakref.ref(net.servers["srv"].current)}
    pool.release(handle)
    del handle, entry
    await trio.sleep(GRACE + 1)  # drained: the entry closes, its supervisor ends
    assert pool.entries() == []
    net.servers["srv"].upstreams.clear()  # (the fake's own list of the connections it made)
    assert sorted(name for name, ref in refs.items() if ref() is not None) == []


async def test_lease_after_close_builds_a_new_entry_under_the_same_key(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer()
    pool = new_pool(nursery, FakeNet(srv=server))
    first = await acquire(pool)
    pool.release(first)
    await first.entry.closed.wait()
    second = await acquire(pool)
    assert second.entry is not first.entry
    assert second.lifecycle_id == first.lifecycle_id
    assert pool.entries() == [second.entry]
    assert server.starts == 2


# -- L3 ------------------------------------------------------------------------------------------


async def test_crash_restarts_after_backoff_and_republishes(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("read")])
    pool = new_pool(nursery, FakeNet(srv=server))
    listener = Listener()
    settings = stdio("srv")
    handle = await pool.acquire(identity_of("srv", settings), settings, "s1", listener)
    entry = handle.entry
    crashed_at = trio.current_time()
    expected_delay = backoff_delay(1, initial=1.0, maximum=30.0, rng=random.Random(1234))
    server.current.crash()
    await trio.testing.wait_all_tasks_blocked()
    assert entry.state is EntryState.RESTARTING
    assert not entry.snapshot.available
    assert entry.last_error == "exited with status 1"
    await trio.sleep_until(crashed_at + expected_delay - EPSILON)
    assert entry.state is EntryState.RESTARTING
    assert server.starts == 1
    await trio.sleep_until(crashed_at + expected_delay + EPSILON)
    assert entry.state is EntryState.ACTIVE
    assert server.starts == 2
    assert entry.snapshot.available
    assert listener.snapshots == [1, 2, 3]  # discovery, unavailable, the restart's discovery


async def test_repeated_failures_enter_crash_loop_until_the_cooldown_or_a_restart(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("read")])
    pool = new_pool(nursery, FakeNet(srv=server))
    entry = (await acquire(pool)).entry
    server.always_fail = True
    server.current.crash()
    rng = random.Random(1234)
    expected = sum(backoff_delay(n, initial=1.0, maximum=30.0, rng=rng) for n in range(1, 5))
    crashed_at = trio.current_time()
    await trio.sleep_until(crashed_at + expected - EPSILON)
    assert entry.state is EntryState.RESTARTING
    assert len(entry.failures) == 4
    await trio.sleep_until(crashed_at + expected + EPSILON)
    assert entry.state is EntryState.CRASH_LOOP
    assert len(entry.failures) == 5
    assert server.starts == 5  # one good start, then four failed restarts
    await trio.sleep(CRASH_LOOP_COOLDOWN - 1)
    assert entry.state is EntryState.CRASH_LOOP  # no restarts before the cooldown
    assert server.starts == 5

    server.always_fail = False
    assert pool.restart("srv") == [entry]
    await trio.testing.wait_all_tasks_blocked()
    assert entry.state is EntryState.ACTIVE
    assert entry.snapshot.available
    assert server.starts == 6


async def test_explicit_restart_replaces_the_upstream_without_a_failure(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("read")])
    pool = new_pool(nursery, FakeNet(srv=server))
    entry = (await acquire(pool)).entry
    old = server.current
    pool.restart("srv")
    await trio.testing.wait_all_tasks_blocked()
    assert server.current is not old
    assert old.closed_reason == "restart requested"
    assert entry.state is EntryState.ACTIVE
    assert entry.failures == []
    assert entry.restarts == 1


async def test_upstream_list_changed_relists_and_publishes_next_generation(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("read")])
    pool = new_pool(nursery, FakeNet(srv=server))
    entry = (await acquire(pool)).entry
    before = entry.snapshot
    server.tools.append(tool("write"))
    server.current.list_changed("tools")
    await trio.testing.wait_all_tasks_blocked()
    assert entry.snapshot.generation == before.generation + 1
    assert [t["name"] for t in entry.snapshot.tools] == ["read", "write"]
    assert [t["name"] for t in before.tools] == ["read"]  # the old snapshot is untouched


# -- R3-R5 ---------------------------------------------------------------------------------------


async def test_refresh_updates_the_handle_settings_and_keeps_its_lease(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer()
    pool = new_pool(nursery, FakeNet(srv=server))
    handle = await acquire(pool)
    entry = handle.entry
    pool.refresh(handle, stdio("srv", trust=True))
    assert handle.settings.trust is True
    assert handle.entry is entry
    assert entry.leases == 1
    assert server.starts == 1
    assert len(pool.entries()) == 1


async def test_refresh_of_a_released_handle_is_rejected_and_changes_nothing(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    pool = new_pool(nursery, FakeNet(srv=FakeServer()))
    keeper = await acquire(pool, session="keeper")
    handle = await acquire(pool)
    pool.release(handle)
    settings_before, state_before = handle.settings, handle.entry.state
    with pytest.raises(RefreshRejected, match="released handle"):
        pool.refresh(handle, stdio("srv", trust=True))
    assert handle.settings is settings_before
    assert handle.released
    assert handle.entry.state is state_before
    assert handle.entry.leases == 1
    assert handle not in keeper.entry.handles.values()


async def test_refresh_of_a_handle_on_a_terminal_entry_is_rejected_and_changes_nothing(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    pool = new_pool(nursery, FakeNet(srv=FakeServer()))
    handle = await acquire(pool)
    entry = handle.entry
    await pool.aclose()
    assert entry.state is EntryState.CLOSED
    settings_before = handle.settings
    with pytest.raises(RefreshRejected, match="closed entry") as info:
        pool.refresh(handle, stdio("srv", trust=True))
    assert info.value.data["state"] == "closed"
    assert handle.settings is settings_before
    assert entry.state is EntryState.CLOSED
    assert not handle.released


async def test_refresh_during_a_restart_is_accepted(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("read")])
    pool = new_pool(nursery, FakeNet(srv=server))
    handle = await acquire(pool)
    server.start_gate = trio.Event()
    server.current.crash()
    await trio.sleep(5)  # past the backoff, within the start timeout: waiting at the gate
    assert handle.entry.state is EntryState.RESTARTING
    pool.refresh(handle, stdio("srv", includeTools=["read"]))
    assert handle.settings.include_tools == ["read"]
    server.start_gate.set()
    await trio.testing.wait_all_tasks_blocked()
    assert handle.entry.state is EntryState.ACTIVE
    assert handle.entry.leases == 1
    assert server.starts == 2


async def test_pool_captures_settings_so_later_mutation_changes_nothing_held(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    pool = new_pool(nursery, FakeNet(srv=FakeServer()))
    settings = stdio("srv", scope="workspace", roots=["/a"], args=["x"])
    identity = identity_of("srv", settings, session_roots=("/a",))
    handle = await pool.acquire(identity, settings, "s1", Listener())
    settings.roots.append("/b")
    settings.args.append("y")
    assert handle.identity == identity_of(
        "srv", stdio("srv", scope="workspace", args=["x"]), session_roots=("/a",)
    )
    assert handle.entry.identity.args == ("x",)
    assert handle.settings.roots == ["/a"]
    assert handle.entry.settings.roots == ["/a"]


# -- shutdown -------------------------------------------------------------------------------------


async def test_aclose_closes_every_entry_and_refuses_new_leases(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server_a, server_b = FakeServer(), FakeServer()
    pool = new_pool(nursery, FakeNet(a=server_a, b=server_b))
    a = await acquire(pool, "a")
    b = await acquire(pool, "b")
    await pool.aclose()
    assert a.entry.state is EntryState.CLOSED
    assert b.entry.state is EntryState.CLOSED
    assert server_a.current.closed_reason == "the daemon is shutting down"
    with pytest.raises(Exception, match="shutting down"):
        await acquire(pool, "a")


# -- crash-loop is not for good (issue 12 item 12) ------------------------------------------------


async def crash_looped(pool: Pool, server: FakeServer) -> tuple[Handle, float]:
    """An entry driven into crash-loop; returns its handle and the moment it entered it."""
    handle = await acquire(pool)
    server.always_fail = True
    server.current.crash()
    entry = handle.entry
    while entry.state is not EntryState.CRASH_LOOP:
        await entry.state_changed.wait()
    assert server.starts == 5
    return handle, trio.current_time()


async def test_a_crash_looped_entry_is_retried_after_the_cooldown_and_back_at_once_if_broken(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("read")])
    pool = new_pool(nursery, FakeNet(srv=server))
    handle, looped_at = await crash_looped(pool, server)
    entry = handle.entry
    assert entry.retry_at == looped_at + CRASH_LOOP_COOLDOWN
    await trio.sleep_until(looped_at + CRASH_LOOP_COOLDOWN - EPSILON)
    assert server.starts == 5
    await trio.sleep_until(looped_at + CRASH_LOOP_COOLDOWN + EPSILON)
    # Still broken: one spawn, and straight back to crash-loop (no new round of five).
    assert server.starts == 6
    assert entry.state is EntryState.CRASH_LOOP
    assert entry.retry_at == looped_at + 2 * CRASH_LOOP_COOLDOWN


async def test_a_fixed_server_comes_back_at_the_cooldown_and_staying_up_resets_its_failures(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("read")])
    pool = new_pool(nursery, FakeNet(srv=server))
    handle, looped_at = await crash_looped(pool, server)
    entry = handle.entry
    server.always_fail = False
    await trio.sleep_until(looped_at + CRASH_LOOP_COOLDOWN + EPSILON)
    assert entry.state is EntryState.ACTIVE and entry.snapshot.available
    assert entry.retry_at is None
    await trio.sleep(pool.options.crash_loop_window)  # it stays up
    server.current.crash()
    await trio.testing.wait_all_tasks_blocked()
    assert entry.state is EntryState.RESTARTING  # one crash after a good run: a plain restart
    assert len(entry.failures) == 1


async def test_an_attach_retries_a_crash_looped_entry_at_most_once_per_backoff_interval(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("read")])
    pool = new_pool(nursery, FakeNet(srv=server))
    handle, looped_at = await crash_looped(pool, server)
    entry = handle.entry
    backoff_max = pool.options.backoff_max
    await trio.sleep_until(looped_at + backoff_max - 1)
    early = await acquire(pool, session="early")
    assert early.entry is entry and server.starts == 5  # too soon after the last failure
    await trio.sleep_until(looped_at + backoff_max)
    retried = await acquire(pool, session="later")
    assert server.starts == 6  # the attach waited for this attempt; still broken
    assert retried.entry is entry and entry.state is EntryState.CRASH_LOOP
    again = await acquire(pool, session="again")
    assert again.entry is entry and server.starts == 6  # no storm: one retry per interval
    server.always_fail = False
    await trio.sleep(backoff_max)
    fixed = await acquire(pool, session="fixed")
    assert server.starts == 7
    assert fixed.entry is entry and entry.state is EntryState.ACTIVE
    assert entry.snapshot.available  # the attach saw the tools at once


# -- a replaced entry closes at once (issue 12 item 10) -------------------------------------------


async def test_a_replaced_release_closes_an_unused_entry_at_once_and_a_plain_one_drains(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer()
    pool = new_pool(nursery, FakeNet(srv=server))
    plain = await acquire(pool, args=["a"])
    replaced = await acquire(pool, args=["b"])
    released_at = trio.current_time()
    pool.release(plain)
    pool.release(replaced, replaced=True)
    await replaced.entry.closed.wait()
    assert trio.current_time() == released_at
    assert not plain.entry.closed.is_set()
    await plain.entry.closed.wait()
    assert trio.current_time() == released_at + GRACE


async def test_a_replaced_release_keeps_a_shared_entry_and_one_with_requests_in_flight(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer()
    pool = new_pool(nursery, FakeNet(srv=server))
    mine = await acquire(pool, session="a")
    other = await acquire(pool, session="b")
    pool.release(mine, replaced=True)
    await trio.sleep(GRACE * 2)
    assert other.entry.state is EntryState.ACTIVE  # another session still uses it
    other.in_flight += 1  # what the session's forwarded call counts on its handle
    released_at = trio.current_time()
    pool.release(other, replaced=True)
    await other.entry.closed.wait()  # the call in flight gets the drain grace
    assert trio.current_time() == released_at + GRACE


async def test_a_replaced_release_during_start_up_stops_the_start(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer()
    server.start_gate = trio.Event()
    pool = new_pool(nursery, FakeNet(srv=server))
    settings = stdio("srv")
    handle = pool.lease(identity_of("srv", settings), settings, "s", Listener())
    await trio.testing.wait_all_tasks_blocked()
    assert handle.entry.state is EntryState.SPAWNING
    pool.release(handle, replaced=True)
    await handle.entry.closed.wait()
    assert server.starts == 1 and server.current.pid is None  # never got to run


# -- L7 ------------------------------------------------------------------------------------------


def _ignore_reply(msg: object) -> None:
    pass


async def test_a_drained_entry_with_a_request_in_flight_closes_when_it_is_answered(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer()
    pool = new_pool(nursery, FakeNet(srv=server))
    handle = await acquire(pool)
    entry = handle.entry
    upstream = server.current
    uid = upstream.send_request("tools/call", b'{"name":"slow"}', _ignore_reply)
    handle.in_flight += 1  # what the session's forwarded call counts on its handle
    released_at = trio.current_time()
    pool.release(handle, replaced=True)  # a transport change: the call keeps running
    await trio.sleep(GRACE * 3)
    assert not entry.closed.is_set() and upstream.alive  # the grace passed; the call goes on
    answered_at = trio.current_time()
    upstream.reply(uid, {"content": []})
    await entry.closed.wait()
    assert trio.current_time() == answered_at > released_at + GRACE
    assert upstream.closed_reason == "drained"


async def test_a_drained_entry_waits_for_its_requests_at_most_their_time_limit(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer()
    pool = new_pool(nursery, FakeNet(srv=server))
    handle = await acquire(pool)
    entry = handle.entry
    upstream = server.current
    upstream.request_timeout = 100.0
    upstream.send_request("tools/call", b'{"name":"hung"}', _ignore_reply)
    released_at = trio.current_time()
    pool.release(handle)
    await entry.closed.wait()
    assert trio.current_time() == released_at + GRACE + 100.0 + IN_FLIGHT_SLACK


async def test_a_lease_while_waiting_for_requests_in_flight_keeps_the_entry(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer()
    pool = new_pool(nursery, FakeNet(srv=server))
    handle = await acquire(pool)
    entry = handle.entry
    upstream = server.current
    uid = upstream.send_request("tools/call", b'{"name":"slow"}', _ignore_reply)
    pool.release(handle)
    await trio.sleep(GRACE + 1)
    again = await acquire(pool)
    assert again.entry is entry
    upstream.reply(uid, {"content": []})
    await trio.sleep(GRACE * 3)
    assert not entry.closed.is_set() and entry.state is EntryState.ACTIVE
