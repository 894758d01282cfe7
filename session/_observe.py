"""What a session tells the daemon about each request it relayed, once it is over.

A session given an observer opens one `CallTape` with it, and for every `tools/call`,
`resources/read` and `prompts/get` it answered, and every server-to-client request it relayed,
puts one small record (`CallRecord`) on it. The daemon's observer (daemon/_ledger.py) takes the
records off every tape about once a second and feeds the audit log, the statistics and, when
configured, OpenTelemetry; a session without one has no tape. Arguments, results and secrets
never pass here: only names, sizes, times and outcomes.

The path of every observed call does as little as Python allows (issue 30): as the request is
sent, a clock reading and a tuple (`Watch`); as it is answered, a second reading, one
`CallRecord` made in C and an append (`CallTape.done`).
What the session's records share (its id, its client's name and version, its folder) is encoded
once, when the session says it, and each record holds those bytes; the grouping, counting and
encoding are the ledger's, in batches.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Final, Generic, Literal, Protocol, TypeVar

import msgspec
from msgspec import UNSET, Raw, UnsetType

from ._params import error_code

# A record's outcome: a plain string (an Enum costs four times as much to encode, per line).
OutcomeName = Literal["result", "isError", "error"]
RESULT: Final = "result"  # answered with a result
TOOL_ERROR: Final = "isError"  # a tools/call result with isError: true
ERROR: Final = "error"  # a JSON-RPC error (the code says which)

# A tape this long asks its ledger to drain it now (about 40 KB of audit lines).
FLUSH_RECORDS: Final = 256
# What a session's lines say of it is cut to this many characters a field: the client's name and
# version are the client's to say, and each of its lines repeats them.
MAX_FACT_CHARS: Final = 256
MAX_FOLDER_CHARS: Final = 4096


# What an observed request is watched with, made as it is sent: when it started (a
# `perf_counter()` reading), its server, method and name (the tool, URI or prompt; "" for a
# server's request), and the bytes that came from the client. A tuple: built without a call.
Watch = tuple[float, str, str, str, int]


class SessionFacts(msgspec.Struct):
    """What each of a session's audit lines says of it: its id, its client's name and version
    as the client gave them, its folder ("" for what was not said)."""

    id: str
    client: str
    client_version: str
    folder: str


_encoder = msgspec.json.Encoder()
Facts = TypeVar("Facts")


class CallRecord(msgspec.Struct, Generic[Facts], gc=False):
    """One answered request: one audit line. `session`: its session's facts, as the tape
    keeps them encoded (`Raw`, copied into the line as it is) or as read back (SessionFacts);
    `ts`: when it started (Unix time); `bytes_in` came from the client (the request, or for a
    server request the client's answer), `bytes_out` went to it. gc=False: no cycles."""

    session: Facts
    ts: float
    server: str
    method: str
    name: str
    bytes_in: int
    duration_ms: float
    outcome: OutcomeName
    bytes_out: int
    code: int | UnsetType = UNSET  # an error's code (not written otherwise)


def tool_error_in(line: bytes) -> bool:
    """Whether a tools/call answer line says `isError: true`. `partition` first: one search
    with no argument tuple to parse, the cheapest test of the bytes (the common answer has no
    isError at all)."""
    return bool(line.partition(b'"isError"')[1]) and (
        b'"isError":true' in line or b'"isError": true' in line
    )


class CallTape:
    """One session's answered requests, waiting for its ledger's next drain.

    The session appends (`done`, or the one inlined copy of it on the answer's hot path in
    session/_flight.py, held equal to it by a property test) and says what its lines say of it
    (`said`, once it knows); the ledger takes `records` and sets `wall_offset` at each drain.
    `full` is the ledger's, called once FLUSH_RECORDS wait."""

    __slots__ = ("facts", "full", "records", "session", "wall_offset")

    def __init__(self, session: str, full: Callable[[CallTape], None], wall_offset: float) -> None:
        self.session = session
        self.full = full
        self.records: list[CallRecord[Raw]] = []
        # time.time() - perf_counter() at the ledger's last drain (at most a second or so ago):
        # a record's start is read on the fast clock and told as the Unix time with it.
        self.wall_offset = wall_offset
        self.said("", "", "")

    def said(self, client: str, version: str, folder: str) -> None:
        """What the session's lines say of it from now on (encoded once, here, and bounded)."""
        facts = SessionFacts(
            self.session,
            client[:MAX_FACT_CHARS],
            version[:MAX_FACT_CHARS],
            folder[:MAX_FOLDER_CHARS],
        )
        self.facts = Raw(_encoder.encode(facts))

    def done(self, watch: Watch, line: bytes, error: Raw | UnsetType = UNSET) -> None:
        """`watch`'s request was answered: `line` went to the client (b"" for a server's
        request, whose answer went to the server), `error` is the error it carried, if any."""
        started, server, method, name, sent = watch
        code: int | UnsetType = UNSET
        outcome: OutcomeName = RESULT
        if error is not UNSET:
            outcome = ERROR
            found = error_code(error)
            if found is not None:
                code = found
        elif method == "tools/call" and tool_error_in(line):
            outcome = TOOL_ERROR
        records = self.records
        records.append(
            CallRecord(
                self.facts,
                started + self.wall_offset,
                server,
                method,
                name,
                sent,
                (perf_counter() - started) * 1000.0,
                outcome,
                len(line),
                code,
            )
        )
        if len(records) >= FLUSH_RECORDS:
            self.full(self)


class CallObserver(Protocol):
    """What a session needs of the daemon's ledger."""

    def open_tape(self, session: str) -> CallTape:
        """The session's tape, for its life."""
        ...

    def close_tape(self, tape: CallTape) -> None:
        """The session is over: what its tape holds is taken, and the tape forgotten."""
        ...


# What the audit log and the statistics count (besides server-to-client requests).
OBSERVED = frozenset({"tools/call", "resources/read", "prompts/get"})
