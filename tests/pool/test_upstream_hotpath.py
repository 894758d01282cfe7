"""The per-call path of `Upstream` (issue 17 item 6): what a forwarded request puts on the wire,
and settling (`wait_settled`) now that an answer sets no event while nobody waits.

The transport keeps every written line (bytes), so this is the real `Upstream` code:
`send_request`, `_dispatch`, `wait_settled`.
"""

from __future__ import annotations

from typing import Any

import msgspec
import trio
import trio.testing
from fakes import LineUpstream
from msgspec import UNSET, Raw

from mcpool.protocol import Message


def _ignore(msg: Message) -> None:
    pass


async def test_forwarded_params_reach_the_wire_byte_for_byte() -> None:
    up = LineUpstream()
    # Spacing, key order, escapes and number forms a re-encode would change.
    params = b'{ "name" : "echo", "arguments":{"t":"\\u00e9\\/","n":1.50e1,"z":[ ]}, "x":null }'
    uid = up.send_request("tools/call", params, _ignore)
    (line,) = up.lines
    assert line == b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":%b}\n' % (uid, params)
    assert msgspec.json.decode(line)["params"] == msgspec.json.decode(params)
    up.send_request("tools/call", Raw(params), _ignore)
    assert up.lines[1].endswith(b'"params":%b}\n' % params)


async def test_a_request_without_params_has_no_params_member() -> None:
    up = LineUpstream()
    uid = up.send_request("ping", UNSET, _ignore)
    assert up.lines == [b'{"jsonrpc":"2.0","id":%d,"method":"ping"}\n' % uid]


async def test_ids_are_minted_in_order_and_answers_reach_their_callbacks() -> None:
    up = LineUpstream()
    got: list[Any] = []
    first = up.send_request("tools/call", b"{}", lambda m: got.append(("a", m.id)))
    second = up.send_request("tools/call", b"{}", lambda m: got.append(("b", m.id)))
    assert second == first + 1
    up.answer(second)
    up.answer(first)
    up.answer(first)  # a repeated answer: nobody waits for it any more
    assert got == [("b", second), ("a", first)]
    assert up.in_flight == 0


async def test_wait_settled_returns_once_the_last_answer_arrives() -> None:
    up = LineUpstream()
    with trio.fail_after(5):
        await up.wait_settled()  # nothing in flight: at once
        a = up.send_request("tools/call", b"{}", _ignore)
        b = up.send_request("tools/call", b"{}", _ignore)
        settled = trio.Event()

        async def waiter() -> None:
            await up.wait_settled()
            settled.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            up.answer(a)
            await trio.testing.wait_all_tasks_blocked()
            assert not settled.is_set()  # one still in flight
            up.answer(b)
            await settled.wait()


async def test_answers_with_nobody_waiting_leave_later_waits_working() -> None:
    up = LineUpstream()
    with trio.fail_after(5):
        for _ in range(3):  # settle with no waiter, several times over
            up.answer(up.send_request("tools/call", b"{}", _ignore))
        await up.wait_settled()
        uid = up.send_request("tools/call", b"{}", _ignore)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(up.wait_settled)
            await trio.testing.wait_all_tasks_blocked()
            up.answer(uid)


async def test_two_waiters_are_both_released() -> None:
    up = LineUpstream()
    uid = up.send_request("tools/call", b"{}", _ignore)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(up.wait_settled)
            nursery.start_soon(up.wait_settled)
            await trio.testing.wait_all_tasks_blocked()
            up.answer(uid)
