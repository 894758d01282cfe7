"""session/_observe.py: what a session records of each answered request, and the one inlined
copy of `CallTape.done` on the answer's hot path (session/_flight.py)."""

from __future__ import annotations

import json
from time import perf_counter
from typing import Any

import msgspec
from fakes import BytesWriter
from hypothesis import example, given
from hypothesis import strategies as st
from msgspec import UNSET, Raw, structs

from mcpool.pool._turns import Turns
from mcpool.protocol import Message
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
    tape.done((perf_counter(), "git", "sampling/createMessage", "", 0), b"", UNSET, 40)
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
