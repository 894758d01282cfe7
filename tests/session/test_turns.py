"""Issue 29 item 3: a shared stdio server's request always reaches the session it belongs to.

The decisions (pool/_turns.py) as tables; then a real `Pool` and two real `Session`s on a fake
upstream (`FakeNet`): a request several sessions may own waits for its owner; from then on
calls from different sessions go in turn; a cut call keeps its claim for its quiet time
(MockClock); a session that leaves while waiting for its turn is answered.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from fakes import FakeNet, FakeServer, FakeUpstream, FakeWriter, desired, make_pool, stdio, tool

from mcpool.pool import Pool, ServerSettings
from mcpool.pool._entry import CUT_CALL_QUIET, Handle, PoolEntry
from mcpool.pool._turns import Turns, Verdict, attribute
from mcpool.protocol import Message
from mcpool.session import Session

# -- the decisions, pure -------------------------------------------------------------------------


def handle(session_id: str, in_flight: int) -> Handle:
    h = Handle.__new__(Handle)
    h.session_id, h.in_flight = session_id, in_flight
    return h


@pytest.mark.parametrize(
    ("calls", "cut", "verdict", "owner"),
    [
        ({"a": 1, "b": 0}, (), Verdict.ROUTE, "a"),
        ({"a": 2, "b": 0}, (), Verdict.ROUTE, "a"),
        ({"a": 1, "b": 1}, (), Verdict.HOLD, None),
        ({"a": 0, "b": 0}, (), Verdict.REFUSE, None),
        ({"a": 0, "b": 1}, ("a",), Verdict.HOLD, None),  # a's cut call may be what asks
        ({"a": 0, "b": 0}, ("a",), Verdict.ROUTE, "a"),
        ({"b": 0}, ("gone",), Verdict.REFUSE, None),  # its session has left
    ],
)
def test_whose_a_request_is(
    calls: dict[str, int], cut: tuple[str, ...], verdict: Verdict, owner: str | None
) -> None:
    got, h, _why = attribute([handle(s, n) for s, n in calls.items()], cut)
    assert got is verdict
    assert (h.session_id if h is not None else None) == owner


def test_turns_pass_in_order_each_sessions_requests_together() -> None:
    turns = Turns()
    assert turns.may_go("a", {"b"})  # off: everything goes
    turns.on = True
    assert not turns.may_go("a", {"b"})
    assert turns.may_go("b", {"b"}) and turns.holder == "b"
    a1, a2, c1 = handle("a", 0), handle("a", 0), handle("c", 0)
    calls: list[str] = []
    turns.wait(a1, lambda e: calls.append("a1"))
    turns.wait(c1, lambda e: calls.append("c1"))
    turns.wait(a2, lambda e: calls.append("a2"))
    assert turns.passed({"b"}) == []  # b's calls go on
    for waiter in turns.passed(set()):
        waiter(None)
    assert calls == ["a1", "a2"] and turns.holder == "a"
    assert not turns.may_go("c", {"a"})
    # c waits: a's next request goes after c's turn, so a busy session starves nobody.
    assert not turns.may_go("a", {"a"})
    for waiter in turns.passed(set()):
        waiter(None)
    assert calls == ["a1", "a2", "c1"] and turns.holder == "c"
    assert turns.passed(set()) == [] and turns.holder is None


# -- with a pool and sessions --------------------------------------------------------------------

CAPS = {"sampling": {}}


def send(session: Session, obj: dict[str, Any]) -> None:
    session.handle_line(json.dumps(obj).encode())


async def open_session(
    nursery: trio.Nursery, pool: Pool, name: str, servers: dict[str, ServerSettings]
) -> tuple[Session, FakeWriter]:
    out = FakeWriter()
    session = Session(name, name=name, cwd=None, pool=pool, out=out)
    nursery.start_soon(session.run_notifier)
    await session.apply_settings({n: desired(n, s) for n, s in servers.items()}, 1)
    send(
        session,
        {
            "jsonrpc": "2.0",
            "id": "init",
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": CAPS,
                "clientInfo": {"name": name},
            },
        },
    )
    send(session, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    await trio.testing.wait_all_tasks_blocked()
    return session, out


def call(session: Session, rid: int) -> None:
    send(
        session,
        {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": "srv__t"}},
    )


def asks(up: FakeUpstream, rid: str) -> None:
    msg = Message(
        jsonrpc="2.0",
        id=rid,
        method="sampling/createMessage",
        params=msgspec.Raw(b'{"messages":[],"maxTokens":5}'),
    )
    up.events.on_server_request(up, msg)  # type: ignore[attr-defined]


def asked(out: FakeWriter) -> list[dict[str, Any]]:
    return [f for f in out.frames if f.get("method") == "sampling/createMessage"]


def calls_sent(up: FakeUpstream) -> list[int]:
    return [uid for uid, method, _ in up.sent if method == "tools/call"]


async def two_sessions(
    nursery: trio.Nursery,
) -> tuple[FakeUpstream, PoolEntry, tuple[Session, FakeWriter], tuple[Session, FakeWriter]]:
    net = FakeNet(srv=FakeServer(tools=[tool("t")]))
    pool = make_pool(nursery, net)
    servers = {"srv": stdio("srv")}
    a = await open_session(nursery, pool, "a", servers)
    b = await open_session(nursery, pool, "b", servers)
    up = net.servers["srv"].current
    [entry] = pool.entries()
    return up, entry, a, b


async def test_a_request_two_sessions_may_own_waits_then_calls_go_in_turn(
    nursery: trio.Nursery,
) -> None:
    up, entry, (sa, oa), (sb, ob) = await two_sessions(nursery)
    call(sa, 1)
    call(sb, 1)
    a_call, b_call = calls_sent(up)
    asks(up, "ask-1")  # a's or b's: not known yet
    assert asked(oa) == [] and asked(ob) == [] and up.refused == []
    up.reply(a_call, {"content": []})  # a's call is over: the request was b's
    await trio.testing.wait_all_tasks_blocked()
    assert asked(oa) == [] and len(asked(ob)) == 1
    # Turns are on: a's next call waits while b's is at the server...
    call(sa, 2)
    assert calls_sent(up) == [a_call, b_call]
    up.reply(b_call, {"content": []})
    await trio.testing.wait_all_tasks_blocked()
    [*_, a_next] = calls_sent(up)
    assert a_next not in (a_call, b_call)
    # ...and what the server asks now is a's at once.
    asks(up, "ask-2")
    assert len(asked(oa)) == 1 and len(asked(ob)) == 1
    assert entry.turns.statistics()["holder"] == "a"


async def test_a_session_that_leaves_while_waiting_its_turn_is_answered(
    nursery: trio.Nursery,
) -> None:
    up, entry, (sa, _oa), (sb, ob) = await two_sessions(nursery)
    call(sa, 1)
    asks(up, "ask-1")  # a's: turns are on
    call(sb, 7)
    assert len(calls_sent(up)) == 1 and entry.turns.statistics()["waiting"] == 1
    await sb.apply_settings({}, 2)  # b's settings no longer have the server
    await trio.testing.wait_all_tasks_blocked()
    [answer] = [f for f in ob.responses() if f["id"] == 7]
    assert "srv" in json.dumps(answer["error"]), answer
    assert entry.turns.statistics()["waiting"] == 0


async def test_a_cut_call_keeps_its_claim_until_it_goes_quiet(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    up, _entry, (sa, oa), (sb, ob) = await two_sessions(nursery)
    call(sa, 1)
    call(sb, 1)
    send(sa, {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}})
    await trio.testing.wait_all_tasks_blocked()
    asks(up, "ask-1")  # b's call, or a's cut one still at work: held
    assert asked(oa) == [] and asked(ob) == []
    await trio.sleep(CUT_CALL_QUIET + 1)  # a's cut call has gone quiet: it was b's
    assert asked(oa) == [] and len(asked(ob)) == 1


async def test_a_busy_session_does_not_starve_one_that_waits(nursery: trio.Nursery) -> None:
    up, entry, (sa, _oa), (sb, _ob) = await two_sessions(nursery)
    call(sa, 1)
    asks(up, "ask-1")  # a's: turns are on, a holds the turn
    call(sb, 1)  # b waits for a's call to end
    call(sa, 2)  # a has a call there, but b waits: a's goes after b's turn
    [a1] = calls_sent(up)
    assert entry.turns.statistics()["waiting"] == 2
    up.reply(a1, {"content": []})
    await trio.testing.wait_all_tasks_blocked()
    [_, b1] = calls_sent(up)
    assert entry.turns.statistics()["holder"] == "b"
    up.reply(b1, {"content": []})
    await trio.testing.wait_all_tasks_blocked()
    assert len(calls_sent(up)) == 3 and entry.turns.statistics()["holder"] == "a"
