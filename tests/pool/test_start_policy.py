"""Start policy and start-up in the pool (L6): standby entries, the last known discovery, the
per-entry startup budget and failed starts named in the log. Fake upstreams, MockClock."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from fakes import FakeNet, FakeServer, stdio, tool

from mcpool.daemon._settings import parse_settings
from mcpool.pool import (
    EntryState,
    Handle,
    MemorySnapshotStore,
    Pool,
    PoolEntry,
    PoolOptions,
    identity_of,
)
from mcpool.pool._pool import KNOWN_SNAPSHOTS
from mcpool.protocol import SettingsError


class Listener:
    def snapshot_changed(self, entry: PoolEntry) -> None:
        pass

    def upstream_notification(self, entry: PoolEntry, method: str, params: object) -> None:
        pass

    def server_request(self, entry: PoolEntry, upstream: object, msg: object) -> str | None:
        return "no"


def new_pool(
    nursery: trio.Nursery, net: FakeNet, logs: list[str] | None = None, **options: Any
) -> Pool:
    def log(level: str, message: str, **_fields: Any) -> None:
        if logs is not None:
            logs.append(f"{level}: {message}")

    return Pool(
        nursery,
        PoolOptions(**options),
        rng=random.Random(1),
        upstream_factory=net.factory,  # type: ignore[arg-type]
        log=log,
    )


def lease(pool: Pool, name: str = "lz", **fields: Any) -> Handle:
    settings = stdio(name, **fields)
    return pool.lease(identity_of(name, settings), settings, "s1", Listener())


async def test_a_lazy_entry_with_a_known_snapshot_is_standby_and_drains_without_a_process(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("a")])
    pool = new_pool(nursery, FakeNet(lz=server), drain_grace=1.0)
    first = lease(pool, start="lazy")
    await first.entry.ready.wait()
    assert server.starts == 1  # never seen: started once to learn its lists
    pool.release(first)
    await first.entry.closed.wait()

    again = lease(pool, start="lazy")
    entry = again.entry
    assert entry.state is EntryState.STANDBY
    assert entry.ready.is_set()  # nothing to wait for: its lists are known
    assert [t["name"] for t in entry.snapshot.tools] == ["a"]
    assert entry.snapshot.available
    await trio.sleep(0.5)
    assert entry.state is EntryState.STANDBY
    pool.release(again)
    await entry.closed.wait()
    assert server.starts == 1
    assert entry.state is EntryState.CLOSED


async def test_an_eager_entry_never_uses_the_known_snapshot(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("a")])
    pool = new_pool(nursery, FakeNet(lz=server), drain_grace=1.0)
    first = lease(pool)
    await first.entry.ready.wait()
    pool.release(first)
    await first.entry.closed.wait()
    again = lease(pool)
    assert again.entry.state is EntryState.SPAWNING
    await again.entry.ready.wait()
    assert server.starts == 2


async def test_each_entry_s_startup_deadline_is_its_start_plus_the_budget(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    pool = new_pool(nursery, FakeNet(), startup_budget=2.5)
    t0 = trio.current_time()
    handle = lease(pool, "srv")
    assert handle.entry.startup_deadline == t0 + 2.5
    await trio.sleep(1)
    assert lease(pool, "srv").entry.startup_deadline == t0 + 2.5  # the same entry: no new wait


async def test_a_failed_start_is_logged_with_the_server_and_why(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("a")])
    server.always_fail = True
    logs: list[str] = []
    pool = new_pool(nursery, FakeNet(bad=server), logs)
    handle = lease(pool, "bad")
    await handle.entry.ready.wait()
    assert logs == ["warning: server 'bad' failed to start: server 'bad' failed to start"]


async def test_known_snapshots_are_bounded(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    servers = {f"s{i}": FakeServer([tool("a")]) for i in range(KNOWN_SNAPSHOTS + 3)}
    pool = new_pool(nursery, FakeNet(eager=FakeServer([tool("a")]), **servers), drain_grace=0.0)
    eager = lease(pool, "eager")
    await eager.entry.ready.wait()
    assert pool._known == {}  # only lazy servers' lists are kept
    for i in range(KNOWN_SNAPSHOTS + 3):
        handle = lease(pool, f"s{i}", start="lazy")
        await handle.entry.ready.wait()
        pool.release(handle)
        await handle.entry.closed.wait()
    assert len(pool._known) == KNOWN_SNAPSHOTS
    first = lease(pool, "s0", start="lazy")
    assert first.entry.state is EntryState.SPAWNING  # the oldest was forgotten
    last = lease(pool, f"s{KNOWN_SNAPSHOTS + 2}", start="lazy")
    assert last.entry.state is EntryState.STANDBY


async def _learned(pool: Pool, **fields: Any) -> Handle:
    """A lazy server seen once (its discovery known), drained, and leased again."""
    first = lease(pool, start="lazy", **fields)
    await first.entry.ready.wait()
    pool.release(first)
    await first.entry.closed.wait()
    return lease(pool, start="lazy", **fields)


@pytest.mark.parametrize(
    ("first", "why"),
    [
        ([], "empty: nothing listed"),
        ([tool("a"), {"description": "no name"}], "garbled: an item left out"),
        ([{"name": 3}], "garbled: its only tool left out"),
    ],
)
async def test_a_lazy_entry_whose_discovery_was_empty_or_garbled_is_discovered_again(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, first: list[Any], why: str
) -> None:
    server = FakeServer(first)
    pool = new_pool(nursery, FakeNet(lz=server), drain_grace=1.0)
    server.tools = first
    again = await _learned(pool)
    assert again.entry.state is EntryState.SPAWNING, why  # not served it forever: started
    server.tools = [tool("a"), tool("b")]
    with trio.fail_after(5):
        while again.entry.upstream is None:
            await again.entry.state_changed.wait()
    assert server.starts == 2
    assert [t["name"] for t in again.entry.snapshot.tools] == ["a", "b"]
    assert not again.entry.snapshot.cached and not again.entry.snapshot.notes


async def test_a_stored_empty_or_garbled_discovery_of_a_lazy_server_is_discovered_again(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    store = MemorySnapshotStore()
    server = FakeServer([tool("a")])
    pool = Pool(
        nursery,
        PoolOptions(drain_grace=1.0),
        rng=random.Random(1),
        upstream_factory=FakeNet(lz=server).factory,  # type: ignore[arg-type]
        snapshots=store,
    )
    handle = lease(pool, start="lazy")
    await handle.entry.ready.wait()
    fingerprint = handle.entry.identity.fingerprint
    pool.release(handle)
    await handle.entry.closed.wait()
    await store.settled()
    good = store.records[fingerprint]
    pool._known.clear()  # a cold daemon: only the store knows the server
    assert lease(pool, "lz", start="lazy").entry.state is EntryState.STANDBY  # a whole one
    for bad in (
        msgspec.structs.replace(good, tools=()),
        msgspec.structs.replace(good, notes=("tools/list: 1 malformed item left out: x",)),
        msgspec.structs.replace(good, tools=({"description": "no name"},)),
    ):
        for h in [h for e in pool.entries() for h in e.handles.values()]:
            pool.release(h)
            await h.entry.closed.wait()
        pool._known.clear()
        store.records[fingerprint] = bad
        entry = lease(pool, start="lazy").entry
        assert entry.state is EntryState.SPAWNING, bad
        assert entry.snapshot.cached  # served meanwhile, as an eager server's is
        with trio.fail_after(5):
            while entry.upstream is None:
                await entry.state_changed.wait()
        assert [t["name"] for t in entry.snapshot.tools] == ["a"]
        await store.settled()
        assert store.records[fingerprint].tools == good.tools  # the new discovery is kept


async def test_restart_of_a_standby_entry_discovers_it_again(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("a")])
    pool = new_pool(nursery, FakeNet(lz=server), drain_grace=1.0)
    again = await _learned(pool)
    entry = again.entry
    assert entry.state is EntryState.STANDBY
    server.tools = [tool("b")]
    assert pool.restart("lz") == [entry]  # `daemonctl restart`: it starts now
    with trio.fail_after(5):
        while entry.upstream is None:
            await entry.state_changed.wait()
    assert server.starts == 2
    assert [t["name"] for t in entry.snapshot.tools] == ["b"]


def test_start_and_the_daemon_options_are_validated_naming_file_server_and_field() -> None:
    doc = parse_settings(
        b'{"mcpServers": {"x": {"command": "a", "start": "lazy"}},'
        b' "daemon": {"startupBudget": 0.5, "prewarm": true}}',
        "/c.json",
    )
    assert doc.mcp_servers["x"].start == "lazy"
    assert doc.daemon is not None
    assert (doc.daemon.startup_budget, doc.daemon.prewarm) == (0.5, True)
    with pytest.raises(SettingsError) as bad:
        parse_settings(b'{"mcpServers": {"x": {"command": "a", "start": "sometimes"}}}', "/c.json")
    assert bad.value.data["server"] == "x"
    assert bad.value.data["field"] == "start"
    with pytest.raises(SettingsError) as negative:
        parse_settings(b'{"daemon": {"startupBudget": -1}}', "/c.json")
    assert negative.value.data["field"] == "daemon.startupBudget"
