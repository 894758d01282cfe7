"""What a session tells the daemon about each request it relayed, once it is over.

The session calls `CallObserver.call_done` for every `tools/call`, `resources/read` and
`prompts/get` it answered, and for every server-to-client request it relayed, with one small
record (`CallDone`, slots, no copy of the messages: the observer decides what to keep). The
daemon's observer feeds the audit log, the statistics and, when configured, OpenTelemetry; a
session without one is given `NO_OBSERVER`. Arguments, results and secrets never pass here: only
names, sizes, times and outcomes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


class Outcome(enum.Enum):
    RESULT = "result"  # answered with a result
    TOOL_ERROR = "isError"  # a tools/call result with isError: true
    ERROR = "error"  # a JSON-RPC error (the code says which)


@dataclass(frozen=True, slots=True)
class CallDone:
    """One answered request. `name` is the tool, URI or prompt ("" for a server request);
    `started`/`ended` are trio clock readings; `bytes_in` came from the client (the request, or
    for a server request the client's answer), `bytes_out` went to it."""

    session: SessionFacts
    server: str
    method: str
    name: str
    started: float
    ended: float
    outcome: Outcome
    code: int | None
    bytes_in: int
    bytes_out: int


class CallObserver(Protocol):
    def call_done(self, call: CallDone) -> None: ...


class SessionFacts(Protocol):
    """What an observer may know of the session (the audit log's columns)."""

    @property
    def id(self) -> str: ...

    @property
    def client_name(self) -> str: ...

    @property
    def client_version(self) -> str: ...

    @property
    def folder(self) -> str: ...


class _NoObserver:
    def call_done(self, call: CallDone) -> None:
        pass


NO_OBSERVER: CallObserver = _NoObserver()
