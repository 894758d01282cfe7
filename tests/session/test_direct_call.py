"""Issue 17, item 6: a handshake-era tools/call takes a direct path (`_tools_call_direct`: typed
straight from its bytes, forwarded in one frame). It must answer every request, hostile ones
included, exactly as the general path (`_tools_call`, `_forward`) does: the same answers to
the client and the same params at the upstream. Each case runs twice, the second time with the
direct path turned off."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing
from fakes import (
    FakeNet,
    FakeServer,
    FakeUpstream,
    FakeWriter,
    LogLines,
    desired,
    make_pool,
    stdio,
    tool,
)

from mcpool.session import Session
from mcpool.session._requests import SessionRequests

INIT = {
    "jsonrpc": "2.0",
    "id": "init",
    "method": "initialize",
    "params": {"protocolVersion": "2025-03-26", "capabilities": {}},
}

# Each a tools/call's params as bytes on the wire (what the client controls), or a whole line.
CASES: dict[str, bytes] = {
    "plain": b'{"name":"srv__a","arguments":{"text":"x"}}',
    "no arguments": b'{"name":"srv__a"}',
    "null arguments": b'{"name":"srv__a","arguments":null}',
    "arguments first": b'{"arguments":{"n":1},"name":"srv__a"}',
    "arguments a list": b'{"name":"srv__a","arguments":[1,2]}',
    "arguments a string": b'{"name":"srv__a","arguments":"x"}',
    "arguments a number": b'{"name":"srv__a","arguments":5}',
    "name a number": b'{"name":5,"arguments":{}}',
    "name null": b'{"name":null}',
    "no name": b'{"arguments":{}}',
    "unknown tool": b'{"name":"srv__nope","arguments":{}}',
    "the upstream's own name": b'{"name":"a","arguments":{}}',
    "the prefix twice": b'{"name":"srv__srv__a","arguments":{}}',
    "escaped name": b'{"name":"srv\\u005f\\u005fa","arguments":{"t":"\\u00e9"}}',
    "duplicate name": b'{"name":"srv__nope","name":"srv__a"}',
    "unknown member": b'{"name":"srv__a","arguments":{},"x":[1,{"y":null}]}',
    "meta": b'{"name":"srv__a","_meta":{"trace":"t1"}}',
    "meta null": b'{"name":"srv__a","_meta":null}',
    "meta a list": b'{"name":"srv__a","_meta":[1]}',
    "progress token": b'{"name":"srv__a","_meta":{"progressToken":7,"k":1}}',
    "bad progress token": b'{"name":"srv__a","_meta":{"progressToken":{"x":1}}}',
    "invalid utf-8": b'{"name":"srv__a","arguments":{"t":"\xff"}}',
    "number out of range": b'{"name":"srv__a","arguments":{"n":1e999}}',
    "big integer": b'{"name":"srv__a","arguments":{"n":123456789012345678901234567890}}',
    "deep arguments": b'{"name":"srv__a","arguments":{"d":' + b"[" * 5000 + b"]" * 5000 + b"}}",
    "params a list": b'["srv__a"]',
    "params null": b"null",
}
IDS: list[Any] = [1, "s", 2**63 - 1, 2**70, -(2**40), "\u00e9\\"]


def _line(rid: Any, params: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":%b,"method":"tools/call","params":%b}' % (
        json.dumps(rid).encode(),
        params,
    )


async def _run(nursery: trio.Nursery, lines: list[bytes]) -> tuple[list[Any], list[Any]]:
    """What the client is answered and what the upstream is sent, for `lines` in order (each
    forwarded call answered by the upstream with its own params echoed)."""
    net = FakeNet(srv=FakeServer([tool("a")]))
    out, logs = FakeWriter(), LogLines()
    session = Session("s1", name="s1", cwd=None, pool=make_pool(nursery, net), out=out, log=logs)
    await session.apply_settings({"srv": desired("srv", stdio())}, 1)
    session.handle_line(json.dumps(INIT).encode())
    session.handle_line(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    await trio.testing.wait_all_tasks_blocked()
    out.frames.clear()
    upstream: FakeUpstream = net.servers["srv"].current
    for line in lines:
        session.handle_line(line)
        for uid, _method, params in list(upstream.sent):
            if uid in upstream._pending:
                upstream.reply(uid, {"content": [], "echo": params})
    sent = [(method, params) for _uid, method, params in upstream.sent]
    return list(out.frames), sent


async def _both(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, lines: list[bytes]
) -> tuple[Any, Any]:
    direct = await _run(nursery, lines)
    with monkeypatch.context() as m:
        m.setattr(SessionRequests, "_tools_call_direct", lambda self, msg: False)
        general = await _run(nursery, lines)
    return direct, general


@pytest.mark.parametrize("case", sorted(CASES))
async def test_the_direct_path_answers_as_the_general_path(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    lines = [_line(rid, CASES[case]) for rid in IDS]
    (answers, sent), (general_answers, general_sent) = await _both(nursery, monkeypatch, lines)
    assert answers == general_answers
    assert sent == general_sent
    assert len(answers) == len(IDS)  # every request answered, once


async def test_a_plain_call_takes_the_direct_path_and_reaches_the_upstream_renamed(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    general: list[Any] = []
    real = SessionRequests._tools_call

    def spy(self: Any, *args: Any) -> None:
        general.append(args)
        real(self, *args)

    monkeypatch.setattr(SessionRequests, "_tools_call", spy)
    answers, sent = await _run(nursery, [_line(1, CASES["plain"]), _line(2, CASES["meta"])])
    assert general == []  # neither went the general way
    assert sent == [
        ("tools/call", {"name": "a", "arguments": {"text": "x"}}),
        ("tools/call", {"name": "a", "_meta": {"trace": "t1"}}),
    ]
    assert [a["id"] for a in answers] == [1, 2]
    assert answers[0]["result"]["echo"]["name"] == "a"


async def test_an_id_in_flight_is_refused_before_the_direct_path(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    net = FakeNet(srv=FakeServer([tool("a")]))
    out, logs = FakeWriter(), LogLines()
    session = Session("s1", name="s1", cwd=None, pool=make_pool(nursery, net), out=out, log=logs)
    await session.apply_settings({"srv": desired("srv", stdio())}, 1)
    session.handle_line(json.dumps(INIT).encode())
    session.handle_line(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    await trio.testing.wait_all_tasks_blocked()
    out.frames.clear()
    session.handle_line(_line(9, CASES["plain"]))
    session.handle_line(_line(9, CASES["plain"]))
    upstream = net.servers["srv"].current
    assert len(upstream.sent) == 1
    (refused,) = out.frames
    assert refused["id"] == 9 and refused["error"]["code"] == -32600
