"""A session's link to its client: what the client said it is (era, version, capabilities,
clientInfo, log level), where the session is in its protocol (`SessionPhase`, moved by a table),
and every write to it (answers, batches, lossy messages, pages written around their bytes).

The phase is data: `PHASE_MOVES` says which event moves which phase where, and `next_phase` reads
it (tests/session/test_phase.py is its table). A write that fails ends the session through the
`broken` callback the session gives the link at construction.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from mcpool.protocol import (
    McpoolError,
    error_response,
    response_line,
    response_parts,
)

from ._eras import Batch


class SessionLog(Protocol):
    """Where a session's log lines go (the daemon's journal): text, then a level name."""

    def __call__(self, text: str, level: str = "warning") -> None: ...


def _no_log(text: str, level: str = "warning") -> None:
    pass


class Writer(Protocol):
    """What the session writes to (the daemon gives it an `FdWriter`)."""

    @property
    def buffered(self) -> int: ...

    def write(self, data: bytes) -> None:
        """Write or queue `data`; raises (and the session closes) once the peer is gone or
        the writer is backed up past its limit."""

    def write_lossy(self, data: bytes) -> bool:
        """`write` for a message that may be lost (a log message, a progress notification:
        DESIGN X8): False when it was dropped because the writer is backed up past a lossy
        bound well below its limit, so that a flood is shed before a reading session is cut.
        Never raises and never closes the writer for being backed up."""
        ...

    def write_parts(self, parts: Sequence[bytes]) -> None:
        """`write(b"".join(parts))`; a writer to an fd writes them without joining them."""

    async def wait_drained(self) -> None: ...


class SessionPhase(enum.Enum):
    """Where a session is in its protocol. A handshake-era session goes NEW -> ANSWERED (its
    initialize answered) -> INITIALIZED (the client's notifications/initialized); a 2026-07-28
    one has no handshake and goes NEW -> MODERN on its first request; any phase ends CLOSED."""

    NEW = "new"
    ANSWERED = "answered"
    INITIALIZED = "initialized"
    MODERN = "modern"
    CLOSED = "closed"


class PhaseEvent(enum.Enum):
    INITIALIZE_ANSWERED = "initialize answered"
    CLIENT_INITIALIZED = "client initialized"
    SPOKE_MODERN = "spoke 2026-07-28"
    CLOSED = "closed"


_P, _E = SessionPhase, PhaseEvent

# (phase, event) -> the next phase; a pair not listed leaves the phase as it is (an
# initialized notification before the initialize answer is ignored, per the handshake rules;
# a second initialize answers again and changes nothing; a closed session stays closed).
PHASE_MOVES: dict[tuple[SessionPhase, PhaseEvent], SessionPhase] = {
    (_P.NEW, _E.INITIALIZE_ANSWERED): _P.ANSWERED,
    (_P.NEW, _E.SPOKE_MODERN): _P.MODERN,
    (_P.ANSWERED, _E.CLIENT_INITIALIZED): _P.INITIALIZED,
    (_P.NEW, _E.CLOSED): _P.CLOSED,
    (_P.ANSWERED, _E.CLOSED): _P.CLOSED,
    (_P.INITIALIZED, _E.CLOSED): _P.CLOSED,
    (_P.MODERN, _E.CLOSED): _P.CLOSED,
}

# Phases in which the client has had its initialize answer (or needs none): upstream
# notifications may reach it.
ANSWERED_PHASES = frozenset({_P.ANSWERED, _P.INITIALIZED, _P.MODERN})
# Phases in which the handshake is complete: list_changed and server requests may go.
INITIALIZED_PHASES = frozenset({_P.INITIALIZED, _P.MODERN})
CLOSED = _P.CLOSED


def next_phase(phase: SessionPhase, event: PhaseEvent) -> SessionPhase:
    return PHASE_MOVES.get((phase, event), phase)


class ClientLink:
    """The client's side of one session: its protocol state and the writes to it."""

    __slots__ = (
        "_broken",
        "_dropped",
        "_log",
        "_sid",
        "batch",
        "client_capabilities",
        "client_info",
        "close_reason",
        "era",
        "log_level",
        "lossy_dropped",
        "out",
        "phase",
        "protocol_version",
        "request_headers",
    )

    def __init__(
        self, sid: str, out: Writer, log: SessionLog, broken: Callable[[str], None]
    ) -> None:
        self._sid = sid
        self.out = out
        self._log = log
        # A write that failed: the session closes with this reason.
        self._broken = broken
        self.phase = SessionPhase.NEW
        self.close_reason: str | None = None
        # None until the first request decides it (P1): HANDSHAKE or MODERN.
        self.era: str | None = None
        self.protocol_version: str | None = None
        self.client_capabilities: dict[str, Any] = {}
        self.client_info: dict[str, Any] = {}
        self.log_level: str | None = None
        # A 2026-07-28 HTTP request's headers (lowercase names), set by the endpoint for the
        # request's own session: a tools/call's Mcp-Param-* are checked against the tool it calls.
        self.request_headers: dict[str, str] | None = None
        # While a batch member is being handled: the batch its synchronous answer joins.
        self.batch: Batch | None = None
        # Log and progress messages dropped while its client was behind (`send_lossy`).
        self.lossy_dropped = 0
        self._dropped: set[str] = set()  # kinds of dropped input already logged (once each)

    def move(self, event: PhaseEvent) -> None:
        self.phase = next_phase(self.phase, event)

    @property
    def closed(self) -> bool:
        return self.phase is CLOSED

    @property
    def initialize_answered(self) -> bool:
        return self.phase in ANSWERED_PHASES

    @property
    def initialized(self) -> bool:
        return self.phase in INITIALIZED_PHASES

    def shut(self, reason: str) -> bool:
        """Close the link (once): False when it was already closed."""
        if self.phase is CLOSED:
            return False
        self.move(PhaseEvent.CLOSED)
        self.close_reason = reason
        return True

    def broke(self, reason: str) -> None:
        """A write to the client failed (the peer is gone, or too far behind): the session
        closes."""
        self._broken(reason)

    def send(self, data: bytes) -> None:
        if self.phase is CLOSED:
            return
        try:
            self.out.write(data)
        except Exception as exc:
            self.broke(str(exc))

    def send_lossy(self, data: bytes) -> None:
        """Send a message that may be dropped (log, progress: X8) when the client is not
        reading fast enough; each drop counted (`daemonctl sessions`), the first logged."""
        if self.phase is CLOSED:
            return
        try:
            sent = self.out.write_lossy(data)
        except Exception as exc:  # (a writer whose lossy write is a plain write)
            self.broke(str(exc))
            return
        if not sent:
            self.lossy_dropped += 1
            if self.lossy_dropped == 1:
                self._log(
                    f"session {self._sid}: its client is not reading fast enough; log and "
                    "progress messages for it are dropped while it is behind (counted in "
                    "`daemonctl sessions`)",
                    "info",
                )

    def send_parts(self, parts: Sequence[bytes]) -> None:
        """`send(b"".join(parts))`, the parts written as they are (`Writer.write_parts`)."""
        if self.phase is CLOSED:
            return
        try:
            self.out.write_parts(parts)
        except Exception as exc:
            self.broke(str(exc))

    def reply(self, data: bytes) -> None:
        """Send the answer to the client request being handled now (a batch member's answer
        joins its batch, which is sent whole once every member is answered)."""
        self.deliver(self.batch, data)

    def deliver(self, batch: Batch | None, data: bytes) -> None:
        """Send one answer, or add it to the batch its request came in."""
        if batch is not None:
            whole = batch.add(data)
            if whole is None:
                return
            data = whole
        self.send(data)

    def send_error(self, msg_id: Any, exc: McpoolError) -> None:
        obj = exc.to_error_object()
        self.reply(error_response(msg_id, obj.code, obj.message, obj.data))

    def answer_page(self, rid: Any, page: bytes) -> None:
        """The answer with `page` as its result, written around the page's bytes: no copy of
        them (55 KB a page, and every session re-reads every page after a change; issue 17).
        A batch member's joins its batch whole."""
        if self.batch is None:
            self.send_parts(response_parts(rid, page))
        else:
            self.reply(response_line(rid, page))

    def write_last(self, lines: Sequence[bytes]) -> None:
        """The closing session's last answers, in one write, whatever the link's phase."""
        if lines:
            with contextlib.suppress(Exception):  # the peer is gone: nobody to tell
                self.out.write(b"".join(lines))

    def drop(self, kind: str, why: str) -> None:
        """A message that cannot be acted on: logged once per kind and session (a client
        repeating it must not flood the daemon log), then dropped."""
        if kind not in self._dropped:
            self._dropped.add(kind)
            self._log(f"session {self._sid}: dropped {kind}: {why} (further ones: not logged)")


def closing_line(closing: McpoolError, msg_id: Any, batch: Batch | None) -> bytes | None:
    """A request's SESSION_CLOSING answer, or its batch's whole answer once it completes it
    (None while the batch waits for other members)."""
    line = error_response(msg_id, closing.code, closing.message, closing.data)
    return batch.add(line) if batch is not None else line
