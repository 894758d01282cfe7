"""Many sessions leaving at once (issue 17). DetachPacer (daemon/_connections.py): they get their
turn to close a few per loop pass, every one of them, and a waiter that is cancelled takes no
turn away from the others."""

from __future__ import annotations

import select

import trio
import trio.testing

from mcpool.daemon._connections import DetachPacer

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
