"""The statistics and the audit log (daemon/_stats.py, daemon/_audit.py), as the ledger
(daemon/_ledger.py) feeds them."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from time import perf_counter

import msgspec
import pytest
import trio
import trio.testing
from fakes import CLIENT_FACTS, call_record
from hypothesis import given
from hypothesis import strategies as st
from msgspec import Raw

from mcpool.daemon import _ledger
from mcpool.daemon._audit import AuditLine, AuditLog, lines_of, read_audit
from mcpool.daemon._ledger import Ledger
from mcpool.daemon._stats import EDGES, Counters, Stats, bucket_of, bucket_top, percentiles
from mcpool.session._observe import ERROR, RESULT, TOOL_ERROR, CallTape, OutcomeName, SessionFacts


def test_a_duration_is_read_back_within_its_bucket() -> None:
    for ms in (0.002, 0.5, 1.0, 37.0, 1234.5, 60_000.0):
        top = bucket_top(bucket_of(ms))
        assert ms <= top <= ms * 1.05, (ms, top)


def test_percentiles_of_a_known_spread() -> None:
    histogram: dict[int, int] = {}
    for ms in range(1, 101):  # 1..100 ms, one call each
        b = bucket_of(float(ms))
        histogram[b] = histogram.get(b, 0) + 1
    got = percentiles(histogram)
    assert 50 <= got["p50"] <= 50 * 1.05
    assert 95 <= got["p95"] <= 95 * 1.05
    assert 99 <= got["p99"] <= 99 * 1.05
    assert percentiles({}) == {}


def test_stats_count_by_server_tool_and_session() -> None:
    stats = Stats(max_tools=2)
    stats.add("s1", [call_record("git", "tools/call", "log", 0.0, 0.010, RESULT, None, 10, 100)])
    stats.add("s2", [call_record("git", "tools/call", "log", 0.0, 0.030, TOOL_ERROR, None, 5, 50)])
    stats.add(
        "s1",
        [
            call_record("fs", "resources/read", "file:///a", 0.0, 0.001, ERROR, -1, 1, 2),
            call_record("fs", "tools/call", "past-the-cap", 0.0, 0.001, RESULT, None, 1, 1),
        ],
    )
    out = stats.as_json(in_flight={"git": 1})
    git = out["servers"]["git"]
    assert (git["calls"], git["errors"], git["bytes_in"], git["bytes_out"]) == (2, 1, 15, 150)
    assert git["in_flight"] == 1
    assert git["tools"]["log"]["calls"] == 2 and 10 <= git["tools"]["log"]["p50_ms"] <= 10.5
    fs = out["servers"]["fs"]
    assert fs["calls"] == 2 and list(fs["tools"]) == ["resources/read file:///a"]
    assert out["tools_not_kept"] == 1
    assert out["sessions"] == {"s1": 3, "s2": 1}
    stats.session_closed("s2")
    assert stats.as_json()["sessions"] == {"s1": 3}


def _done(ledger: Ledger, session: str, server: str, method: str, name: str) -> None:
    """A request of `session`'s answered now, through its tape (opened once)."""
    tape = next((t for t in ledger._tapes.values() if t.session == session), None)
    if tape is None:
        tape = ledger.open_tape(session)
        tape.said(*CLIENT_FACTS)
    tape.done((perf_counter(), server, method, name, 3), b"{}\n")


async def test_the_audit_log_writes_records_in_batches_0600_and_reads_them_back(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = tmp_path / "state" / "audit.jsonl"
    log = Ledger(AuditLog(path))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(log.run)
        _done(log, "s1", "git", "tools/call", "log")
        assert not path.exists()  # nothing written per call
        await trio.sleep(_ledger.FLUSH_INTERVAL * 1.5)
        assert path.exists() and stat.S_IMODE(os.stat(path).st_mode) == 0o600
        tape = log.open_tape("s2")
        tape.said(*CLIENT_FACTS)
        tape.done(
            (perf_counter(), "fs", "prompts/get", "p", 1),
            b"",
            Raw(b'{"code":-32602,"message":"x"}'),
        )
        nursery.cancel_scope.cancel()  # the end flushes what waits
    records = list(read_audit(path))
    assert [(r.session.id, r.server, r.method, r.name) for r in records] == [
        ("s1", "git", "tools/call", "log"),
        ("s2", "fs", "prompts/get", "p"),
    ]
    first = json.loads(path.read_text().splitlines()[0])
    assert first["duration_ms"] >= 0 and first["outcome"] == "result" and first["bytes_out"] == 3
    assert first["session"] == {
        "id": "s1",
        "client": "codex-mcp-client",
        "client_version": "0.171.0",
        "folder": "/home/u/project",
    }
    assert "code" not in first and json.loads(path.read_text().splitlines()[1])["code"] == -32602
    assert [r.server for r in read_audit(path, server="fs")] == ["fs"]
    assert [r.session.id for r in read_audit(path, session="s1")] == ["s1"]
    assert list(read_audit(path, since=records[1].ts)) == records[1:]


async def test_what_waits_is_bounded_and_the_drop_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_ledger, "MAX_PENDING", 300)
    path = tmp_path / "audit.jsonl"
    log = Ledger(AuditLog(path))
    for n in range(400):
        _done(log, "s1", "git", "tools/call", f"t{n}")
    assert log.dropped == 100
    log.drain()
    assert (log.dropped, log.dropped_total) == (0, 100)  # `daemonctl stats` keeps the count
    lines = path.read_text().splitlines()
    assert json.loads(lines[-1]) == {"dropped": 100}
    assert len(list(read_audit(path))) == len(lines) - 1 == 300


async def test_rotated_files_are_read_oldest_first(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, max_bytes=400)
    for n in range(12):
        record = call_record("git", "tools/call", f"t{n}", n, n + 0.1, RESULT, None, 1, 1)
        log.write(lines_of([record]))
    assert (tmp_path / "audit.jsonl.1").exists()
    names = [r.name for r in read_audit(path)]
    assert names == sorted(names, key=lambda s: int(s[1:]))  # oldest first, none twice
    assert names[-1] == "t11"


_text = st.text(max_size=12)


@given(_text, _text, _text, _text, _text)
def test_a_sessions_facts_go_in_each_of_its_lines_whatever_they_say(
    session: str, client: str, version: str, folder: str, name: str
) -> None:
    """What a session said of itself is encoded once and copied into each of its lines: any
    text reads back as it was said, with each line's own fields."""
    tape = CallTape(session, lambda t: None, 1_700_000_000.0)
    tape.said(client, version, folder)
    tape.done((perf_counter(), "git", "tools/call", name, 3), b"{}\n")
    tape.done((perf_counter(), name, "prompts/get", name, 1), b"", Raw(b'{"code":-1,"message":""}'))
    lines = lines_of(tape.records).splitlines()
    assert len(lines) == 2
    for line, record in zip(lines, tape.records, strict=True):
        got = msgspec.json.decode(line, type=AuditLine)
        assert got.session == SessionFacts(session, client, version, folder)
        assert msgspec.structs.astuple(got)[1:] == msgspec.structs.astuple(record)[1:]


_edge_durations = st.one_of(
    st.floats(min_value=-1.0, max_value=1e10, allow_nan=False),
    st.sampled_from(EDGES).flatmap(
        lambda e: st.sampled_from([e, math.nextafter(e, 0.0), math.nextafter(e, math.inf)])
    ),
)


@given(
    st.lists(
        st.tuples(
            _edge_durations,
            st.sampled_from([RESULT, TOOL_ERROR, ERROR]),
            st.integers(0, 1 << 20),
            st.integers(0, 1 << 20),
            st.sampled_from(["a", "b", "c"]),
        ),
        min_size=1,
        max_size=60,
    ),
    st.booleans(),
)
def test_a_batch_counts_what_its_calls_one_by_one_count(
    calls: list[tuple[float, OutcomeName, int, int, str]], one_tool: bool
) -> None:
    """The ledger counts in batches (`Stats.add`: grouped, summed, each tool's durations
    sorted and bucketed a run at a time): the same counters and histograms as `add` call by
    call, whatever the durations (bucket edges included) and however many tools."""
    records = [
        call_record("git", "tools/call", "t" if one_tool else t, 0.0, ms / 1000.0, o, None, i, b)
        for ms, o, i, b, t in calls
    ]
    one_by_one: dict[str, Counters] = {}
    server = Counters()
    for r in records:
        for counters in (one_by_one.setdefault(r.name, Counters()), server):
            counters.add(r.duration_ms, r.outcome != RESULT, r.bytes_in, r.bytes_out)
    batched = Stats()
    batched.add("s1", records)
    assert batched.servers["git"] == server
    assert {key[2]: c for key, c in batched.tools.items()} == one_by_one
    assert batched.sessions == {"s1": len(records)}
