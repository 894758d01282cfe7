"""Shared upstream state kept by counts (P6, logging levels; pool/_shared.py, issue 17).

The counts must always give what a from-scratch recount over the entry's handles gives, and the
upstream must hear the same setLevel/unsubscribe requests as before, however many sessions come
and go and in whatever order.
"""

from __future__ import annotations

import random
from typing import Any

import trio
import trio.testing
from fakes import FakeNet, FakeServer, make_pool, stdio, tool

from mcpool.pool import Handle, Pool, PoolEntry, identity_of
from mcpool.pool._entry import LOG_LEVELS
from mcpool.pool._shared import _LEVELS

URIS = [f"file:///r{i}" for i in range(6)]


class Listener:
    def snapshot_changed(self, entry: PoolEntry) -> None:
        pass

    def upstream_notification(self, entry: PoolEntry, method: str, params: object) -> None:
        pass

    def server_request(self, entry: PoolEntry, upstream: object, msg: object) -> bool:
        return False


def recount_level(entry: PoolEntry) -> str | None:
    levels = [h.log_level for h in entry.handles.values() if h.log_level in LOG_LEVELS]
    return min(levels, key=LOG_LEVELS.index) if levels else None


def recount_uris(entry: PoolEntry) -> set[str]:
    return {uri for h in entry.handles.values() for uri in h.subscriptions}


async def acquire(pool: Pool, session: str) -> Handle:
    settings = stdio("srv")
    return await pool.acquire(identity_of("srv", settings), settings, session, Listener())


def sent(upstream: Any, method: str) -> list[Any]:
    return [params for _, m, params in upstream.sent if m == method]


def test_the_level_order_is_the_entrys() -> None:
    assert _LEVELS == LOG_LEVELS


async def test_counts_match_a_recount_through_random_attach_detach_levels_and_subscriptions(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    rng = random.Random(17)
    pool = make_pool(nursery, FakeNet(srv=FakeServer([tool("t")])), drain_grace=30.0)
    held: list[Handle] = [await acquire(pool, "s0")]
    entry = held[0].entry
    upstream: Any = entry.upstream
    # What the upstream was told, replayed: the subscriptions it holds and its level.
    told_uris: set[str] = set()
    for step in range(2000):
        op = rng.random()
        if op < 0.25 or not held:
            held.append(await acquire(pool, f"s{step}"))
        elif op < 0.45:
            handle = held.pop(rng.randrange(len(held)))
            before = len(upstream.sent)
            pool.release(handle)
            for _, method, params in upstream.sent[before:]:
                if method == "resources/unsubscribe":
                    told_uris.discard(params["uri"])
        elif op < 0.65:
            rng.choice(held).log_level = rng.choice([*LOG_LEVELS, None, "bogus"])
        elif op < 0.85:
            handle, uri = rng.choice(held), rng.choice(URIS)
            if entry.subscribe(handle, uri):
                told_uris.add(uri)
        else:
            handle, uri = rng.choice(held), rng.choice(URIS)
            if uri in handle.subscriptions and entry.unsubscribe(handle, uri):
                told_uris.discard(uri)
        assert entry.effective_log_level() == recount_level(entry), step
        assert entry.subscribed_uris() == recount_uris(entry), step
        assert told_uris == recount_uris(entry), step
    for handle in held:
        pool.release(handle)
    assert entry.effective_log_level() is None
    assert entry.subscribed_uris() == set()


async def test_bulk_detach_tells_the_upstream_what_the_last_holders_leaving_change(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    pool = make_pool(nursery, FakeNet(srv=FakeServer([tool("t")])), drain_grace=30.0)
    handles = [await acquire(pool, f"s{i}") for i in range(1000)]
    entry = handles[0].entry
    upstream: Any = entry.upstream
    assert len({h.entry for h in handles}) == 1
    handles[0].log_level = "debug"
    for h in handles[1:]:
        h.log_level = "error"
    assert entry.subscribe(handles[0], URIS[0])
    assert not entry.subscribe(handles[-1], URIS[0])
    assert entry.subscribe(handles[500], URIS[1])
    upstream.sent.clear()

    pool.release(handles[0])  # the debug one: the level goes up to error
    assert sent(upstream, "logging/setLevel") == [{"level": "error"}]
    assert sent(upstream, "resources/unsubscribe") == []  # handles[-1] still holds it
    for h in handles[1:-1]:
        pool.release(h)
    assert sent(upstream, "resources/unsubscribe") == [{"uri": URIS[1]}]
    assert sent(upstream, "logging/setLevel") == [{"level": "error"}]
    assert entry.leases == 1
    pool.release(handles[-1])
    assert sent(upstream, "resources/unsubscribe") == [{"uri": URIS[1]}, {"uri": URIS[0]}]
    assert entry.leases == 0
    assert entry.effective_log_level() is None
    # A released handle's later changes count nowhere.
    handles[3].log_level = "debug"
    assert entry.effective_log_level() is None


async def test_a_restart_restores_the_counted_level_and_subscriptions(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    pool = make_pool(nursery, FakeNet(srv=FakeServer([tool("t")])), drain_grace=30.0)
    a, b = await acquire(pool, "a"), await acquire(pool, "b")
    entry = a.entry
    a.log_level, b.log_level = "warning", "info"
    entry.subscribe(a, URIS[2])
    entry.subscribe(b, URIS[1])
    pool.release(b)
    old = entry.upstream
    pool.restart_entry(entry)
    with trio.fail_after(60):
        while entry.upstream is old or entry.upstream is None or not entry.upstream.alive:
            await trio.sleep(0.1)
        await trio.sleep(1)
    upstream: Any = entry.upstream
    assert sent(upstream, "logging/setLevel") == [{"level": "warning"}]
    assert sent(upstream, "resources/subscribe") == [{"uri": URIS[2]}]
