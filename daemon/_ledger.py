"""The daemon's ledger of answered requests (issue 30 items 3-5): the one `CallObserver` its
sessions are given, and the `daemonctl stats` and `daemonctl audit` commands.

Each session opens a `CallTape` (session/_observe.py) and puts a record on it for each answered
request. `Ledger` takes what every tape holds, about once a second (`drain`), and hands each
session's records to the statistics (daemon/_stats.py), the audit log (daemon/_audit.py) and,
when `OTEL_EXPORTER_OTLP_ENDPOINT` is set and the otel extra is installed, OpenTelemetry
(daemon/_otel.py); its `run` is the owner task of what they write and, at its end, flushes and
closes them. `daemonctl stats` asks the daemon (`stats`); `daemonctl audit` reads the audit files
itself (they are the user's own), so it also works while no daemon runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Any, Protocol

import trio
from msgspec import Raw, UnsetType

from mcpool.session._observe import CallRecord, CallTape

from . import _audit, _otel, _paths
from ._audit import AuditLog, lines_of, read_audit
from ._stats import Stats

if TYPE_CHECKING:
    from ._otel import OtelObserver


class AdminCalls(Protocol):
    """What `daemonctl stats` needs of its admin client (daemon/_ctl.py)."""

    def call(self, method: str, params: dict[str, Any]) -> Any: ...


# Records wait for the next drain: every FLUSH_INTERVAL, or sooner once a tape holds
# FLUSH_RECORDS (session/_observe.py; about 40 KB of lines). A tape holds at most MAX_PENDING
# (about 1.5 MB): past it, a flood no drain keeps up with, records are dropped and counted, and
# the next audit write says how many.
FLUSH_INTERVAL = 1.0
MAX_PENDING = 8_192
# `daemonctl audit` prints at most this many records unless told otherwise (the newest).
DEFAULT_AUDIT_LINES = 200


def audit_path() -> Path:
    return _paths.state_dir() / "audit.jsonl"


def _wall_offset() -> float:
    return time.time() - perf_counter()


class Ledger:
    def __init__(
        self,
        audit: AuditLog,
        *,
        stats: Stats | None = None,
        otel: OtelObserver | None = None,
    ) -> None:
        self.stats = stats if stats is not None else Stats()
        self.audit = audit
        self.otel = otel
        self._tapes: dict[int, CallTape] = {}  # the open ones, by id()
        self._closed: list[CallTape] = []  # until the next drain
        self._wall_offset = _wall_offset()
        self.dropped = 0  # since the last drain (the audit file is told)
        self.dropped_total = 0  # since the daemon started (`daemonctl stats`)
        self._due = trio.Event()

    @classmethod
    def for_daemon(cls, version: str) -> Ledger:
        """The daemon's: the audit log in the state folder, OpenTelemetry when asked for."""
        otel = _otel.start(version) if _otel.wanted() else None
        return cls(AuditLog(audit_path()), otel=otel)

    # -- as sessions meet it (CallObserver) -------------------------------------------------

    def open_tape(self, session: str) -> CallTape:
        tape = CallTape(session, self._full, self._wall_offset)
        self._tapes[id(tape)] = tape
        return tape

    def close_tape(self, tape: CallTape) -> None:
        if self._tapes.pop(id(tape), None) is tape:
            self._closed.append(tape)  # counted at the next drain, then forgotten

    def _full(self, tape: CallTape) -> None:
        """A tape holds FLUSH_RECORDS or more: a drain is due; past MAX_PENDING the newest
        record is dropped (and counted)."""
        self._due.set()
        records = tape.records
        if len(records) > MAX_PENDING:
            del records[MAX_PENDING:]
            self.dropped += 1  # (said in the audit file; not counted in the statistics)
            self.dropped_total += 1

    # -- the batches ------------------------------------------------------------------------

    def drain(self) -> None:
        """What the tapes hold goes to the statistics and OpenTelemetry, a session's records
        at a time, and to the audit file in one write; each tape is told the clock's offset."""
        self._wall_offset = offset = _wall_offset()
        closed, self._closed = self._closed, []
        taken: list[CallRecord[Raw]] = []
        for tape in self._tapes.values():
            tape.wall_offset = offset
            if tape.records:
                taken += self._take(tape)
        for tape in closed:
            if tape.records:
                taken += self._take(tape)
            self.stats.session_closed(tape.session)
        dropped, self.dropped = self.dropped, 0
        if taken or dropped:
            self.audit.write(lines_of(taken), dropped)

    def _take(self, tape: CallTape) -> list[CallRecord[Raw]]:
        records, tape.records = tape.records, []
        self.stats.add(tape.session, records)
        if self.otel is not None:
            self.otel.add(tape.session, records)
        return records

    def stats_json(self, in_flight: dict[str, int]) -> dict[str, Any]:
        self.drain()
        return self.stats.as_json(in_flight)

    async def run(self) -> None:
        """The owner task of what the ledger writes, for the daemon's life: a drain every
        FLUSH_INTERVAL (or once a tape holds FLUSH_RECORDS), and at the end."""
        try:
            while True:
                with trio.move_on_after(FLUSH_INTERVAL):
                    await self._due.wait()
                self._due = trio.Event()
                self.drain()
        finally:
            self.drain()
            self.audit.close()
            if self.otel is not None:
                self.otel.flush()


# -- daemonctl stats / audit ------------------------------------------------------------------


def add_commands(add: Any) -> None:
    add("stats", "calls, errors, durations and bytes per server and tool since the daemon started")
    audit = add("audit", "the audit log: one line per answered call (never its arguments)")
    audit.add_argument("--session", help="only this session's (its id)")
    audit.add_argument("--server", help="only this server's")
    audit.add_argument(
        "--since",
        help="only those since: seconds ago (300), minutes or hours (30m, 2h), or a Unix time",
    )
    audit.add_argument(
        "-n", type=int, default=DEFAULT_AUDIT_LINES, help="the newest N (0: all of them)"
    )


def parse_since(text: str | None, now: float) -> float | None:
    """`--since`: None, a Unix time, or an age in seconds, minutes (m), hours (h), days (d)."""
    if text is None:
        return None
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    try:
        if text[-1:] in units:
            return now - float(text[:-1]) * units[text[-1]]
        value = float(text)
    except ValueError:
        raise ValueError(
            f"--since {text!r}: not a time (300, 30m, 2h, 1d or a Unix time)"
        ) from None
    return value if value > 1e9 else now - value


def _columns(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def render_stats(stats: dict[str, Any]) -> str:
    rows: list[list[str]] = [
        ["server / tool", "calls", "errors", "p50 ms", "p95 ms", "p99 ms", "bytes in", "out", "now"]
    ]

    def row(label: str, c: dict[str, Any], now: str) -> list[str]:
        return [
            label,
            str(c["calls"]),
            str(c["errors"]),
            *(f"{c.get(f'{k}_ms', 0):g}" for k in ("p50", "p95", "p99")),
            str(c["bytes_in"]),
            str(c["bytes_out"]),
            now,
        ]

    for name, server in stats["servers"].items():
        rows.append(row(name, server, str(server["in_flight"])))
        for tool, counters in server["tools"].items():
            rows.append(row(f"  {tool}", counters, ""))
    if len(rows) == 1:
        return "no calls yet"
    sessions = ", ".join(f"{sid} {n}" for sid, n in stats["sessions"].items())
    return _columns(rows) + (f"\ncalls by session: {sessions}" if sessions else "")


def cmd_stats(client: AdminCalls, args: argparse.Namespace, as_json: bool) -> int:
    result = client.call("stats", {})
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        sys.stdout.write(render_stats(result) + "\n")
    return 0


def cmd_audit(args: argparse.Namespace, as_json: bool, path: Path | None = None) -> int:
    """Read the audit files (no daemon needed); 2 for a `--since` that is not a time."""
    try:
        since = parse_since(args.since, time.time())
    except ValueError as exc:
        sys.stderr.write(f"daemonctl: {exc}\n")
        return 2
    records = list(
        read_audit(path or audit_path(), session=args.session, server=args.server, since=since)
    )
    if args.n > 0:
        records = records[-args.n :]
    if as_json:
        sys.stdout.write(json.dumps([_audit.as_json(r) for r in records], indent=2) + "\n")
        return 0
    if not records:
        sys.stdout.write("no audit records match\n")
        return 0
    rows = [["time", "session", "client", "server", "method", "name", "ms", "outcome"]]
    for r in records:
        outcome = r.outcome if isinstance(r.code, UnsetType) else f"{r.outcome} {r.code}"
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.ts))
        rows.append(
            [
                when,
                r.session.id,
                r.session.client,
                r.server,
                r.method,
                r.name,
                f"{r.duration_ms:g}",
                outcome,
            ]
        )
    sys.stdout.write(_columns(rows) + "\n")
    return 0
