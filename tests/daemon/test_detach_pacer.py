"""Many sessions leaving at once (issue 17). DetachPacer (daemon/_connections.py): they get their
turn to close a few per loop pass, every one of them, and a waiter that is cancelled takes no
turn away from the others. bound_io_events_per_pass (daemon/_daemon.py): one loop pass wakes a
bounded number of tasks waiting for I/O, and the others on the next passes."""

from __future__ import annotations

import socket

import trio
import trio.testing

from mcpool.daemon._connections import DetachPacer
from mcpool.daemon._daemon import bound_io_events_per_pass

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


async def test_one_pass_wakes_a_bounded_number_of_io_waiters_and_loses_none() -> None:
    from trio._core._io_epoll import EpollIOManager

    unbounded = EpollIOManager.get_events
    pairs = [socket.socketpair() for _ in range(200)]
    passes = TurnsPerPass()
    woken: list[int] = []
    try:

        async def reader(n: int, sock: socket.socket) -> None:
            await trio.lowlevel.wait_readable(sock)
            passes.per_pass[-1] += 1
            woken.append(n)

        with trio.fail_after(WAIT):
            async with trio.open_nursery() as nursery:
                for n, (ours, _theirs) in enumerate(pairs):
                    nursery.start_soon(reader, n, ours)
                await trio.testing.wait_all_tasks_blocked()
                # Only now: the runner of this test is already waiting with the bound in force.
                bound_io_events_per_pass(50)
                trio.lowlevel.add_instrument(passes)
                for _ours, theirs in pairs:
                    theirs.close()  # every reader's fd is ready at once
    finally:
        EpollIOManager.get_events = unbounded  # type: ignore[method-assign]
        trio.lowlevel.remove_instrument(passes)
        for ours, theirs in pairs:
            ours.close()
            theirs.close()
    assert sorted(woken) == list(range(200))
    assert max(passes.per_pass) <= 50
