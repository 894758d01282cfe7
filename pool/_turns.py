"""Whose is a shared stdio server's request, and calls to a server that asks taken in turn.

A request a stdio server sends its client (`sampling/createMessage`, `elicitation/create`,
`roots/list`) names no call: mcpool knows whose it is only while one session alone has calls
at the server (P5). Issue 29 item 3: such a request never fails for want of an owner. Two
rules, both here and pure, the I/O in `pool/_pool.py`:

- `attribute`: the sessions it may belong to are those with calls at the server now and those
  whose calls were cut there while it may still be at them. One: it is that session's. None:
  nobody's (refused). Several: held (`Turns.unrouted`, at most MAX_UNROUTED) until they are one,
  as each call ends; never guessed (X8).
- `Turns`: once a server has sent such a request, calls from different sessions to it are
  taken in turn: a session sends while no other session's calls are there, or waits (first
  come, first served, each session's waiting requests together). The session whose turn it is
  sends more while nobody waits; once another session waits, its new requests wait behind that
  one, so a session that always has a call out cannot starve the others (each turn ends when
  its calls do, each bounded by its time limit). So from then on every request the server sends
  has one owner; only the first, if it came while several sessions' calls were there, waits for
  those calls to end.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from mcpool.protocol import Message

    from ._upstream import Upstream

MAX_UNROUTED = 32  # held server requests per entry; beyond, refused (a flood is the server's)


class Lease(Protocol):
    """What these rules read of a handle (`pool._entry.Handle`)."""

    @property
    def session_id(self) -> str: ...

    @property
    def in_flight(self) -> int: ...


L = TypeVar("L", bound=Lease)


class Verdict(enum.Enum):
    ROUTE = "route"
    HOLD = "hold"
    REFUSE = "refuse"


def attribute(handles: Iterable[L], cut: Collection[str]) -> tuple[Verdict, L | None, str]:
    """Whose a stdio server's request is (pure): route it to a handle, hold it, or refuse it
    (with why). `cut`: session ids whose calls were cut at the server lately."""
    here: dict[str, L] = {}
    owners: set[str] = set(cut)
    for h in handles:
        if h.in_flight > 0:
            owners.add(h.session_id)
            here[h.session_id] = h
        else:
            here.setdefault(h.session_id, h)
    if len(owners) > 1:
        return Verdict.HOLD, None, "several sessions have requests at this shared server"
    if not owners:
        return Verdict.REFUSE, None, "no session has a request in flight on this shared server"
    owner = here.get(next(iter(owners)))
    if owner is None:
        return Verdict.REFUSE, None, "the session it belongs to has gone"
    return Verdict.ROUTE, owner, ""


Waiter = Callable[[str | None], None]


class Turns:
    """One entry's turn-taking (see the module docstring): `on` once its server has asked."""

    __slots__ = ("holder", "on", "queue", "resuming", "unrouted")

    def __init__(self) -> None:
        self.on = False
        self.holder: str | None = None  # the session whose requests go now
        self.resuming = False  # while the holder's waiting requests are resumed (`passed`)
        self.queue: list[tuple[Lease, Waiter]] = []
        self.unrouted: list[tuple[Upstream, Message]] = []

    def may_go(self, session_id: str, busy: Iterable[str]) -> bool:
        """May this session's request go to the server now? (True: it holds the turn.)"""
        if not self.on:
            return True
        if self.holder == session_id:
            # Its waiting requests, resumed as its turn begins, go; a new one goes only while
            # nobody waits (else after them).
            return self.resuming or not self.queue
        if self.holder is None and not self.queue and all(s == session_id for s in busy):
            self.holder = session_id
            return True
        return False  # (a call's end passes the turn on: `passed`)

    def wait(self, handle: Lease, waiter: Waiter) -> None:
        self.queue.append((handle, waiter))

    def passed(self, busy: Collection[str]) -> list[Waiter]:
        """A call ended: who goes next (their waiters, to call), if the holder's calls are all
        over and no other session's are left."""
        if self.holder is not None and self.holder in busy:
            return []
        self.holder = None
        if busy or not self.queue:
            return []
        session_id = self.queue[0][0].session_id
        self.holder = session_id
        go = [w for h, w in self.queue if h.session_id == session_id]
        self.queue = [(h, w) for h, w in self.queue if h.session_id != session_id]
        return go

    def left(self, handle: Lease) -> list[Waiter]:
        """The handle was released: its waiting requests, to answer (each says why)."""
        gone = [w for h, w in self.queue if h is handle]
        if gone:
            self.queue = [(h, w) for h, w in self.queue if h is not handle]
        return gone

    def statistics(self) -> dict[str, Any]:
        return {
            "inTurn": self.on,
            "holder": self.holder,
            "waiting": len(self.queue),
            "unrouted": len(self.unrouted),
        }
