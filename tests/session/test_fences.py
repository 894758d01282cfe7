"""Issue 12: session code run by an upstream's reader task (replies, notifications, server
requests) is fenced per session: an unexpected failure is logged with its traceback and closes
that session only; the other sessions of the same upstream keep their answers and notifications.
The bug is injected (no input reaches one any more: see test_fuzz.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
import trio
import trio.testing
from fakes import FakeNet, FakeServer, FakeWriter, LogLines, desired, make_pool, stdio, tool
from msgspec import Raw

from mcpool.protocol import Message
from mcpool.session import Session, _flight
from mcpool.session._flights import Flights

INIT = {
    "jsonrpc": "2.0",
    "id": "init",
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {"sampling": {}}},
}


async def _attached(
    nursery: trio.Nursery, net: FakeNet, names: list[str]
) -> dict[str, tuple[Session, FakeWriter, list[str]]]:
    pool = make_pool(nursery, net)
    out: dict[str, tuple[Session, FakeWriter, list[str]]] = {}
    for name in names:
        writer, logs = FakeWriter(), LogLines()
        session = Session(name, name=name, cwd=None, pool=pool, out=writer, log=logs)
        nursery.start_soon(session.run_notifier)
        await session.apply_settings({"srv": desired("srv", stdio())}, 1)
        session.handle_line(json.dumps(INIT).encode())
        session.handle_line(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
        out[name] = (session, writer, logs)
    await trio.testing.wait_all_tasks_blocked()
    return out


def _call(session: Session, rid: int | str) -> None:
    call = {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": "srv__a"}}
    session.handle_line(json.dumps(call).encode())


async def test_a_failing_reply_closes_only_its_session(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    net = FakeNet(srv=FakeServer([tool("a")]))
    sessions = await _attached(nursery, net, ["victim", "bystander"])
    victim, victim_out, victim_logs = sessions["victim"]
    bystander, bystander_out, _ = sessions["bystander"]
    # String ids: an answer to one is formatted by `response_line` (an int id's is formatted
    # inline, with nothing there to sabotage).
    _call(victim, "v1")
    _call(victim, "v2")
    _call(bystander, 1)
    upstream = net.servers["srv"].current
    real = _flight.response_line

    def sabotaged(rid: Any, result: Any) -> bytes:
        if rid == "v1":
            raise RuntimeError("a bug in the reply path")
        return real(rid, result)

    monkeypatch.setattr(_flight, "response_line", sabotaged)
    first, second, third = (uid for uid, _, _ in upstream.sent)
    upstream.reply(first, {"content": []})  # the victim's: must not raise into the "reader"
    assert victim.closed
    assert "internal error in the answer from server 'srv'" in victim_logs[-1]
    assert "Traceback" in victim_logs[-1]
    # Its other call was answered with the closing error, and the upstream told to cancel it.
    (closing,) = [f for f in victim_out.responses() if f["id"] == "v2"]
    assert closing["error"]["code"] == -31007
    assert [uid for uid, _ in upstream.cancelled] == [second]
    upstream.reply(third, {"content": [{"type": "text", "text": "fine"}]})
    (answer,) = bystander_out.responses()[-1:]
    assert answer["result"]["content"][0]["text"] == "fine"
    assert not bystander.closed


async def test_a_failing_notification_or_server_request_closes_only_its_session(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    net = FakeNet(srv=FakeServer([tool("a")]))
    sessions = await _attached(nursery, net, ["victim", "bystander"])
    victim, _, victim_logs = sessions["victim"]
    bystander, bystander_out, _ = sessions["bystander"]
    real = Flights._upstream_notification

    def sabotaged(self: Flights, *args: Any) -> None:
        if self is victim.flights:
            raise RuntimeError("a bug in notification handling")
        real(self, *args)

    monkeypatch.setattr(Flights, "_upstream_notification", sabotaged)
    upstream = net.servers["srv"].current
    params = Raw(b'{"level":"info","data":"hello"}')
    upstream.events.on_notification("notifications/message", params)
    assert victim.closed and "Traceback" in victim_logs[-1]
    assert bystander_out.notifications() == ["notifications/message"]
    # A server request reaching the closed session is refused, not raised.
    _call(bystander, 5)
    ask = Message(jsonrpc="2.0", id=3, method="sampling/createMessage", params=Raw(b"{}"))
    upstream.events.on_server_request(upstream, ask)  # type: ignore[arg-type]
    assert [f["method"] for f in bystander_out.frames if "method" in f][-1] == (
        "sampling/createMessage"
    )
    assert not bystander.closed


async def test_a_relayed_result_reaches_the_client_byte_for_byte(nursery: trio.Nursery) -> None:
    # The answer's result is put under the client's id as it came, never re-encoded.
    net = FakeNet(srv=FakeServer([tool("a")]))
    sessions = await _attached(nursery, net, ["s"])
    session, _out, _ = sessions["s"]
    lines: list[bytes] = []
    session.link.out = _Lines(lines)
    result = b'{ "content":[{"type":"text","text":"\\u00e9\\/"}], "n":1.50e1 }'
    for client_id, wire_id in ((7, b"7"), ('q"u\u00e9', b'"q\\"u\xc3\xa9"')):
        session.handle_line(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": client_id,
                    "method": "tools/call",
                    "params": {"name": "srv__a"},
                }
            ).encode()
        )
        upstream = net.servers["srv"].current
        uid = upstream.sent[-1][0]
        upstream._pending.pop(uid)(Message(jsonrpc="2.0", id=uid, result=Raw(result)))
        assert lines[-1] == b'{"jsonrpc":"2.0","id":%b,"result":%b}\n' % (wire_id, result)
    assert not session.closed


class _Lines:
    """A session `out` that keeps the bytes written."""

    buffered = 0

    def __init__(self, lines: list[bytes]) -> None:
        self.lines = lines

    def write(self, data: bytes) -> None:
        self.lines.append(data)

    def write_lossy(self, data: bytes) -> bool:
        self.write(data)
        return True

    def write_parts(self, parts: Sequence[bytes]) -> None:
        self.write(b"".join(parts))

    async def wait_drained(self) -> None:
        pass
