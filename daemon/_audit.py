"""The audit log: one JSON line per answered request, `$XDG_STATE_HOME/mcpool/audit.jsonl`.

Every tools/call, resources/read, prompts/get and server-to-client request a session relayed:
when, which session (its client's name and version, its folder), which server and tool, URI or
prompt, how long, the outcome (result, isError, or the error's code) and the bytes each way.
Never an argument, a result or a secret: the observer is given none (session/_observe.py).

`AuditLog` writes the sessions' records (`CallRecord`, each one line, its session's facts
encoded once for all its lines) as the daemon's ledger hands them over in batches
(daemon/_ledger.py, which bounds them): encoded in one msgspec call and written in one write per
batch, so a call costs no system call and no encoding of its own.
The file is 0600 and rotated by size like the daemon's log (daemon/_log.py: audit.jsonl.1, .2,
...).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
from msgspec import Raw

from mcpool.session._observe import CallRecord, SessionFacts

from ._log import JsonLinesLog

MAX_BYTES = 16 * 1024 * 1024  # a file; with BACKUPS, 64 MiB in all
BACKUPS = 3
# `daemonctl audit` reads at most this much of the files (the newest).
MAX_READ_BYTES = 64 * 1024 * 1024


# A line as read back: the record, its session's facts decoded.
AuditLine = CallRecord[SessionFacts]

_decoder = msgspec.json.Decoder(AuditLine)
_encoder = msgspec.json.Encoder()


def lines_of(records: list[CallRecord[Raw]]) -> bytes:
    """Records as audit lines: one msgspec call, each session's facts copied in as they were
    encoded when the session said them."""
    return _encoder.encode_lines(records)


class AuditLog:
    def __init__(self, path: Path | str | None, *, max_bytes: int = MAX_BYTES) -> None:
        self.path = Path(path) if path is not None else None  # None: nothing is written
        self._file = JsonLinesLog(self.path, max_bytes=max_bytes, backups=BACKUPS)

    def write(self, lines: bytes, dropped: int = 0) -> None:
        """Append these lines (`lines_of`'), and a line saying how many were dropped
        before them, in one write; the file rotates before it when full."""
        if self.path is None or not (lines or dropped):
            return
        if dropped:
            lines += b'{"dropped": %d}\n' % dropped
        self._file.write_bytes(lines)

    def close(self) -> None:
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
                if session is not None and record.session.id != session:
                    continue
                if server is not None and record.server != server:
                    continue
                if since is not None and record.ts < since:
                    continue
                yield record


def as_json(record: AuditLine) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(record)
    return out
