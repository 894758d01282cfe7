"""Many sessions leaving at once (issue 17). DetachPacer (daemon/_connections.py): they get their
turn to close a few per loop pass, every one of them, and a waiter that is cancelled takes no
turn away from the others. IoEventQueue / order_io_events (daemon/_loop.py): one loop pass
wakes a bounded number of tasks waiting for I/O, live fds before hung-up ones, and the others on
the next passes, none lost."""

from __future__ import annotations

import select
import socket

import trio
import trio.testing

from mcpool.daemon._connections import DetachPacer
from mcpool.daemon._loop import IoEventQueue, order_io_events

WAIT = 5.0


class TurnsPerPass(trio.abc.Instrument):
    """Turns taken in each loop pass (a pass ends where the loop waits for I/O)."""

    def __init__(self) -> None:
        self.per_pass = [0]

    def before_io_wait(self, timeout: float) -> None:
        if self.per_pass[-1]:
            self.per_pass.append(0)


async def test_at_most_per_pass_take_a_turn_and_every_waiter_gets_one() -> None:
    pacer = DetachPacer(3)
    passes = TurnsPerPass()
    done: list[int] = []

    async def leave(n: int) -> None:
        await pacer.turn()
        passes.per_pass[-1] += 1
        done.append(n)

    trio.lowlevel.add_instrument(passes)
    try:
        with trio.fail_after(WAIT):
            async with trio.open_nursery() as nursery:
                for n in range(20):  # all in one pass, as readers woken by one epoll wait
                    nursery.start_soon(leave, n)
    finally:
        trio.lowlevel.remove_instrument(passes)
    assert sorted(done) == list(range(20))
    assert max(passes.per_pass) <= 3
    assert len([p for p in passes.per_pass if p]) >= 7  # 20 turns, 3 a pass


async def test_a_cancelled_waiter_takes_no_turn_away() -> None:
    pacer = DetachPacer(1)
    got: list[str] = []
    gone = trio.CancelScope()
    gone.cancel()  # its session's connection is being cancelled (the daemon stops)

    async def leave(name: str, scope: trio.CancelScope) -> None:
        with scope:
            await pacer.turn()
            got.append(name)

    with trio.fail_after(WAIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(leave, "a", trio.CancelScope())
            nursery.start_soon(leave, "cancelled", gone)
            nursery.start_soon(leave, "c", trio.CancelScope())
    assert sorted(got) == ["a", "c"]


IN, HUP = select.EPOLLIN, select.EPOLLIN | select.EPOLLHUP


def test_a_pass_with_nothing_kept_and_nothing_hung_up_is_handed_on_as_it_came() -> None:
    queue = IoEventQueue(live_per_pass=4, hangups_per_pass=2)
    fresh = [(5, IN), (6, select.EPOLLOUT)]
    assert queue.take(fresh) is fresh
    assert queue.take([]) == []


def test_live_events_go_before_hang_ups_and_each_kind_is_bounded_per_pass() -> None:
    queue = IoEventQueue(live_per_pass=3, hangups_per_pass=2)
    hung_up = [(fd, HUP) for fd in range(100, 110)]
    first = queue.take([*hung_up[:5], (7, IN), *hung_up[5:], (8, IN), (9, select.EPOLLERR)])
    assert first == [(7, IN), (8, IN), (100, HUP), (101, HUP)]
    # A live event reported later still goes before the hang-ups kept from before.
    assert queue.take([(11, IN)]) == [(11, IN), (102, HUP), (103, HUP)]
    handed = [*first, (11, IN), (102, HUP), (103, HUP)]
    while queue.live or queue.hung_up:
        handed += queue.take([])
    assert sorted(handed) == sorted([*hung_up, (7, IN), (8, IN), (9, select.EPOLLERR), (11, IN)])


def test_more_live_events_than_a_pass_takes_keep_their_order() -> None:
    queue = IoEventQueue(live_per_pass=2, hangups_per_pass=1)
    assert queue.take([(1, IN), (2, IN), (3, IN), (4, HUP), (5, IN)]) == [
        (1, IN),
        (2, IN),
        (4, HUP),
    ]
    assert queue.take([(6, IN)]) == [(3, IN), (5, IN)]
    assert queue.take([]) == [(6, IN)]
    assert not (queue.live or queue.hung_up)


async def test_one_pass_wakes_a_bounded_number_of_io_waiters_live_ones_first_and_loses_none() -> (
    None
):
    from trio._core._io_epoll import EpollIOManager

    original = EpollIOManager.get_events
    pairs = [socket.socketpair() for _ in range(200)]
    live_ours, live_theirs = socket.socketpair()
    passes = TurnsPerPass()
    woken: list[int] = []
    live_woken_after: list[int] = []
    try:

        async def reader(n: int, sock: socket.socket) -> None:
            await trio.lowlevel.wait_readable(sock)
            passes.per_pass[-1] += 1
            woken.append(n)

        async def live_reader() -> None:
            await trio.lowlevel.wait_readable(live_ours)
            live_woken_after.append(len(woken))

        with trio.fail_after(WAIT):
            async with trio.open_nursery() as nursery:
                for n, (ours, _theirs) in enumerate(pairs):
                    nursery.start_soon(reader, n, ours)
                nursery.start_soon(live_reader)
                await trio.testing.wait_all_tasks_blocked()
                # Only now: the runner of this test is already waiting with the order in force.
                order_io_events(live_per_pass=50, hangups_per_pass=10)
                trio.lowlevel.add_instrument(passes)
                for _ours, theirs in pairs:
                    theirs.close()  # every reader's fd is hung up at once...
                live_theirs.send(b"x")  # ...and then one live fd has data
    finally:
        EpollIOManager.get_events = original  # type: ignore[method-assign]
        trio.lowlevel.remove_instrument(passes)
        for ours, theirs in [*pairs, (live_ours, live_theirs)]:
            ours.close()
            theirs.close()
    assert sorted(woken) == list(range(200))
    assert max(passes.per_pass) <= 10
    # The live reader was woken in the first pass or so, not behind the 200 hang-ups.
    assert live_woken_after and live_woken_after[0] <= 10
