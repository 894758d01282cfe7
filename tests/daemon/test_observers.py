"""The statistics and the audit log (daemon/_stats.py, daemon/_audit.py), as the ledger
(daemon/_ledger.py) feeds them."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import trio
import trio.testing
from fakes import SessionFactsStub as Facts
from fakes import call_record
from hypothesis import given
from hypothesis import strategies as st

from mcpool.daemon import _ledger
from mcpool.daemon._audit import AuditLog, read_audit
from mcpool.daemon._ledger import Ledger
from mcpool.daemon._stats import Counters, Stats, bucket_of, bucket_top, percentiles
from mcpool.session._observe import Outcome


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
    s1, s2 = Facts("s1"), Facts("s2")
    stats.call_done(
        call_record(s1, "git", "tools/call", "log", 0.0, 0.010, Outcome.RESULT, None, 10, 100)
    )
    stats.call_done(
        call_record(s2, "git", "tools/call", "log", 0.0, 0.030, Outcome.TOOL_ERROR, None, 5, 50)
    )
    stats.call_done(
        call_record(s1, "fs", "resources/read", "file:///a", 0.0, 0.001, Outcome.ERROR, -1, 1, 2)
    )
    stats.call_done(
        call_record(s1, "fs", "tools/call", "past-the-cap", 0.0, 0.001, Outcome.RESULT, None, 1, 1)
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


async def test_the_audit_log_writes_records_in_batches_0600_and_reads_them_back(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = tmp_path / "state" / "audit.jsonl"
    log = Ledger(AuditLog(path))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(log.run)
        log.call_done(
            call_record(Facts(), "git", "tools/call", "log", 1.0, 1.25, Outcome.RESULT, None, 3, 4)
        )
        assert not path.exists()  # nothing written per call
        await trio.sleep(_ledger.FLUSH_INTERVAL * 1.5)
        assert path.exists() and stat.S_IMODE(os.stat(path).st_mode) == 0o600
        log.call_done(
            call_record(
                Facts("s2"), "fs", "prompts/get", "p", 2.0, 2.5, Outcome.ERROR, -32602, 1, 2
            )
        )
        nursery.cancel_scope.cancel()  # the end flushes what waits
    records = list(read_audit(path))
    assert [(r.session, r.server, r.method, r.name) for r in records] == [
        ("s1", "git", "tools/call", "log"),
        ("s2", "fs", "prompts/get", "p"),
    ]
    first = json.loads(path.read_text().splitlines()[0])
    assert first["duration_ms"] == 250.0 and first["outcome"] == "result"
    assert first["client"] == "codex-mcp-client" and first["folder"] == "/home/u/project"
    assert "code" not in first and json.loads(path.read_text().splitlines()[1])["code"] == -32602
    assert [r.server for r in read_audit(path, server="fs")] == ["fs"]
    assert [r.session for r in read_audit(path, session="s1")] == ["s1"]
    assert list(read_audit(path, since=first["ts"] + 0.5)) == records[1:]


async def test_what_waits_is_bounded_and_the_drop_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_ledger, "MAX_PENDING", 40)
    path = tmp_path / "audit.jsonl"
    log = Ledger(AuditLog(path))
    for n in range(100):
        log.call_done(
            call_record(Facts(), "git", "tools/call", f"t{n}", 0.0, 0.1, Outcome.RESULT, None, 1, 1)
        )
    assert log.dropped > 0
    dropped = log.dropped
    log.drain()
    assert (log.dropped, log.dropped_total) == (0, dropped)  # `daemonctl stats` keeps the count
    lines = path.read_text().splitlines()
    assert json.loads(lines[-1]) == {"dropped": dropped}
    assert len(list(read_audit(path))) == len(lines) - 1


async def test_rotated_files_are_read_oldest_first(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, max_bytes=400)
    for n in range(12):
        log.write(
            [
                call_record(
                    Facts(), "git", "tools/call", f"t{n}", n, n + 0.1, Outcome.RESULT, None, 1, 1
                )
            ]
        )
    assert (tmp_path / "audit.jsonl.1").exists()
    names = [r.name for r in read_audit(path)]
    assert names == sorted(names, key=lambda s: int(s[1:]))  # oldest first, none twice
    assert names[-1] == "t11"


@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=1e7, allow_nan=False),
            st.sampled_from(list(Outcome)),
            st.integers(0, 1 << 20),
            st.integers(0, 1 << 20),
        ),
        max_size=60,
    )
)
def test_a_batch_counts_what_its_calls_one_by_one_count(
    calls: list[tuple[float, Outcome, int, int]],
) -> None:
    """The ledger counts in batches over C loops (`Counters.add_batch`): the same counters
    and histogram as `add` call by call, whatever the durations (bucket edges included)."""
    records = [
        call_record(Facts(), "git", "tools/call", "t", 0.0, ms / 1000.0, outcome, None, i, o)
        for ms, outcome, i, o in calls
    ]
    one_by_one = Counters()
    for r in records:
        one_by_one.add(r.duration_ms, r.outcome is not Outcome.RESULT, r.bytes_in, r.bytes_out)
    batched = Stats()
    batched.add_batch(records)
    got = batched.servers.get("git", Counters())
    assert got == one_by_one
