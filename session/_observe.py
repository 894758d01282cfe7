"""What a session tells the daemon about each request it relayed, once it is over.

The session calls `CallObserver.call_done` for every `tools/call`, `resources/read` and
`prompts/get` it answered, and for every server-to-client request it relayed, with one small
record (`CallDone`). The daemon's observer feeds the audit log, the statistics and, when
configured, OpenTelemetry; a session without one is given `NO_OBSERVER`. Arguments, results and
secrets never pass here: only names, sizes, times and outcomes.

`CallDone` is the audit log's line itself (a msgspec Struct, built in C with its values as they
are written): made on the path of every observed call, so that path does no more than read two
clocks, build it and hand it over; what is done with it (the statistics, the line's encoding)
is done in batches by the daemon's ledger (daemon/_ledger.py).
"""

from __future__ import annotations

import enum
from typing import Protocol

import msgspec


class Outcome(enum.Enum):
    RESULT = "result"  # answered with a result
    TOOL_ERROR = "isError"  # a tools/call result with isError: true
    ERROR = "error"  # a JSON-RPC error (the code says which)


class CallDone(msgspec.Struct, frozen=True, omit_defaults=True):
    """One answered request. `ts`: when it started (Unix time); `name` is the tool, URI or
    prompt ("" for a server request); `bytes_in` came from the client (the request, or for a
    server request the client's answer), `bytes_out` went to it. The session's client's name and
    version as it gave them, its folder ("" when none)."""

    ts: float
    session: str
    client: str
    client_version: str
    folder: str
    server: str
    method: str
    name: str
    duration_ms: float
    outcome: Outcome
    bytes_in: int
    bytes_out: int
    code: int | None = None


class CallObserver(Protocol):
    def call_done(self, call: CallDone) -> None: ...


class Watch(msgspec.Struct, gc=False):
    """What a request's answer is observed with (`Flights.observe`): made as it is sent, for
    the methods in OBSERVED, when the session has an observer. `started`: a
    `time.perf_counter()` reading. A Struct: built in C, on the path of every observed call."""

    method: str
    server: str
    name: str
    started: float
    bytes_in: int


# What the audit log and the statistics count (besides server-to-client requests).
OBSERVED = frozenset({"tools/call", "resources/read", "prompts/get"})


class _NoObserver:
    def call_done(self, call: CallDone) -> None:
        pass


NO_OBSERVER: CallObserver = _NoObserver()
