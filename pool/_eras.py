"""The upstream side of the two protocol eras: detecting a server's era, and speaking it.

Theory of operation (DESIGN P1). After spawning, a connection probes `server/discover` with the
modern per-request envelope in `_meta` (`discover_params`). `discovered()` reads the answer: a
result that lists a version mcpool speaks is modern evidence; anything else (an error, a
timeout, a result advertising only handshake versions) means the handshake era, and
`initialize` runs as it always did. One answer to that `initialize` is modern evidence after
all, as the SDK client also treats it: -32022 naming a modern version means a probe we stopped
waiting for did reach the server and lock it modern (`locked_modern`), so it is probed again.

A modern upstream gets the envelope on every request (`stamp`). Two handshake-era requests the
pool sends have no modern counterpart and are translated by the connection instead:
`logging/setLevel` becomes the per-request log level of the envelope, and
`resources/subscribe`/`unsubscribe` change the resource set of the connection's one
`subscriptions/listen` stream (`listen_filter`), whose list_changed notifications then take the
same relist path as unsolicited ones.

Structured output: the modern era allows any JSON Schema as a tool's `outputSchema` and any JSON
value as `structuredContent`; the handshake era requires objects. A modern upstream's non-object
output schemas are wrapped once, at listing time, as `{"result": <schema>}` (what the SDKs do for
non-object return types), so the snapshot every session shares is valid in both eras; the
matching call results are wrapped the same way (`wrap_structured`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from mcpool.protocol import (
    META_CLIENT_CAPABILITIES,
    META_CLIENT_INFO,
    META_LOG_LEVEL,
    META_PROTOCOL_VERSION,
    META_SERVER_INFO,
    MODERN_VERSIONS,
    REQUEST_META_KEYS,
    UNSUPPORTED_PROTOCOL_VERSION,
)

HANDSHAKE = "handshake"
MODERN = "modern"
# A modern server whose handshake-era connection was refused: its sessions share the modern one.
MODERN_ONLY = "modern-only"

# Handshake-era requests a modern upstream does not serve; the connection answers them itself.
LOCAL_ON_MODERN = frozenset({"logging/setLevel", "resources/subscribe", "resources/unsubscribe"})

# The listen filter's flag per list kind (capability name -> SubscriptionFilter field).
LIST_FLAGS = {
    "tools": "toolsListChanged",
    "prompts": "promptsListChanged",
    "resources": "resourcesListChanged",
}

WRAPPED_FIELD = "result"  # the property a wrapped non-object structured output sits under


class Discovered(msgspec.Struct, frozen=True):
    """What a modern upstream's `server/discover` result says about it."""

    version: str
    capabilities: dict[str, Any]
    instructions: str | None
    server_info: dict[str, Any]


def envelope(
    client_info: dict[str, Any],
    capabilities: dict[str, Any],
    *,
    version: str = MODERN_VERSIONS[-1],
    log_level: str | None = None,
) -> dict[str, Any]:
    """The reserved `_meta` keys every modern request carries."""
    meta: dict[str, Any] = {
        META_PROTOCOL_VERSION: version,
        META_CLIENT_INFO: client_info,
        META_CLIENT_CAPABILITIES: capabilities,
    }
    if log_level is not None:
        meta[META_LOG_LEVEL] = log_level
    return meta


def discover_params(
    client_info: dict[str, Any], version: str = MODERN_VERSIONS[-1]
) -> dict[str, Any]:
    """The probe's params. mcpool's own requests declare no client capabilities."""
    return {"_meta": envelope(client_info, {}, version=version)}


def retry_version(error: Any) -> str | None:
    """The version to probe again at after an UnsupportedProtocolVersionError (-32022): the
    newest modern version mcpool speaks among its `supported`, or None when there is none.

    A -32022 is a modern server's answer (2026-07-28 versioning, "Backward Compatibility"): the
    client retries at a version from that list rather than falling back to `initialize`.
    """
    if not isinstance(error, dict) or error.get("code") != UNSUPPORTED_PROTOCOL_VERSION:
        return None
    data = error.get("data")
    supported = data.get("supported") if isinstance(data, dict) else None
    if not isinstance(supported, list):
        return None
    mutual = [v for v in MODERN_VERSIONS if v in supported]
    return mutual[-1] if mutual else None


def stamp(params: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """`params` with the envelope `meta` in its `_meta` (mutated and returned).

    Reserved keys the caller put there are replaced: the connection speaks for itself (the
    session's own envelope was stripped when its request arrived).
    """
    current = params.get("_meta")
    if isinstance(current, dict):
        merged = {k: v for k, v in current.items() if k not in REQUEST_META_KEYS}
        merged.update(meta)
        params["_meta"] = merged
    else:
        params["_meta"] = dict(meta)
    return params


def discovered(result: Any) -> Discovered | None:
    """The upstream's modern self-description, or None when the result is no modern evidence."""
    if not isinstance(result, dict):
        return None
    versions = result.get("supportedVersions")
    if not isinstance(versions, list):
        return None
    mutual = [v for v in MODERN_VERSIONS if v in versions]
    if not mutual:
        # A discover-answering server that advertises only handshake versions: handshake era.
        return None
    caps = result.get("capabilities")
    instructions = result.get("instructions")
    meta = result.get("_meta")
    info = meta.get(META_SERVER_INFO) if isinstance(meta, dict) else None
    return Discovered(
        version=mutual[-1],
        capabilities=caps if isinstance(caps, dict) else {},
        instructions=instructions if isinstance(instructions, str) else None,
        server_info=info if isinstance(info, dict) else {},
    )


def locked_modern(error: Any) -> bool:
    """Whether an error answering `initialize` says the server is locked in the modern era."""
    if not isinstance(error, dict) or error.get("code") != UNSUPPORTED_PROTOCOL_VERSION:
        return False
    data = error.get("data")
    supported = data.get("supported") if isinstance(data, dict) else None
    return isinstance(supported, list) and any(v in supported for v in MODERN_VERSIONS)


def listen_filter(capabilities: dict[str, Any], uris: set[str] | frozenset[str]) -> dict[str, Any]:
    """The `subscriptions/listen` filter for a modern upstream: every list kind it announces
    changes for, and the resources some session subscribed to. Empty: no stream is needed."""
    wanted: dict[str, Any] = {}
    for kind, flag in LIST_FLAGS.items():
        cap = capabilities.get(kind)
        if isinstance(cap, dict) and cap.get("listChanged") is True:
            wanted[flag] = True
    resources = capabilities.get("resources")
    if uris and isinstance(resources, dict) and resources.get("subscribe") is True:
        wanted["resourceSubscriptions"] = sorted(uris)
    return wanted


def wrap_output_schemas(tools: Sequence[Any]) -> tuple[list[Any], frozenset[str]]:
    """Tools with every non-object `outputSchema` wrapped; and the names of those tools."""
    wrapped: set[str] = set()
    out: list[Any] = []
    for tool in tools:
        schema = tool.get("outputSchema") if isinstance(tool, dict) else None
        if isinstance(schema, dict) and schema.get("type") != "object":
            inner = {k: v for k, v in schema.items() if k != "$schema"}
            outer: dict[str, Any] = {
                "type": "object",
                "properties": {WRAPPED_FIELD: inner},
                "required": [WRAPPED_FIELD],
            }
            if "$schema" in schema:
                outer["$schema"] = schema["$schema"]
            tool = {**tool, "outputSchema": outer}
            if isinstance(tool.get("name"), str):
                wrapped.add(tool["name"])
        out.append(tool)
    return out, frozenset(wrapped)


def wrap_structured(result: dict[str, Any]) -> dict[str, Any]:
    """A call result of a wrapped tool, its structuredContent wrapped to match the schema."""
    if "structuredContent" in result and result["structuredContent"] is not None:
        return {**result, "structuredContent": {WRAPPED_FIELD: result["structuredContent"]}}
    return result


__all__ = [
    "HANDSHAKE",
    "LOCAL_ON_MODERN",
    "MODERN",
    "MODERN_ONLY",
    "WRAPPED_FIELD",
    "Discovered",
    "discover_params",
    "discovered",
    "envelope",
    "listen_filter",
    "locked_modern",
    "retry_version",
    "stamp",
    "wrap_output_schemas",
    "wrap_structured",
]
