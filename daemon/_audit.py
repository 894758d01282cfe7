"""The audit log: one JSON line per answered request, `$XDG_STATE_HOME/mcpool/audit.jsonl`.

Every tools/call, resources/read, prompts/get and server-to-client request a session relayed:
when, which session (its client's name and version, its folder), which server and tool, URI or
prompt, how long, the outcome (result, isError, or the error's code) and the bytes each way.
Never an argument, a result or a secret: the observer is given none (session/_observe.py).

The session's records (`CallDone`, which is the line) are kept in memory and written in one
write, encoded in one msgspec call, every FLUSH_INTERVAL or sooner once FLUSH_RECORDS wait (by
the daemon's ledger, daemon/_ledger.py, or alone by `run`), so a call costs no system call and
no encoding of its own. What waits is bounded (MAX_PENDING: past it, records are dropped and
counted, and the next write says how many). The file is 0600 and rotated by size like the
daemon's log (daemon/_log.py: audit.jsonl.1, .2, ...).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import trio

from mcpool.session._observe import CallDone

from ._log import JsonLinesLog

FLUSH_INTERVAL = 1.0
FLUSH_RECORDS = 256  # (about 64 KB of lines)
# Records waiting for a write, at most (about 4 MB): past it, a flood no flush keeps up with,
# they are dropped and counted, and the next write says how many.
MAX_PENDING = 16_384
MAX_BYTES = 16 * 1024 * 1024  # a file; with BACKUPS, 64 MiB in all
BACKUPS = 3
# `daemonctl audit` reads at most this much of the files (the newest).
MAX_READ_BYTES = 64 * 1024 * 1024


# The line is the record the session made (session/_observe.py): encoded as it is.
AuditLine = CallDone

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AuditLine)


class AuditLog:
    def __init__(self, path: Path | str | None, *, max_bytes: int = MAX_BYTES) -> None:
        self.path = Path(path) if path is not None else None
        self._file = JsonLinesLog(self.path, max_bytes=max_bytes, backups=BACKUPS)
        self._pending: list[CallDone] = []
        self.dropped = 0
        self._due = trio.Event()

    def call_done(self, call: CallDone) -> None:
        """Alone (not under a ledger): kept until the next flush, at most MAX_PENDING."""
        if self.path is None:
            return
        if len(self._pending) >= MAX_PENDING:
            self.dropped += 1
            return
        self._pending.append(call)
        if len(self._pending) >= FLUSH_RECORDS:
            self._due.set()

    def write(self, calls: list[CallDone]) -> None:
        """Append these records (and a count of those dropped since the last write) in one
        write, encoded in one call; the file rotates before it when full."""
        if self.path is None or not (calls or self.dropped):
            return
        data = _encoder.encode_lines(calls)
        if self.dropped:
            data += b'{"dropped": %d}\n' % self.dropped
            self.dropped = 0
        self._file.write_line(data[:-1].decode())

    def flush(self) -> None:
        """Write what waits."""
        calls, self._pending = self._pending, []
        self.write(calls)

    def close(self) -> None:
        self._file.close()

    async def run(self) -> None:
        """The owner task: flushes every FLUSH_INTERVAL (or at FLUSH_RECORDS), and at the end."""
        try:
            while True:
                with trio.move_on_after(FLUSH_INTERVAL):
                    await self._due.wait()
                self._due = trio.Event()
                self.flush()
        finally:
            self.flush()
            self.close()


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
