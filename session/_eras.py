"""The client side of the two protocol eras: deciding a session's era and shaping what it gets.

Theory of operation (DESIGN P1). Both eras share one socket. A session's era is decided by its
first request, once, as the SDK's dual-era server decides it: `initialize` opens a handshake-era
session (2024-11-05 to 2025-11-25); `server/discover`, or any other request carrying the
modern protocol-version key in `_meta`, opens a 2026-07-28 session (`opens_modern`). A request
that would open the modern era but carries a malformed envelope is refused and decides nothing.

In a modern session every request carries the envelope (`check_envelope`: a malformed one is
-32602, an unknown version -32022), and its reserved keys are stripped before the request goes
anywhere (`strip_envelope`): a handshake-era upstream must not see them, a modern one gets
mcpool's own. Every result gets `resultType`; list and read results also get `ttlMs` and
`cacheScope: "private"` (a session's lists are its own views, never shareable).

Results crossing eras are translated by a `ResultPlan`, built only when there is something to
translate: never for a handshake-era session on a handshake-era upstream (the hot path passes
the upstream's bytes through untouched).

`Batch` collects the answers to a 2025-03-26 JSON-RPC batch into one JSON array.
"""

from __future__ import annotations

from typing import Any

import msgspec

from mcpool.pool import wrap_structured
from mcpool.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    META_CLIENT_CAPABILITIES,
    META_CLIENT_INFO,
    META_LOG_LEVEL,
    META_PROTOCOL_VERSION,
    META_SERVER_INFO,
    MODERN_RESULT_KEYS,
    MODERN_VERSIONS,
    REQUEST_META_KEYS,
    RESOURCE_NOT_FOUND,
    UNSUPPORTED_PROTOCOL_VERSION,
    InvalidParams,
    McpoolError,
)

HANDSHAKE = "handshake"
MODERN = "modern"

# Results that carry the modern era's caching hints (the SDK's CACHEABLE_METHODS).
CACHEABLE = frozenset(
    {
        "tools/list",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "server/discover",
    }
)
# How long a modern client may cache a list: 0, immediately stale. A session's views change on
# any settings reload or upstream relist, and a client that does not listen would otherwise
# show stale tools; a listening client is told of every change anyway.
LIST_TTL_MS = 0
CACHE_SCOPE = "private"  # views are per session: a shared cache must never serve them

LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")

# The listen filter's flag per list kind.
LIST_FLAGS = {
    "tools": "toolsListChanged",
    "prompts": "promptsListChanged",
    "resources": "resourcesListChanged",
}

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


class UnsupportedVersion(McpoolError):
    """A modern request asked for a protocol version mcpool does not serve."""

    code = UNSUPPORTED_PROTOCOL_VERSION
    default_message = "Unsupported protocol version"


class Envelope(msgspec.Struct, frozen=True):
    """The reserved `_meta` keys of one modern request."""

    version: str
    capabilities: dict[str, Any]
    client_info: dict[str, Any] | None = None
    log_level: str | None = None


def opens_modern(method: str, params: dict[str, Any]) -> bool:
    """Whether a session's first request opens the modern era."""
    if method == "initialize":
        return False
    if method == "server/discover":
        return True
    meta = params.get("_meta")
    return isinstance(meta, dict) and META_PROTOCOL_VERSION in meta


def check_envelope(params: dict[str, Any]) -> Envelope:
    """Validate a modern request's envelope (the SDK's inbound ladder, without HTTP headers)."""
    meta = params.get("_meta")
    if not isinstance(meta, dict):
        raise InvalidParams(
            f"params._meta must be an object carrying the {META_PROTOCOL_VERSION!r} and "
            f"{META_CLIENT_CAPABILITIES!r} keys (protocol {MODERN_VERSIONS[-1]})",
        )
    missing = [k for k in (META_PROTOCOL_VERSION, META_CLIENT_CAPABILITIES) if k not in meta]
    if missing:
        raise InvalidParams(
            f"params._meta is missing the required key(s): {', '.join(missing)}", missing=missing
        )
    version = meta[META_PROTOCOL_VERSION]
    if not isinstance(version, str):
        raise InvalidParams("the protocol version in params._meta must be a string")
    caps = meta[META_CLIENT_CAPABILITIES]
    if not isinstance(caps, dict):
        raise InvalidParams("the client capabilities in params._meta must be an object")
    info = meta.get(META_CLIENT_INFO)
    if info is not None and not isinstance(info, dict):
        raise InvalidParams("the client info in params._meta must be an object")
    level = meta.get(META_LOG_LEVEL)
    if level is not None and level not in LOG_LEVELS:
        raise InvalidParams(f"unknown log level in params._meta: {level}", levels=list(LOG_LEVELS))
    if version not in MODERN_VERSIONS:
        raise UnsupportedVersion(
            f"protocol version {version} is not served here; supported: {list(MODERN_VERSIONS)}",
            supported=list(MODERN_VERSIONS),
            requested=version,
        )
    return Envelope(version, caps, info, level)


def strip_envelope(params: dict[str, Any]) -> None:
    """Remove the reserved request keys from `params["_meta"]` (in place); drop an emptied one."""
    meta = params.get("_meta")
    if isinstance(meta, dict) and not REQUEST_META_KEYS.isdisjoint(meta):
        rest = {k: v for k, v in meta.items() if k not in REQUEST_META_KEYS}
        if rest:
            params["_meta"] = rest
        else:
            del params["_meta"]


def initialize_refused(params: dict[str, Any]) -> McpoolError:
    """`initialize` on a session already speaking the modern era (the SDK server's answer)."""
    requested = params.get("protocolVersion")
    return UnsupportedVersion(
        f"this session speaks {MODERN_VERSIONS[-1]}, which has no initialize handshake",
        supported=list(MODERN_VERSIONS),
        requested=requested if isinstance(requested, str) else None,
    )


def modern_result(
    method: str, result: dict[str, Any], server_info: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`result` (mutated and returned) with the fields a modern result needs."""
    result.setdefault("resultType", "complete")
    if method in CACHEABLE:
        result.setdefault("ttlMs", LIST_TTL_MS)
        result.setdefault("cacheScope", CACHE_SCOPE)
    if server_info is not None:
        meta = result.get("_meta")
        result["_meta"] = {
            **(meta if isinstance(meta, dict) else {}),
            META_SERVER_INFO: server_info,
        }
    return result


def handshake_result(result: dict[str, Any]) -> dict[str, Any]:
    """`result` without the modern era's fields (strict handshake-era clients reject them)."""
    for key in MODERN_RESULT_KEYS.intersection(result):
        del result[key]
    meta = result.get("_meta")
    if isinstance(meta, dict) and META_SERVER_INFO in meta:
        rest = {k: v for k, v in meta.items() if k != META_SERVER_INFO}
        if rest:
            result["_meta"] = rest
        else:
            del result["_meta"]
    return result


def discover_result(
    capabilities: dict[str, Any], instructions: str | None, server_info: dict[str, Any]
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "supportedVersions": list(MODERN_VERSIONS),
        "capabilities": capabilities,
    }
    if instructions:
        result["instructions"] = instructions
    return modern_result("server/discover", result, server_info)


def honored_filter(requested: Any) -> dict[str, Any]:
    """The subset of a `subscriptions/listen` filter mcpool delivers: every list kind, and the
    resource URIs as asked (one that no server lists is honored and never fires, as in the SDK)."""
    if not isinstance(requested, dict):
        raise InvalidParams("subscriptions/listen needs a notifications filter object")
    honored: dict[str, Any] = {
        flag: True for flag in LIST_FLAGS.values() if requested.get(flag) is True
    }
    uris = requested.get("resourceSubscriptions")
    if uris is not None:
        if not isinstance(uris, list) or not all(isinstance(u, str) for u in uris):
            raise InvalidParams("resourceSubscriptions must be a list of URIs")
        if uris:
            honored["resourceSubscriptions"] = list(dict.fromkeys(uris))
    return honored


# The requests that open a session, one per era: answered as soon as the session's servers are
# leased, before any of them is up (L6); other requests wait for the first generation.
OPENERS = frozenset({"initialize", "server/discover"})


class ResultPlan(msgspec.Struct, frozen=True):
    """How one forwarded request's answer crosses eras (built only when something must change).

    to_modern: a modern session; the upstream's result may lack the modern fields.
    to_handshake: a handshake-era session on a modern upstream; strip the modern fields.
    wrap: the tool's non-object structured output was wrapped in the shared snapshot.
    stamp: both modern; a result without `resultType` gets "complete" (a 2026-07-28 result
    MUST carry it, a client MUST read its absence as "complete": mcpool is both, SEP-2322).
    """

    method: str
    to_modern: bool = False
    to_handshake: bool = False
    wrap: bool = False
    stamp: bool = False


def plan_for(
    method: str, *, session_modern: bool, upstream_modern: bool, wrap: bool = False
) -> ResultPlan | None:
    if session_modern and upstream_modern:
        return ResultPlan(method, wrap=wrap, stamp=True)
    if session_modern == upstream_modern and not wrap:
        return None
    return ResultPlan(
        method,
        to_modern=session_modern and not upstream_modern,
        to_handshake=upstream_modern and not session_modern,
        wrap=wrap,
    )


class InputRequired(McpoolError):
    """A modern upstream asked for client input that a handshake-era session cannot give."""

    code = INTERNAL_ERROR
    default_message = "Input required"


def translate_result(raw: bytes, plan: ResultPlan) -> bytes:
    """The result bytes as this session's era expects them. Raises InputRequired."""
    if not (plan.to_modern or plan.to_handshake or plan.wrap or plan.stamp):
        return raw
    if plan.stamp and not plan.wrap and b'"resultType"' in raw:
        return raw  # the usual modern answer: its bytes go back untouched
    try:
        result = _decoder.decode(raw)
    except msgspec.DecodeError:
        return raw
    if not isinstance(result, dict):
        return raw
    if plan.to_handshake and result.get("resultType") == "input_required":
        raise InputRequired(
            f"the server answered {plan.method} with an input_required result (protocol "
            f"{MODERN_VERSIONS[-1]}); mcpool relays that only to {MODERN_VERSIONS[-1]} clients",
            method=plan.method,
        )
    if plan.wrap:
        result = wrap_structured(result)  # the pool wrapped the schema it listed
    if plan.stamp:
        result.setdefault("resultType", "complete")
    if plan.to_modern:
        result = modern_result(plan.method, result)
    elif plan.to_handshake:
        result = handshake_result(result)
    return _encoder.encode(result)


def translate_error(raw: bytes, plan: ResultPlan, *, session_modern: bool) -> bytes:
    """Resource-not-found crosses eras: -32002 (handshake) and -32602 (modern, SEP-2164)."""
    if plan.method != "resources/read":
        return raw
    try:
        error = _decoder.decode(raw)
    except msgspec.DecodeError:
        return raw
    if not isinstance(error, dict):
        return raw
    code = error.get("code")
    if session_modern and code == RESOURCE_NOT_FOUND:
        error["code"] = INVALID_PARAMS
    elif not session_modern and plan.to_handshake and code == INVALID_PARAMS:
        error["code"] = RESOURCE_NOT_FOUND
    else:
        return raw
    return _encoder.encode(error)


class Batch:
    """The answers to one JSON-RPC batch, sent together as one array when the last arrives.

    It counts answers, not ids: each request of the batch carries the batch it came in, so
    duplicate ids, or an id reused by another batch, never mix two batches or leave one
    waiting. A member cancelled by the client gets no answer (`drop`); a batch whose every
    member was dropped sends nothing, as JSON-RPC has it for a batch of notifications.
    """

    __slots__ = ("expected", "parts")

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.parts: list[bytes] = []

    def add(self, line: bytes) -> bytes | None:
        """Take one answer (a newline-terminated line); the whole array once complete."""
        self.parts.append(line.rstrip(b"\n"))
        return self._whole()

    def drop(self) -> bytes | None:
        """One member will get no answer; the whole array if that completes the batch."""
        self.expected -= 1
        return self._whole()

    def _whole(self) -> bytes | None:
        if len(self.parts) < self.expected or not self.parts:
            return None
        return b"[" + b",".join(self.parts) + b"]\n"


__all__ = [
    "CACHEABLE",
    "CACHE_SCOPE",
    "HANDSHAKE",
    "LIST_FLAGS",
    "LIST_TTL_MS",
    "MODERN",
    "Batch",
    "Envelope",
    "InputRequired",
    "ResultPlan",
    "UnsupportedVersion",
    "check_envelope",
    "discover_result",
    "handshake_result",
    "honored_filter",
    "initialize_refused",
    "modern_result",
    "opens_modern",
    "plan_for",
    "strip_envelope",
    "translate_error",
    "translate_result",
]
