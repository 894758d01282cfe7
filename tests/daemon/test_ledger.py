"""daemon/_ledger.py: one observer fanned out to statistics and the audit log, and the two
daemonctl commands' output."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest
import trio
from fakes import CLIENT_FACTS, call_record
from msgspec import Raw

from mcpool.daemon._audit import AuditLog, lines_of
from mcpool.daemon._ledger import Ledger, cmd_audit, parse_since, render_stats
from mcpool.session._observe import RESULT, CallRecord, OutcomeName


def _call(
    server: str, name: str, at: float, outcome: OutcomeName = RESULT, session: str = "s1"
) -> CallRecord[Raw]:
    return call_record(server, "tools/call", name, at, at + 0.02, outcome, None, 7, 70, session)


async def test_a_call_reaches_the_statistics_and_the_audit_file(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    ledger = Ledger(AuditLog(path))
    s1 = ledger.open_tape("s1")
    s1.said(*CLIENT_FACTS)
    s2 = ledger.open_tape("s2")
    s2.said("gemini-cli", "0.61.0", "")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ledger.run)
        s1.done((time.perf_counter(), "git", "tools/call", "log", 7), b"{}")
        s2.done(
            (time.perf_counter(), "git", "tools/call", "log", 7),
            b'{"result":{"content":[],"isError":true}}',
        )
        nursery.cancel_scope.cancel()
    stats = ledger.stats.as_json()
    assert stats["servers"]["git"]["calls"] == 2
    assert stats["servers"]["git"]["errors"] == 1
    assert stats["sessions"] == {"s1": 1, "s2": 1}
    text = render_stats(stats)
    assert "git" in text and "  log" in text and "calls by session: s1 1, s2 1" in text
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["session"]["id"], r["session"]["client"], r["outcome"]) for r in lines] == [
        ("s1", "codex-mcp-client", "result"),
        ("s2", "gemini-cli", "isError"),
    ]
    assert abs(lines[0]["ts"] - time.time()) < 60  # the Unix time, not the fast clock's
    ledger.close_tape(s1)
    assert ledger.stats.as_json()["sessions"] == {"s1": 1, "s2": 1}  # until the next drain
    ledger.drain()
    assert ledger.stats.as_json()["sessions"] == {"s2": 1}


async def test_lines_say_what_the_session_said_of_itself_then_and_a_closed_ones_are_written(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.jsonl"
    ledger = Ledger(AuditLog(path))
    tape = ledger.open_tape("s1")
    tape.done((time.perf_counter(), "git", "tools/call", "before", 7), b"{}")
    tape.said("codex-mcp-client", "0.171.0", "/a")
    tape.done((time.perf_counter(), "git", "tools/call", "after", 7), b"{}")
    ledger.close_tape(tape)
    ledger.drain()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(x["name"], x["session"]) for x in lines] == [
        ("before", {"id": "s1", "client": "", "client_version": "", "folder": ""}),
        (
            "after",
            {"id": "s1", "client": "codex-mcp-client", "client_version": "0.171.0", "folder": "/a"},
        ),
    ]
    assert ledger.stats.as_json()["sessions"] == {}


async def test_daemonctl_audit_filters_and_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    now = time.time()
    log.write(
        b"".join(
            lines_of([_call(server, "t", now, session=sid)])
            for sid, server in (("s1", "git"), ("s2", "fs"), ("s1", "fs"))
        )
    )
    args = argparse.Namespace(session="s1", server=None, since=None, n=0)
    assert cmd_audit(args, True, path) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [(r["session"]["id"], r["server"]) for r in printed] == [("s1", "git"), ("s1", "fs")]
    args = argparse.Namespace(session=None, server="fs", since="1h", n=1)
    assert cmd_audit(args, False, path) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["time", "session", "client"]
    assert len(out) == 2 and " s1 " in out[1] and " fs " in out[1]
    args = argparse.Namespace(session=None, server=None, since="soon", n=0)
    assert cmd_audit(args, False, path) == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [(None, None), ("300", 700.0), ("5m", 700.0), ("1h", -2600.0), ("1800000000", 1.8e9)],
)
def test_since(text: str | None, expected: float | None) -> None:
    assert parse_since(text, 1000.0) == expected
