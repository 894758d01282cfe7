"""Issue 12, item 1, by example: what a session answers to hostile input (the fuzzer in
test_fuzz.py holds it to the general rule; these pin the documented answers)."""

from __future__ import annotations

import json
from typing import Any

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
from msgspec import Raw

from mcpool.protocol import Message
from mcpool.session import Session

INIT = {
    "jsonrpc": "2.0",
    "id": "init",
    "method": "initialize",
    "params": {"protocolVersion": "2025-03-26", "capabilities": {}},
}


class Rig:
    def __init__(self, session: Session, out: FakeWriter, upstream: FakeUpstream, logs: list[str]):
        self.session, self.out, self.upstream, self.logs = session, out, upstream, logs
        self.raw: list[bytes] = []

    def send(self, message: Any) -> None:
        self.session.handle_line(json.dumps(message).encode())

    def answer(self, rid: Any) -> dict[str, Any]:
        (found,) = [f for f in self.out.responses() if f["id"] == rid]
        return found


async def rig(nursery: trio.Nursery) -> Rig:
    net = FakeNet(srv=FakeServer([tool("a")]))
    out, logs = FakeWriter(), LogLines()
    session = Session("s1", name="s1", cwd=None, pool=make_pool(nursery, net), out=out, log=logs)
    await session.apply_settings({"srv": desired("srv", stdio())}, 1)
    session.handle_line(json.dumps(INIT).encode())
    session.handle_line(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    await trio.testing.wait_all_tasks_blocked()
    out.frames.clear()
    return Rig(session, out, net.servers["srv"].current, logs)


def call(rid: Any, name: str = "srv__a", **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": name, **params}}


async def test_a_wrong_type_is_invalid_params_naming_the_field(nursery: trio.Nursery) -> None:
    r = await rig(nursery)
    r.send(call(1, arguments=[1, 2]))
    r.send(call(2, _meta={"progressToken": {"x": 1}}))
    r.send({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"cursor": 7}})
    r.send({"jsonrpc": "2.0", "id": 4, "method": "resources/read", "params": {"uri": ["a"]}})
    fields = {rid: r.answer(rid)["error"] for rid in (1, 2, 3, 4)}
    assert {rid: e["code"] for rid, e in fields.items()} == dict.fromkeys((1, 2, 3, 4), -32602)
    assert [fields[rid]["data"]["field"] for rid in (1, 2, 3, 4)] == [
        "params.arguments",
        "params._meta.progressToken",
        "params.cursor",
        "params.uri",
    ]
    assert r.upstream.sent == []  # nothing malformed was forwarded


async def test_malformed_notifications_are_dropped_with_one_log_line(nursery: trio.Nursery) -> None:
    r = await rig(nursery)
    r.send(call(1))
    for rid in ({}, [1], 1.5, None):
        r.send(
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": rid}}
        )
    r.send({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": "x"}})
    r.send({"jsonrpc": "2.0", "id": "mcpool-9", "result": {}})  # answers nothing we asked
    assert r.out.frames == [] and r.upstream.cancelled == []
    assert len(r.session.inflight) == 1  # the call is untouched
    dropped = [line for line in r.logs if "dropped" in line]
    assert len(dropped) == 3, dropped  # cancelled (once, however often), progress, the response
    assert "params.requestId" in dropped[0]


async def test_an_id_already_in_flight_is_refused_and_the_first_call_still_answered(
    nursery: trio.Nursery,
) -> None:
    r = await rig(nursery)
    r.send(call(7))
    r.send(call(7))
    (refusal,) = r.out.responses()
    assert (
        refusal["error"]["code"] == -32600 and "already used" in refusal["error"]["data"]["reason"]
    )
    (uid, _, _) = r.upstream.sent[0]
    assert len(r.upstream.sent) == 1
    r.upstream.reply(uid, {"content": []})
    assert r.out.responses()[-1] == {"jsonrpc": "2.0", "id": 7, "result": {"content": []}}


async def test_a_batch_with_duplicate_ids_and_a_cancelled_member_is_answered_once(
    nursery: trio.Nursery,
) -> None:
    r = await rig(nursery)
    raw: list[bytes] = []
    r.out.write = raw.append  # type: ignore[method-assign]  # see the array itself
    r.send(
        [
            {"jsonrpc": "2.0", "id": 1, "method": "ping"},  # answered before call 1 starts
            call(1),
            call(2),
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}},
        ]
    )
    assert raw == []  # call 1 is still out
    assert [uid for uid, _ in r.upstream.cancelled] == [r.upstream.sent[1][0]]
    r.upstream.reply(r.upstream.sent[0][0], {"content": []})
    (line,) = raw
    answers = json.loads(line)
    assert sorted(json.dumps(a, sort_keys=True) for a in answers) == sorted(
        json.dumps(a, sort_keys=True)
        for a in (
            {"jsonrpc": "2.0", "id": 1, "result": {}},
            {"jsonrpc": "2.0", "id": 1, "result": {"content": []}},
        )
    )


async def test_closing_answers_every_call_still_in_flight(nursery: trio.Nursery) -> None:
    r = await rig(nursery)
    r.send(call(1))
    r.send(call("two"))
    r.session.close("the daemon is shutting down")
    errors = {f["id"]: f["error"] for f in r.out.responses()}
    assert set(errors) == {1, "two"}
    for error in errors.values():
        assert error["code"] == -31007
        assert error["message"] == "Session closed: the daemon is shutting down"
    assert len(r.upstream.cancelled) == 2


async def test_an_upstream_error_that_is_no_error_object_reaches_the_client_as_one(
    nursery: trio.Nursery,
) -> None:
    r = await rig(nursery)
    r.send(call(1))
    uid = r.upstream.sent[0][0]
    r.upstream._pending.pop(uid)(Message(jsonrpc="2.0", id=uid, error=Raw(b'"boom"')))
    error = r.answer(1)["error"]
    assert error["message"] == "Malformed error from server 'srv'"
    assert error["data"]["server"] == "srv" and "error" in error["data"]["reason"]
