"""How the daemon's trio loop runs its passes: two changes to trio's private run-loop parts.

trio has no settings for either; each is applied only where the private class is the one it was
written against (trio is pinned to 0.35.x in pyproject.toml), and otherwise nothing changes.

- The order of I/O events (issue 17): `IoEventQueue`, through `order_io_events`, hands each
  pass's events to trio live fds first and a bounded number of each kind, so a client closing
  hundreds of sessions does not hold the other sessions' calls.
- The instruments' lookups: `quicker_instruments`. trio asks its `Instruments` (a `UserDict`)
  whether a hook is instrumented about ten times per relayed call ("before_task_step" in
  runner.instruments, per task step and per pass); each `in` ran `UserDict.__contains__` in
  Python, about 3,000 of the 157,000 instructions a call costs the daemon. A dict subclass with
  the same methods answers `in` in C.
"""

from __future__ import annotations

import collections
import select
import weakref
from typing import Any

# One loop pass wakes at most this many tasks waiting for I/O on live fds; the others wait for
# the next passes, in the order the kernel reported them. A client closing hundreds of sessions
# at once made one pass wake every one's reader, about 12 us each, and the calls of the sessions
# still attached waited behind all of them (issue 17). Busy traffic is not slowed: a pass that
# wakes fewer costs one more epoll_wait, a microsecond.
IO_EVENTS_PER_PASS = 64

# ...and at most this many on fds the kernel reports hung up (EPOLLHUP or EPOLLERR: the peer of a
# Unix socket or a pipe closed). Those go behind the live ones: their readers only find the end
# and close a session, which can wait; a live session's call should not wait behind 990 ends.
HANGUPS_PER_PASS = 16

_HUNG_UP = select.EPOLLHUP | select.EPOLLERR if hasattr(select, "EPOLLHUP") else 0


class IoEventQueue:
    """The I/O events one loop pass hands to trio, live ones first.

    trio asks epoll for every ready fd and wakes every waiter in one pass. This takes all the
    kernel has (so the order can be chosen), hands on at most `live_per_pass` live events and
    `hangups_per_pass` hang-ups a pass, and keeps the rest for the next passes. Nothing is lost
    or late for long: while events are kept the loop polls without blocking, and each pass
    hands on some of each kind. An event kept while its waiter left (cancelled) wakes nobody
    when it is handed on; if its fd was reused meanwhile, the new waiter's wake-up is spurious,
    which trio's wait_* allow (the caller reads, gets EAGAIN and waits again)."""

    __slots__ = ("hangups_per_pass", "hung_up", "live", "live_per_pass")

    def __init__(self, live_per_pass: int, hangups_per_pass: int) -> None:
        self.live: collections.deque[tuple[int, int]] = collections.deque()
        self.hung_up: collections.deque[tuple[int, int]] = collections.deque()
        self.live_per_pass = live_per_pass
        self.hangups_per_pass = hangups_per_pass

    def take(self, fresh: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """This pass's events, given those the kernel reported now."""
        live, hung_up = self.live, self.hung_up
        if not live and not hung_up and len(fresh) <= self.live_per_pass:
            for _fd, flags in fresh:
                if flags & _HUNG_UP:
                    break
            else:
                return fresh  # the common pass: nothing kept, nothing to sort
        for event in fresh:
            (hung_up if event[1] & _HUNG_UP else live).append(event)
        now = [live.popleft() for _ in range(min(len(live), self.live_per_pass))]
        now += [hung_up.popleft() for _ in range(min(len(hung_up), self.hangups_per_pass))]
        return now


def order_io_events(
    live_per_pass: int = IO_EVENTS_PER_PASS, hangups_per_pass: int = HANGUPS_PER_PASS
) -> None:
    """Make trio's epoll manager hand each pass's events through an IoEventQueue. trio has no
    setting for this: its epoll manager (a private class) asks for as many events as it has fds
    registered and wakes them all. Where that class is not what it was written against (no
    `_epoll`, another platform), nothing changes."""
    try:
        from trio._core._io_epoll import EpollIOManager
    except ImportError:
        return
    unordered = EpollIOManager.get_events
    if getattr(unordered, "ordered", False):
        return
    queues: weakref.WeakKeyDictionary[EpollIOManager, IoEventQueue] = weakref.WeakKeyDictionary()
    # The last manager's queue, read without the weak dict's lookup on every pass (a tuple, so
    # a trio run in another thread swapping it never pairs one manager with another's queue).
    last: list[tuple[EpollIOManager | None, IoEventQueue | None]] = [(None, None)]
    both_bounds = min(live_per_pass, hangups_per_pass)

    def get_events(self: EpollIOManager, timeout: float) -> Any:
        manager, queue = last[0]
        if manager is not self or queue is None:
            if getattr(self, "_epoll", None) is None or getattr(self, "_registered", None) is None:
                return unordered(self, timeout)
            queue = queues.get(self)
            if queue is None:
                queue = queues[self] = IoEventQueue(live_per_pass, hangups_per_pass)
            last[0] = (self, queue)
        if queue.live or queue.hung_up:
            timeout = 0  # events are kept: take what is new and hand some on at once
        else:
            # `take`'s common pass, inlined (two loop passes per relayed call): nothing kept
            # and no more events than either bound, so every one is handed on in this pass
            # whatever its kind; the order within a pass is trio's own (it runs a pass's woken
            # tasks in their order or reversed, at random), so `take`'s sorting would change
            # nothing.
            fresh = self._epoll.poll(timeout, len(self._registered) or 1)
            if len(fresh) <= both_bounds:
                return fresh
            return queue.take(fresh)
        return queue.take(self._epoll.poll(timeout, len(self._registered) or 1))

    get_events.ordered = True  # type: ignore[attr-defined]
    get_events.unordered = unordered  # type: ignore[attr-defined]
    EpollIOManager.get_events = get_events  # type: ignore[method-assign]


def quicker_instruments() -> None:
    """Replace the running trio loop's `Instruments` with `DictInstruments` holding the same
    hooks (call from inside `trio.run`). Nothing changes where trio's parts differ."""
    try:
        from trio._core._instrumentation import Instruments
        from trio._core._run import GLOBAL_RUN_CONTEXT
    except ImportError:
        return
    runner = getattr(GLOBAL_RUN_CONTEXT, "runner", None)
    current = getattr(runner, "instruments", None)
    if type(current) is not Instruments or not isinstance(getattr(current, "data", None), dict):
        return
    runner.instruments = DictInstruments(current.data)  # type: ignore[union-attr]


def _instruments_base() -> type:
    try:
        from trio._core._instrumentation import Instruments
    except ImportError:
        return object
    return Instruments


_Instruments: Any = _instruments_base()


class DictInstruments(dict[str, dict[Any, None]]):
    """trio's `Instruments` as a dict: the same hooks and methods (trio's own functions, which
    read `self.data`), with `in` answered by dict's C code instead of `UserDict.__contains__`."""

    __slots__ = ()

    @property
    def data(self) -> dict[str, dict[Any, None]]:
        return self

    add_instrument = getattr(_Instruments, "add_instrument", None)
    remove_instrument = getattr(_Instruments, "remove_instrument", None)
    call = getattr(_Instruments, "call", None)
