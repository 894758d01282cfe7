"""Server-sent events on the HTTP endpoint: event ids, the priming event and resumption
(SEP-1699, protocol revision 2025-11-25). Pure: the endpoint (daemon/_http.py) does the I/O.

Every event a session's stream carries has an id `<stream>-<seq>`: the stream's number within
its session, and the event's place on that stream (the priming event is 0, messages count from
1). A client that lost the connection reconnects with `GET` and `Last-Event-ID`; the id names
the stream to resume and the last event it has, so what follows is sent again from the
stream's history and the stream goes on where it stopped. Clients of 2025-11-25 and later
(their `MCP-Protocol-Version`, in the handshake era) get the priming event first, with the
`retry` their reconnection waits; older clients and the 2026-07-28 era (which has no
resumption) get neither, only the ids, which every SSE reader ignores or keeps.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from mcpool.protocol import MODERN_VERSIONS

# The first revision with SSE polling and resumption (SEP-1699).
RESUMABLE_SINCE = "2025-11-25"
# What the `retry` field asks a client to wait before it reconnects, in milliseconds.
RETRY_MS = 1000
# A stream whose client went away is kept this long for a `Last-Event-ID` resumption, its
# undelivered messages counted in the session's bytes (sessionBufferBytes) meanwhile.
RESUME_WINDOW = 60.0
# What a stream keeps of the events it already handed to a connection, for a resumption: the
# newest, up to this many bytes (also counted in the session's bytes).
HISTORY_BYTES = 256 * 1024
# Room an event's `id:` line takes, for the admission check before the id is known.
ID_ROOM = len(b"id: ") + 2 * 20 + len(b"-\n")

_EVENT_ID = re.compile(r"([0-9]{1,18})-([0-9]{1,18})\Z")


def primes(protocol_version: str | None) -> bool:
    """Does a stream opened with this `MCP-Protocol-Version` get the priming event?"""
    if protocol_version is None or protocol_version in MODERN_VERSIONS:
        return False
    return protocol_version >= RESUMABLE_SINCE


def event_id(stream: int, seq: int) -> bytes:
    return b"%d-%d" % (stream, seq)


def message_event(stream: int, seq: int, line: bytes) -> bytes:
    return b"id: " + event_id(stream, seq) + b"\nevent: message\ndata: " + line + b"\n\n"


def priming_event(stream: int, seq: int = 0, retry_ms: int = RETRY_MS) -> bytes:
    """An event with an id and empty data (the client stores the id), and the retry field.
    `seq` is where the stream stands: a resumption from this id sends what follows it."""
    return b"id: " + event_id(stream, seq) + b"\nretry: %d\ndata: \n\n" % retry_ms


def parse_event_id(value: str) -> tuple[int, int] | None:
    """`Last-Event-ID` as (stream, seq); None when it is not one of ours."""
    match = _EVENT_ID.match(value.strip())
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))


class ResumeKind(enum.Enum):
    RESUME = "resume"  # the named stream goes on on this GET, after what the client has
    NEW_GET = "new-get"  # no id: the session's standalone GET stream
    REFUSE = "refuse"  # the id names nothing this session can resume


@dataclass(frozen=True, slots=True)
class ResumeDecision:
    kind: ResumeKind
    stream: int = 0
    after: int = 0
    reason: str = ""


def decide_resume(
    last_event_id: str | None, live: frozenset[int], last_get: int | None
) -> ResumeDecision:
    """What a GET asks for: `live` are the numbers of the session's streams that can still be
    resumed, `last_get` the number of its latest standalone GET stream.

    A GET stream that ended meanwhile is simply opened again (what it would have carried waits
    for the next GET stream in any case); a POST stream that ended or expired cannot be
    resumed, and the client is told so rather than left waiting for an answer that is gone.
    """
    if last_event_id is None:
        return ResumeDecision(ResumeKind.NEW_GET)
    parsed = parse_event_id(last_event_id)
    if parsed is None:
        return ResumeDecision(
            ResumeKind.REFUSE, reason=f"Last-Event-ID {last_event_id[:64]!r} is not an event id"
        )
    stream, after = parsed
    if stream in live:
        return ResumeDecision(ResumeKind.RESUME, stream, after)
    if stream == last_get:
        return ResumeDecision(ResumeKind.NEW_GET)
    return ResumeDecision(
        ResumeKind.REFUSE,
        stream,
        after,
        reason=(
            f"Last-Event-ID {last_event_id}: stream {stream} ended or was not resumed within "
            f"{RESUME_WINDOW:g} s; send the request again"
        ),
    )
