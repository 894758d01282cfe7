"""Input requests for a 2026-07-28 session from a handshake-era upstream (issue 18).

Theory of operation. A handshake-era server asks its client for input (`sampling/createMessage`,
`elicitation/create`, `roots/list`) as a server-to-client request in the middle of a call. A
2026-07-28 client takes no requests on its wire: at that revision the server answers the call
with an `input_required` result carrying the requests, and the client sends the call again with
`inputResponses` and the echoed `requestState` (the "multi round-trip requests" pattern, MRTR).
mcpool joins the two: the upstream's request is attributed to the session's call in flight
(P5), the call's answer to the client becomes an `input_required` result carrying it, and the
upstream's call stays open (`Held`): when the client retries, its answers go to the upstream's
pending requests and the retry waits for the call's answer, which may be another round of input
requests, or the result.

`requestState` is mcpool's own and is never trusted (MRTR "Server Requirements"): it is an
unguessable token (`STATE_PREFIX` + 144 random bits) naming a held call of this session only, so
another session (principal) cannot use it; it is good for one retry (each round gets a new one),
for `INPUT_RETRY_TIMEOUT` seconds, and only on the request it was issued for: the same method,
server, name or URI, and arguments (`Subject`). Anything else is an invalid-params error and the
held call is untouched. A retry that never comes is bounded: past the timeout the upstream's
pending requests get an error and its call is cancelled; a session that closes does the same.

This module holds the decisions (no I/O, no session): `Held` is one held call's state machine,
`subject_of` what a retry must match. The session does the sending.
"""

from __future__ import annotations

import secrets
from typing import Any

import msgspec

from mcpool.protocol import InvalidParams, McpoolError

# How long a held call waits for the client's retry: a person answering an elicitation form
# takes minutes; past this the client is not coming back and the upstream must not hang on it.
INPUT_RETRY_TIMEOUT = 300.0
# Input requests one call may make through mcpool: a tool asking more often than this is looping
# (a real agentic tool samples a few dozen times at most).
MAX_ASKS_PER_CALL = 64
# Calls of one session held for a retry at once: each keeps an upstream request open.
MAX_HELD_CALLS = 16
# What marks a requestState as mcpool's (a modern upstream's own passes through untouched).
STATE_PREFIX = "mcpool."

# The server-to-client requests that travel as input requests, and the client capability each
# needs (MRTR: a server must not ask for what the client did not declare).
INPUT_METHODS: dict[str, str] = {
    "sampling/createMessage": "sampling",
    "elicitation/create": "elicitation",
    "roots/list": "roots",
}
# The requests an input_required result may answer (MRTR "Supported Requests").
HOLDABLE = frozenset({"tools/call", "prompts/get", "resources/read"})

_encoder = msgspec.json.Encoder(order="sorted")


class Subject(msgspec.Struct, frozen=True):
    """What a retry must match to carry on a held call: the request it was issued for."""

    method: str
    server: str
    target: str  # the tool or prompt name, or the resource URI
    arguments: bytes  # canonical JSON of the arguments (tools and prompts)


def subject_of(method: str, server: str, params: dict[str, Any]) -> Subject:
    """The subject of a (forwarded) request's params: name or URI and arguments."""
    target = params.get("uri") if method == "resources/read" else params.get("name")
    arguments = params.get("arguments")
    return Subject(
        method,
        server,
        target if isinstance(target, str) else "",
        _encoder.encode(arguments) if arguments is not None else b"",
    )


def is_ours(state: Any) -> bool:
    """Whether a requestState is one mcpool issued (else it belongs to a modern upstream)."""
    return isinstance(state, str) and state.startswith(STATE_PREFIX)


def new_state() -> str:
    return STATE_PREFIX + secrets.token_urlsafe(18)


class StateRejected(InvalidParams):
    """A retry whose requestState fails verification (unknown, expired, used, or another
    request's): the MRTR rules say reject it; the client starts over with a fresh request."""


class InputRefused(McpoolError):
    """An upstream's input request mcpool will not carry to the session (the reason says why)."""


class Ask(msgspec.Struct):
    """One of the upstream's server-to-client requests, pending until the client answers it."""

    key: str  # its key in inputRequests / inputResponses
    method: str
    params: dict[str, Any] | None
    upstream_id: Any  # the id the upstream sent it with: its answer goes back under this id


class Retry(msgspec.Struct, frozen=True):
    """What a valid retry does: the answers to give the upstream, then `then`:
    "final" (the call's answer is already here), "ask" (input still missing: another
    input_required result) or "wait" (the retry waits for the call's answer)."""

    answers: list[tuple[Ask, dict[str, Any]]]
    then: str


class Held:
    """One session call whose handshake-era upstream asked for input (the state machine).

    `waiting`: a client request waits for this call's answer (the original request, or the
    retry that answered the last round); otherwise the client was sent `input_required` and
    the call waits for a retry carrying `state`, until `deadline`.
    """

    __slots__ = ("asks", "deadline", "final", "made", "state", "subject", "waiting")

    def __init__(self, subject: Subject) -> None:
        self.subject = subject
        self.asks: dict[str, Ask] = {}  # unanswered, in the order the upstream asked
        self.made = 0  # input requests this call has made (bounded: MAX_ASKS_PER_CALL)
        self.waiting = True
        self.state: str | None = None
        self.deadline = 0.0
        self.final: Any = None  # the call's answer when it came while no request waited

    def ask(self, upstream_id: Any, method: str, params: dict[str, Any] | None) -> Ask:
        """Take one upstream request; raises InputRefused past the bound."""
        if method not in INPUT_METHODS:
            raise InputRefused(f"{method} is not an input request mcpool can carry")
        if self.made >= MAX_ASKS_PER_CALL:
            raise InputRefused(
                f"the call made more than {MAX_ASKS_PER_CALL} input requests (a loop?)"
            )
        self.made += 1
        ask = Ask(f"{method.split('/')[0]}-{self.made}", method, params, upstream_id)
        self.asks[ask.key] = ask
        return ask

    def input_required(self, now: float) -> dict[str, Any]:
        """The `input_required` result for the waiting request; from here the call waits for
        the retry (a fresh state, good until `now + INPUT_RETRY_TIMEOUT`)."""
        assert self.waiting
        assert self.asks
        self.waiting = False
        self.state = new_state()
        self.deadline = now + INPUT_RETRY_TIMEOUT
        requests = {}
        for key, ask in self.asks.items():
            request: dict[str, Any] = {"method": ask.method}
            if ask.params is not None:
                request["params"] = ask.params
            requests[key] = request
        return {
            "resultType": "input_required",
            "inputRequests": requests,
            "requestState": self.state,
        }

    def retry(self, subject: Subject, responses: dict[str, Any], now: float) -> Retry:
        """A retry that presented this call's state: verify it, take its answers (keys it does
        not know are ignored, as MRTR asks) and say what follows. Raises StateRejected."""
        if self.waiting or self.state is None:
            raise StateRejected("the requestState was already used", requestState="used")
        if now >= self.deadline:
            raise StateRejected(
                f"the requestState expired (a retry must come within {INPUT_RETRY_TIMEOUT:g} s)",
                requestState="expired",
            )
        if subject != self.subject:
            raise StateRejected(
                "the requestState was issued for another request (the retry must repeat the "
                "original method, name or URI, and arguments)",
                requestState="mismatch",
            )
        answers = []
        for key in list(self.asks):
            response = responses.get(key)
            if isinstance(response, dict):
                answers.append((self.asks.pop(key), response))
        self.state = None
        self.waiting = True
        if self.final is not None:
            then = "final"
        elif self.asks:
            then = "ask"
        else:
            then = "wait"
        return Retry(answers, then)

    def drop(self, upstream_id: Any) -> bool:
        """The upstream gave up on one of its requests (cancelled it); whether it was here."""
        for key, ask in self.asks.items():
            if ask.upstream_id == upstream_id:
                del self.asks[key]
                return True
        return False

    def expired(self, now: float) -> bool:
        return not self.waiting and now >= self.deadline


__all__ = [
    "HOLDABLE",
    "INPUT_METHODS",
    "INPUT_RETRY_TIMEOUT",
    "MAX_ASKS_PER_CALL",
    "MAX_HELD_CALLS",
    "STATE_PREFIX",
    "Ask",
    "Held",
    "InputRefused",
    "Retry",
    "StateRejected",
    "Subject",
    "is_ours",
    "new_state",
    "subject_of",
]
