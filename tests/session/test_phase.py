"""The session's phase (session/_link.py): a transition table, read by `next_phase`, and the
moves a real `Session` makes as a client speaks to it."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
import trio
import trio.testing
from fakes import FakeNet, FakeWriter, make_pool

from mcpool.session import Session
from mcpool.session._link import PHASE_MOVES, PhaseEvent, SessionPhase, next_phase

P, E = SessionPhase, PhaseEvent

# Every (phase, event) pair and where it goes: the whole table, written out once more so that a
# change to PHASE_MOVES is a change to this test too.
EXPECTED = {
    (P.NEW, E.INITIALIZE_ANSWERED): P.ANSWERED,
    (P.NEW, E.CLIENT_INITIALIZED): P.NEW,  # initialized before the answer: ignored
    (P.NEW, E.SPOKE_MODERN): P.MODERN,
    (P.NEW, E.CLOSED): P.CLOSED,
    (P.ANSWERED, E.INITIALIZE_ANSWERED): P.ANSWERED,  # a second initialize changes nothing
    (P.ANSWERED, E.CLIENT_INITIALIZED): P.INITIALIZED,
    (P.ANSWERED, E.SPOKE_MODERN): P.ANSWERED,  # the era is decided by the first request
    (P.ANSWERED, E.CLOSED): P.CLOSED,
    (P.INITIALIZED, E.INITIALIZE_ANSWERED): P.INITIALIZED,
    (P.INITIALIZED, E.CLIENT_INITIALIZED): P.INITIALIZED,
    (P.INITIALIZED, E.SPOKE_MODERN): P.INITIALIZED,
    (P.INITIALIZED, E.CLOSED): P.CLOSED,
    (P.MODERN, E.INITIALIZE_ANSWERED): P.MODERN,
    (P.MODERN, E.CLIENT_INITIALIZED): P.MODERN,
    (P.MODERN, E.SPOKE_MODERN): P.MODERN,
    (P.MODERN, E.CLOSED): P.CLOSED,
    **{(P.CLOSED, e): P.CLOSED for e in E},  # a closed session stays closed
}


def test_the_table_covers_every_pair_as_written_out() -> None:
    assert set(EXPECTED) == set(itertools.product(P, E))
    for (phase, event), to in EXPECTED.items():
        assert next_phase(phase, event) is to, (phase, event)


def test_the_table_lists_only_real_moves() -> None:
    # A pair listed in PHASE_MOVES moves; one that does not move is not listed.
    assert all(to is not phase for (phase, _e), to in PHASE_MOVES.items())


@pytest.mark.parametrize("start", list(P))
def test_closing_ends_every_phase(start: SessionPhase) -> None:
    assert next_phase(start, E.CLOSED) is P.CLOSED


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": "init",
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t"}},
}
MODERN_PING = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "ping",
    "params": {
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {},
        }
    },
}


def send(session: Session, obj: dict[str, Any]) -> None:
    session.handle_line(json.dumps(obj).encode())


async def opened(nursery: trio.Nursery) -> tuple[Session, FakeWriter]:
    out = FakeWriter()
    session = Session("s1", name="s1", cwd=None, pool=make_pool(nursery, FakeNet()), out=out)
    nursery.start_soon(session.run_notifier)
    await session.apply_settings({}, 1)
    return session, out


async def test_a_handshake_session_moves_new_answered_initialized_closed(
    nursery: trio.Nursery,
) -> None:
    session, out = await opened(nursery)
    assert session.link.phase is P.NEW
    send(session, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert session.link.phase is P.NEW  # before the answer: ignored
    send(session, INITIALIZE)
    await trio.testing.wait_all_tasks_blocked()
    assert [r["id"] for r in out.responses()] == ["init"]
    assert session.link.phase is P.ANSWERED
    assert session.initialize_answered and not session.initialized
    send(session, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert session.link.phase is P.INITIALIZED and session.initialized
    session.close("done")
    assert session.link.phase is P.CLOSED and session.closed
    assert session.close_reason == "done"


async def test_a_2026_session_moves_new_modern_closed(nursery: trio.Nursery) -> None:
    session, out = await opened(nursery)
    send(session, MODERN_PING)
    await trio.testing.wait_all_tasks_blocked()
    assert [r["id"] for r in out.responses()] == [1]
    assert session.link.phase is P.MODERN
    assert session.initialize_answered and session.initialized
    session.close("done")
    session.close("again")  # once: the first reason stays
    assert session.link.phase is P.CLOSED and session.close_reason == "done"
