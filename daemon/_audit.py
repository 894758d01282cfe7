"""The audit log: one JSON line per answered request, `$XDG_STATE_HOME/mcpool/audit.jsonl`.

Every tools/call, resources/read, prompts/get and server-to-client request a session relayed:
when, which session (its client's name and version, its folder), which server and tool, URI or
prompt, how long, the outcome (result, isError, or the error's code) and the bytes each way.
Never an argument, a result or a secret: the observer is given none (session/_observe.py).

A `CallObserver`. Lines are encoded at once (msgspec) and kept in memory; the owner task
(`run`) appends them to the file in one write every FLUSH_INTERVAL, or sooner once FLUSH_BYTES
wait, so a call costs no system call. What waits is bounded (MAX_PENDING_BYTES: past it, lines
are dropped and counted, and the next write says how many). The file is 0600 and rotated by
size like the daemon's log (daemon/_log.py: audit.jsonl.1, .2, ...).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import trio

from mcpool.session._observe import CallDone

from ._log import JsonLinesLog

FLUSH_INTERVAL = 1.0
FLUSH_BYTES = 64 * 1024
MAX_PENDING_BYTES = 4 * 1024 * 1024
MAX_BYTES = 16 * 1024 * 1024  # a file; with BACKUPS, 64 MiB in all
BACKUPS = 3
# `daemonctl audit` reads at most this much of the files (the newest).
MAX_READ_BYTES = 64 * 1024 * 1024


class AuditLine(msgspec.Struct, omit_defaults=True):
    ts: float
    session: str
    client: str
    client_version: str
    folder: str
    server: str
    method: str
    name: str
    duration_ms: float
    outcome: str
    bytes_in: int
    bytes_out: int
    code: int | None = None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AuditLine)


class AuditLog:
    def __init__(self, path: Path | str | None, *, max_bytes: int = MAX_BYTES) -> None:
        self.path = Path(path) if path is not None else None
        self._file = JsonLinesLog(self.path, max_bytes=max_bytes, backups=BACKUPS)
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self.dropped = 0
        self._due = trio.Event()
        # trio's clock reading and the wall clock at one moment: records carry wall time.
        self._offset: float | None = None

    def call_done(self, call: CallDone) -> None:
        if self.path is None:
            return
        if self._offset is None:
            self._offset = time.time() - trio.current_time()
        line = _encoder.encode(
            AuditLine(
                ts=round(call.started + self._offset, 3),
                session=call.session.id,
                client=call.session.client_name,
                client_version=call.session.client_version,
                folder=call.session.folder,
                server=call.server,
                method=call.method,
                name=call.name,
                duration_ms=round((call.ended - call.started) * 1000.0, 3),
                outcome=call.outcome.value,
                bytes_in=call.bytes_in,
                bytes_out=call.bytes_out,
                code=call.code,
            )
        )
        if self._pending_bytes + len(line) > MAX_PENDING_BYTES:
            self.dropped += 1
            return
        self._pending.append(line)
        self._pending_bytes += len(line) + 1
        if self._pending_bytes >= FLUSH_BYTES:
            self._due.set()

    def flush(self) -> None:
        """Write what waits (in one write; the file rotates before it when full)."""
        if not self._pending:
            return
        lines, self._pending, self._pending_bytes = self._pending, [], 0
        if self.dropped:
            lines.append(b'{"dropped": %d}' % self.dropped)
            self.dropped = 0
        self._file.write_line(b"\n".join(lines).decode())

    async def run(self) -> None:
        """The owner task: flushes every FLUSH_INTERVAL (or at FLUSH_BYTES), and at the end."""
        try:
            while True:
                with trio.move_on_after(FLUSH_INTERVAL):
                    await self._due.wait()
                self._due = trio.Event()
                self.flush()
        finally:
            self.flush()
            self._file.close()


def _files(path: Path) -> list[Path]:
    """The log and its rotated copies, oldest first."""
    rotated = sorted(
        (p for p in path.parent.glob(path.name + ".*") if p.suffix[1:].isdigit()),
        key=lambda p: -int(p.suffix[1:]),
    )
    return [*rotated, *([path] if path.exists() else [])]


def read_audit(
    path: Path,
    *,
    session: str | None = None,
    server: str | None = None,
    since: float | None = None,
) -> Iterator[AuditLine]:
    """The records of the audit files (oldest first) that match; lines that are not records
    (a count of dropped lines, a line cut by a crash) are passed over."""
    budget = MAX_READ_BYTES
    for file in reversed(_files(path)):
        budget -= file.stat().st_size
        if budget < 0:
            break
    else:
        file = None  # every file fits
    chosen = _files(path)
    if file is not None:
        chosen = chosen[chosen.index(file) + 1 :]
    for part in chosen:
        with part.open("rb") as f:
            for raw in f:
                try:
                    record = _decoder.decode(raw)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    continue
                if session is not None and record.session != session:
                    continue
                if server is not None and record.server != server:
                    continue
                if since is not None and record.ts < since:
                    continue
                yield record


def as_json(record: AuditLine) -> dict[str, Any]:
    return msgspec.to_builtins(record)  # type: ignore[no-any-return]
