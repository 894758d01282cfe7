"""Issue 17, item 6: a handshake-era tools/call takes a direct path (`_call_direct`: typed
straight from its bytes, forwarded in one frame; reached from `handle_line`, which types the
whole line in one decode, or from `_tools_call_direct` for a line of another shape). It must
answer every request, hostile ones included, exactly as the general path (`_tools_call`,
`_forward`) does: the same answers to the client and the same params at the upstream. Each case
runs twice, the second time with the direct path turned off."""

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

from mcpool.session import Session, _requests
from mcpool.session._requests import Requests

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

P = b'{"name":"srv__a","arguments":{"text":"x"}}'
BAD = b'{"name":"srv__a","arguments":5}'
# Whole lines around plain params (what `handle_line`'s one decode must accept or hand on).
LINES: dict[str, bytes] = {
    "members reordered": b'{"params":%b,"method":"tools/call","id":3,"jsonrpc":"2.0"}' % P,
    "whitespace": b' { "jsonrpc" : "2.0" ,\t"id" : 3 , "method" : "tools/call" , "params" : %b } '
    % P,
    "escaped method": b'{"jsonrpc":"2.0","id":3,"method":"tools\\/call","params":%b}' % P,
    "escaped version": b'{"jsonrpc":"2\\u002e0","id":3,"method":"tools/call","params":%b}' % P,
    "unknown envelope member": b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":%b,"x":1}'
    % P,
    "with a result": b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":%b,"result":{}}' % P,
    "with an error": b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":%b,"error":{}}' % P,
    "version 1.0": b'{"jsonrpc":"1.0","id":3,"method":"tools/call","params":%b}' % P,
    "no version": b'{"id":3,"method":"tools/call","params":%b}' % P,
    "version a number": b'{"jsonrpc":2.0,"id":3,"method":"tools/call","params":%b}' % P,
    "null id": b'{"jsonrpc":"2.0","id":null,"method":"tools/call","params":%b}' % P,
    "no id": b'{"jsonrpc":"2.0","method":"tools/call","params":%b}' % P,
    "float id": b'{"jsonrpc":"2.0","id":1.5,"method":"tools/call","params":%b}' % P,
    "object id": b'{"jsonrpc":"2.0","id":{},"method":"tools/call","params":%b}' % P,
    "no params": b'{"jsonrpc":"2.0","id":3,"method":"tools/call"}',
    "another method": b'{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{}}',
    "another method, plain params": b'{"jsonrpc":"2.0","id":3,"method":"prompts/get","params":%b}'
    % P,
    "version 2.00": b'{"jsonrpc":"2.00","id":3,"method":"tools/call","params":%b}' % P,
    "duplicate params, bad last": b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":%b,'
    b'"params":%b}' % (P, BAD),
    "duplicate params, bad first": b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":%b,'
    b'"params":%b}' % (BAD, P),
    "duplicate method": b'{"jsonrpc":"2.0","id":3,"method":"tools/call","method":"ping",'
    b'"params":%b}' % P,
    "duplicate id": b'{"jsonrpc":"2.0","id":3,"id":4,"method":"tools/call","params":%b}' % P,
    "trailing garbage": b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":%b}x' % P,
    "truncated": b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":%b' % P,
    "a batch of one": b'[{"jsonrpc":"2.0","id":3,"method":"tools/call","params":%b}]' % P,
    "not utf-8 outside params": b'{"jsonrpc":"2.0","id":"\xff","method":"tools/call","params":%b}'
    % P,
}


def _line(rid: Any, params: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":%b,"method":"tools/call","params":%b}' % (
        json.dumps(rid).encode(),
        params,
    )


async def _ready(nursery: trio.Nursery) -> tuple[Session, FakeWriter, FakeNet]:
    """A handshake-era session past initialize, with one server "srv" of one tool "a"."""
    net = FakeNet(srv=FakeServer([tool("a")]))
    out, logs = FakeWriter(), LogLines()
    session = Session("s1", name="s1", cwd=None, pool=make_pool(nursery, net), out=out, log=logs)
    await session.apply_settings({"srv": desired("srv", stdio())}, 1)
    session.handle_line(json.dumps(INIT).encode())
    session.handle_line(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    await trio.testing.wait_all_tasks_blocked()
    out.frames.clear()
    return session, out, net


async def _run(nursery: trio.Nursery, lines: list[bytes]) -> tuple[list[Any], list[Any]]:
    """What the client is answered and what the upstream is sent, for `lines` in order (each
    forwarded call answered by the upstream with its own params echoed)."""
    session, out, net = await _ready(nursery)
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
        m.setattr(Requests, "_call_direct", lambda self, client_id, call: False)
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


@pytest.mark.parametrize("case", sorted(LINES))
async def test_a_line_of_any_shape_is_answered_as_the_general_path_answers_it(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    # Twice: the second time its id is in flight (or was answered) already.
    (answers, sent), (general_answers, general_sent) = await _both(
        nursery, monkeypatch, [LINES[case], LINES[case]]
    )
    assert answers == general_answers
    assert sent == general_sent


async def test_a_plain_line_is_decoded_once(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded: list[bytes] = []
    real = _requests.decode

    def spy(line: bytes) -> Any:
        if b"tools/call" in line:  # not the handshake's lines
            decoded.append(line)
        return real(line)

    monkeypatch.setattr(_requests, "decode", spy)
    answers, sent = await _run(nursery, [_line(1, CASES["plain"]), _line("two", CASES["meta"])])
    assert decoded == []  # neither went through the envelope's decode
    assert [a["id"] for a in answers] == [1, "two"]
    assert sent == [
        ("tools/call", {"name": "a", "arguments": {"text": "x"}}),
        ("tools/call", {"name": "a", "_meta": {"trace": "t1"}}),
    ]
    # A line of another shape is decoded the general way (and still served directly).
    await _run(nursery, [LINES["unknown envelope member"]])
    assert len(decoded) == 1


async def test_a_plain_call_takes_the_direct_path_and_reaches_the_upstream_renamed(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    general: list[Any] = []
    real = Requests._tools_call

    def spy(self: Any, *args: Any) -> None:
        general.append(args)
        real(self, *args)

    monkeypatch.setattr(Requests, "_tools_call", spy)
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
    session, out, net = await _ready(nursery)
    session.handle_line(_line(9, CASES["plain"]))
    session.handle_line(_line(9, CASES["plain"]))
    upstream = net.servers["srv"].current
    assert len(upstream.sent) == 1
    (refused,) = out.frames
    assert refused["id"] == 9 and refused["error"]["code"] == -32600


async def _mid_reload(
    nursery: trio.Nursery, lines: list[bytes]
) -> tuple[list[Any], list[Any], trio.Event]:
    """`_run`'s answers and sends, with the session serving a generation its settings no longer
    allow: a change excluded srv's tool `a`, removed server `gone` and waits for a slow one."""
    net = FakeNet(
        srv=FakeServer([tool("a"), tool("b")]), gone=FakeServer([tool("x")]), slow=FakeServer([])
    )
    out = FakeWriter()
    session = Session("s1", name="s1", cwd=None, pool=make_pool(nursery, net), out=out)
    await session.apply_settings(
        {"srv": desired("srv", stdio("srv")), "gone": desired("gone", stdio("gone"))}, 1
    )
    session.handle_line(json.dumps(INIT).encode())
    session.handle_line(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    await trio.testing.wait_all_tasks_blocked()
    served = session.registry
    net.servers["slow"].start_gate = gate = trio.Event()
    changed = {
        "srv": desired("srv", stdio("srv", excludeTools=["a"])),
        "slow": desired("slow", stdio("slow")),
    }
    nursery.start_soon(session.apply_settings, changed, 2)
    await trio.testing.wait_all_tasks_blocked()
    assert session.registry is served  # still served, no longer allowed in part
    out.frames.clear()
    upstream: FakeUpstream = net.servers["srv"].current
    for line in lines:
        session.handle_line(line)
        for uid, _method, _params in list(upstream.sent):
            if uid in upstream._pending:
                upstream.reply(uid, {"content": []})
    sent = [(method, params) for _uid, method, params in upstream.sent]
    return list(out.frames), sent, gate


async def test_the_direct_path_refuses_what_the_general_path_refuses_while_a_reload_waits(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The inlined copy of `Catalog.allows` in `_call_direct` against the general path, in the
    # states where the served list and the policy disagree: a filtered tool, a removed server
    # (its handle released), an allowed tool.
    lines = [
        _line(1, b'{"name":"srv__a","arguments":{}}'),
        _line(2, b'{"name":"gone__x","arguments":{}}'),
        _line(3, b'{"name":"srv__b","arguments":{}}'),
    ]
    answers, sent, gate = await _mid_reload(nursery, lines)
    gate.set()
    with monkeypatch.context() as m:
        m.setattr(Requests, "_call_direct", lambda self, client_id, call: False)
        general_answers, general_sent, general_gate = await _mid_reload(nursery, lines)
        general_gate.set()
    assert answers == general_answers
    assert sent == general_sent == [("tools/call", {"name": "b", "arguments": {}})]
    refused = [a["id"] for a in answers if a["result"].get("isError")]
    assert refused == [1, 2]  # a tool error, as the general path answers an unknown tool
