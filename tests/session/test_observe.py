"""session/_observe.py: what a session records of each answered request, and the one inlined
copy of `CallTape.done` on the answer's hot path (session/_flight.py)."""

from __future__ import annotations

import json
from time import perf_counter
from typing import Any

import msgspec
import trio
import trio.testing
from fakes import BytesWriter, FakeNet, FakeServer, FakeWriter, desired, make_pool, stdio, tool
from hypothesis import example, given
from hypothesis import strategies as st
from msgspec import UNSET, Raw, structs

from mcpool.pool._turns import Turns
from mcpool.protocol import Message
from mcpool.session import Session
from mcpool.session._flight import _InFlight
from mcpool.session._link import SessionPhase
from mcpool.session._observe import (
    ERROR,
    FLUSH_RECORDS,
    MAX_FACT_CHARS,
    MAX_FOLDER_CHARS,
    RESULT,
    TOOL_ERROR,
    CallRecord,
    CallTape,
    SessionFacts,
    Watch,
    tool_error_in,
)


def _tape(full: list[CallTape] | None = None) -> CallTape:
    return CallTape("s1", (full.append if full is not None else lambda tape: None), 1_700_000_000.0)


class _Link:
    def __init__(self) -> None:
        self.phase = SessionPhase.INITIALIZED
        self.out = BytesWriter()


class _Flights:
    """What the hot path of `_InFlight.__call__` touches of its `Flights` and handle."""

    def __init__(self, tape: CallTape) -> None:
        self.inflight: dict[Any, Any] = {}
        self.link = _Link()
        self.in_flight = 1
        self.turns = Turns()
        self.tape = tape


_results = st.fixed_dictionaries(
    {"content": st.lists(st.fixed_dictionaries({"text": st.text(max_size=8)}), max_size=2)},
    optional={
        "isError": st.booleans(),
        "structuredContent": st.dictionaries(
            st.sampled_from(["isError", "x"]), st.booleans() | st.text(max_size=4), max_size=2
        ),
    },
)


def _same_but_the_clock(a: CallRecord, b: CallRecord) -> None:
    assert structs.replace(a, duration_ms=0.0) == structs.replace(b, duration_ms=0.0)
    assert a.duration_ms >= 0.0 and b.duration_ms >= 0.0


@given(
    _results,
    st.sampled_from([", ", ","]),
    st.sampled_from(["tools/call", "prompts/get"]),
    st.integers(0, 1 << 20),
)
@example({"content": [], "isError": True}, ", ", "tools/call", 3)
@example({"content": [], "isError": True}, ",", "tools/call", 3)
@example({"content": [], "isError": True}, ",", "prompts/get", 3)
@example({"content": [], "isError": False}, ",", "tools/call", 3)
def test_the_hot_path_records_what_done_records(
    result: dict[str, Any], separator: str, method: str, sent: int
) -> None:
    """However the answer spells isError, the hot path's record is `CallTape.done`'s for the
    line it wrote (its duration read on its own clock)."""
    raw = Raw(json.dumps(result, separators=(separator, ": " if " " in separator else ":")))
    watch: Watch = (perf_counter(), "git", method, "log", sent)
    hot = _tape()
    rig = _Flights(hot)
    flight = _InFlight(rig, 7, rig, rig, None, None, uid=1, watch=watch)  # type: ignore[arg-type]
    flight(Message(jsonrpc="2.0", id=1, result=raw))
    line = bytes(rig.link.out.data)
    general = _tape()
    general.done(watch, line)
    (got,) = hot.records
    (expected,) = general.records
    _same_but_the_clock(got, expected)
    if method != "tools/call":
        assert got.outcome == RESULT
    elif result.get("isError") is True:
        assert got.outcome == TOOL_ERROR  # (a byte test: an isError key deeper counts too)
    assert got.ts == watch[0] + 1_700_000_000.0 and got.bytes_out == len(line)


@given(st.binary(max_size=64), st.booleans(), st.sampled_from([b'"isError":', b'"isError": ']))
def test_is_error_is_found_wherever_it_is(noise: bytes, value: bool, key: bytes) -> None:
    line = b'{"result":{' + noise.replace(b'"', b"") + key + (b"true" if value else b"false")
    assert tool_error_in(line) is value


def test_an_error_is_recorded_with_its_code_and_a_server_request_with_its_answer() -> None:
    tape = _tape()
    tape.done(
        (perf_counter(), "git", "tools/call", "log", 5),
        b"{}\n",
        Raw(b'{"code":-32602,"message":"bad"}'),
    )
    tape.done((perf_counter(), "git", "tools/call", "log", 5), b"{}\n", Raw(b'"no code"'))
    tape.done((perf_counter(), "git", "sampling/createMessage", "", 40), b"")
    bad, odd, asked = tape.records
    assert (bad.outcome, bad.code) == (ERROR, -32602)
    assert (odd.outcome, odd.code) == (ERROR, UNSET)
    assert (asked.outcome, asked.bytes_in, asked.bytes_out) == (RESULT, 40, 0)
    line = msgspec.json.decode(msgspec.json.encode(odd))
    assert "code" not in line  # (no code, nothing written)


def test_a_full_tape_tells_its_ledger() -> None:
    full: list[CallTape] = []
    tape = _tape(full)
    for _ in range(FLUSH_RECORDS - 1):
        tape.done((perf_counter(), "git", "tools/call", "log", 5), b"{}\n")
    assert not full
    tape.done((perf_counter(), "git", "tools/call", "log", 5), b"{}\n")
    assert full == [tape]


def test_what_a_client_says_of_itself_is_bounded() -> None:
    tape = _tape()
    tape.said("c" * 100_000, "v" * 100_000, "/f" * 100_000)
    facts = msgspec.json.decode(bytes(tape.facts), type=SessionFacts)
    assert (len(facts.client), len(facts.client_version)) == (MAX_FACT_CHARS, MAX_FACT_CHARS)
    assert len(facts.folder) == MAX_FOLDER_CHARS and facts.id == "s1"


# -- a session's records, through a real session over a fake pool ----------------------------


class _Ledger:
    """The daemon's ledger as a session meets it (`CallObserver`): tapes, kept to be read."""

    def __init__(self) -> None:
        self.tapes: list[CallTape] = []
        self.closed: list[CallTape] = []

    def open_tape(self, session: str) -> CallTape:
        self.tapes.append(CallTape(session, lambda tape: None, 0.0))
        return self.tapes[-1]

    def close_tape(self, tape: CallTape) -> None:
        self.closed.append(tape)


def _send(session: Session, obj: dict[str, Any]) -> None:
    session.handle_line(json.dumps(obj).encode())


async def test_a_session_records_its_calls_and_its_servers_requests(
    nursery: trio.Nursery,
) -> None:
    """A call is recorded with its tool and the bytes each way; a server's request with the
    client's answer's bytes as what came in (known only when it answers) and its facts."""
    net = FakeNet(srv=FakeServer(tools=[tool("t")]))
    pool = make_pool(nursery, net)
    out = FakeWriter()
    ledger = _Ledger()
    session = Session("s1", name="s1", cwd="/work", pool=pool, out=out, observer=ledger)
    nursery.start_soon(session.run_notifier)
    await session.apply_settings({"srv": desired("srv", stdio("srv"))}, 1)
    caps = {"sampling": {}}
    info = {"name": "codex-mcp-client", "version": "0.171.0"}
    params = {"protocolVersion": "2025-06-18", "capabilities": caps, "clientInfo": info}
    _send(session, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params})
    _send(session, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    await trio.testing.wait_all_tasks_blocked()
    _send(
        session,
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "srv__t"}},
    )
    up = net.servers["srv"].current
    [(uid, _, _)] = [s for s in up.sent if s[1] == "tools/call"]
    ask = Message(
        jsonrpc="2.0", id="ask", method="sampling/createMessage", params=Raw(b'{"messages":[]}')
    )
    up.events.on_server_request(up, ask)  # type: ignore[attr-defined]  (the call's: in flight)
    up.reply(uid, {"content": []})
    await trio.testing.wait_all_tasks_blocked()
    [asked] = [f for f in out.frames if f.get("method") == "sampling/createMessage"]
    answer = {"role": "assistant", "content": {"type": "text", "text": "hi"}, "model": "m"}
    _send(session, {"jsonrpc": "2.0", "id": asked["id"], "result": answer})
    await trio.testing.wait_all_tasks_blocked()
    assert [msg_id for msg_id, _, _ in up.answered] == ["ask"]
    [tape] = ledger.tapes
    called, sampled = tape.records
    assert (called.server, called.method, called.name, called.outcome) == (
        "srv",
        "tools/call",
        "t",
        RESULT,
    )
    assert called.bytes_in > 0 and called.bytes_out > 0
    assert (sampled.server, sampled.method, sampled.name) == ("srv", "sampling/createMessage", "")
    assert sampled.bytes_in == len(json.dumps(answer)) and sampled.bytes_out == 0  # as sent
    facts = msgspec.json.decode(bytes(sampled.session), type=SessionFacts)
    assert facts == SessionFacts("s1", "codex-mcp-client", "0.171.0", "/work")
    session.close("done")
    assert ledger.closed == [tape]
