"""Request time limits (issue 12 item 8): the deadline heap of `Upstream`, on MockClock.

The transport is the smallest one possible (every written line is kept), so what is tested is the
real `Upstream` code: `send_request`, `_expire_requests` (the one timer task per connection) and
`expire_requests`. The pool's choice of the limit (the entry's `timeout`, else the daemon's) is
tested on a fake upstream.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import trio
import trio.testing
from fakes import FakeNet, FakeServer, LineUpstream, make_pool, stdio

from mcpool.pool import identity_of
from mcpool.pool._upstream import DEADLINE_COMPACT_SLACK
from mcpool.protocol import UPSTREAM_TIMEOUT, McpoolError, Message

EPSILON = 1e-6  # virtual seconds either side of an exact MockClock deadline


class WireUpstream(LineUpstream):
    """A `LineUpstream` read as the messages written to it."""

    def __init__(self) -> None:
        super().__init__(max_line=1 << 20)

    @property
    def wire(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines]

    def cancels(self) -> list[dict[str, Any]]:
        return [m["params"] for m in self.wire if m.get("method") == "notifications/cancelled"]


class Replies:
    def __init__(self) -> None:
        self.got: list[Message] = []

    def __call__(self, msg: Message) -> None:
        self.got.append(msg)

    def error(self, index: int = 0) -> dict[str, Any]:
        msg = self.got[index]
        assert not isinstance(msg.error, msgspec.UnsetType), msg
        decoded: dict[str, Any] = msgspec.json.decode(msg.error)
        return decoded


async def test_an_unanswered_request_gets_a_timeout_error_and_a_cancel_at_its_limit(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    up = WireUpstream()
    up.request_timeout = 5.0
    nursery.start_soon(up._expire_requests)
    replies = Replies()
    sent_at = trio.current_time()
    uid = up.send_request("tools/call", b'{"name":"x"}', replies)
    await trio.sleep_until(sent_at + 5.0 - EPSILON)
    assert replies.got == []
    assert up.cancels() == []
    await trio.sleep_until(sent_at + 5.0 + EPSILON)
    assert len(replies.got) == 1
    err = replies.error()
    assert err["code"] == UPSTREAM_TIMEOUT
    assert "'srv'" in err["message"] and "5 s" in err["message"], err
    assert err["data"]["server"] == "srv" and err["data"]["timeout"] == 5.0, err
    assert err["data"]["method"] == "tools/call"
    assert up.cancels() == [{"requestId": uid, "reason": err["data"]["reason"]}]
    assert up.in_flight == 0
    up.answer(uid)  # a late answer is dropped: the caller got its one reply
    assert len(replies.got) == 1


async def test_a_request_answered_in_time_is_neither_failed_nor_cancelled(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    up = WireUpstream()
    up.request_timeout = 5.0
    nursery.start_soon(up._expire_requests)
    replies = Replies()
    uid = up.send_request("tools/call", b"{}", replies)
    await trio.sleep(4.0)
    up.answer(uid)
    await trio.sleep(60.0)
    assert len(replies.got) == 1 and isinstance(replies.got[0].error, msgspec.UnsetType)
    assert up.cancels() == []


async def test_each_request_expires_at_its_own_deadline_and_a_shorter_limit_wakes_the_timer(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    up = WireUpstream()
    nursery.start_soon(up._expire_requests)
    long_, short = Replies(), Replies()
    start = trio.current_time()
    up.request_timeout = 100.0
    up.send_request("tools/call", b"{}", long_)
    await trio.sleep(1.0)
    up.request_timeout = 2.0  # the daemon option changed: later requests get the new limit
    up.send_request("tools/call", b"{}", short)
    await trio.sleep_until(start + 3.0 + EPSILON)
    assert len(short.got) == 1 and short.error()["data"]["timeout"] == 2.0
    assert long_.got == []
    await trio.sleep_until(start + 100.0 + EPSILON)
    assert len(long_.got) == 1 and long_.error()["data"]["timeout"] == 100.0


async def test_the_daemons_own_calls_are_bounded_by_call_not_by_the_request_limit(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    up = WireUpstream()
    up.request_timeout = 1.0
    nursery.start_soon(up._expire_requests)
    uid = up._next_id
    failed: list[McpoolError] = []

    async def own_call() -> None:
        try:
            await up.call("tools/list", {}, timeout=5.0)
        except McpoolError as exc:
            failed.append(exc)

    nursery.start_soon(own_call)
    await trio.sleep(3.0)
    assert up.cancels() == []  # still pending: call() owns its 5 s bound
    assert uid in up._pending
    await trio.sleep(3.0)
    assert len(failed) == 1 and failed[0].data["timeout"] == 5.0
    assert [c["requestId"] for c in up.cancels()] == [uid]


async def test_answered_requests_do_not_pile_up_in_the_deadline_heap(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    up = WireUpstream()
    up.request_timeout = 600.0
    nursery.start_soon(up._expire_requests)
    replies = Replies()
    for _ in range(20_000):
        up.answer(up.send_request("tools/call", b"{}", replies))
    assert len(up._due) + len(up._deadlines) <= DEADLINE_COMPACT_SLACK + 2
    assert len(replies.got) == 20_000


async def test_limits_changing_both_ways_expire_each_request_at_its_own_deadline(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    # Deadlines in order go to the end of a queue, any earlier than the last one to the heap:
    # the timer serves both, earliest first.
    up = WireUpstream()
    nursery.start_soon(up._expire_requests)
    start = trio.current_time()
    expired: list[tuple[float, float]] = []

    def limit_of(msg: Message) -> None:
        assert not isinstance(msg.error, msgspec.UnsetType)
        timeout = msgspec.json.decode(msg.error)["data"]["timeout"]
        expired.append((round(trio.current_time() - start, 3), timeout))

    for limit in (10.0, 2.0, 10.0, 5.0, 1.0, 20.0):
        up.request_timeout = limit
        up.send_request("tools/call", b"{}", limit_of)
        await trio.sleep(0.5)
    await trio.sleep(30.0)
    # Sent at 0, 0.5, 1.0, 1.5, 2.0 and 2.5 s.
    assert expired == [(2.5, 2.0), (3.0, 1.0), (6.5, 5.0), (10.0, 10.0), (11.0, 10.0), (22.5, 20.0)]
    assert len(up.cancels()) == 6


async def test_the_deadlines_are_read_from_the_runs_own_clock(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The run's clock (public API: trio.lowlevel.current_clock()), a MockClock here.
    up = WireUpstream()
    assert up._read_clock() == autojump_clock.current_time
    await trio.sleep(5.0)
    assert up._read_clock()() == trio.current_time()


async def test_the_pool_bounds_requests_by_the_entry_timeout_else_the_daemon_default(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    pool = make_pool(nursery, FakeNet(a=FakeServer(), b=FakeServer()), request_timeout=42.0)

    async def upstream_of(name: str, **fields: Any) -> Any:
        settings = stdio(name, **fields)
        handle = await pool.acquire(identity_of(name, settings), settings, "s", _Listener())
        return handle.entry.upstream

    with_own = await upstream_of("a", timeout=2500)
    with_default = await upstream_of("b")
    assert with_own.request_timeout == 2.5
    assert with_default.request_timeout == 42.0
    pool.options = msgspec.structs.replace(pool.options, request_timeout=7.0)
    assert with_own.request_timeout == 2.5  # the entry's own limit wins
    assert with_default.request_timeout == 7.0


class _Listener:
    def snapshot_changed(self, entry: Any) -> None:
        pass

    def upstream_notification(self, entry: Any, method: str, params: Any) -> None:
        pass

    def server_request(self, entry: Any, upstream: Any, msg: Any) -> None:
        return None


async def test_send_checked_is_send_request_without_its_checks_a_line_and_a_deadline_alike(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    # The direct tools/call path's send: the same wire line, the same id sequence, the same
    # deadline as `send_request` (which takes this way itself for such a request).
    up = WireUpstream()
    nursery.start_soon(up._expire_requests)
    up.request_timeout = 5.0
    checked, general = Replies(), Replies()
    first = up.send_checked("tools/call", b'{"name":"a"}', checked)
    second = up.send_request("tools/call", b'{"name":"a"}', general)
    assert second == first + 1
    assert [m["params"] for m in up.wire] == [{"name": "a"}, {"name": "a"}]
    assert [m["id"] for m in up.wire] == [first, second]
    await trio.sleep(5.0 - EPSILON)
    assert checked.got == general.got == []
    await trio.sleep(2 * EPSILON)
    assert checked.error()["data"]["timeout"] == general.error()["data"]["timeout"] == 5.0
    assert [c["requestId"] for c in up.cancels()] == [first, second]
