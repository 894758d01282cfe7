"""MCP protocol versions mcpool speaks, handshake negotiation, and the modern era's reserved keys.

The legacy era negotiates a version in the `initialize` handshake; the modern era (MODERN_VERSION)
has no handshake and carries its version per request, in reserved `_meta` keys (DESIGN P1).
"""

from __future__ import annotations

# Oldest to newest: the legacy era, each negotiated through `initialize`.
HANDSHAKE_VERSIONS: tuple[str, ...] = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_HANDSHAKE = "2025-11-25"
MODERN_VERSION = "2026-07-28"
# Versions served on the per-request envelope (the modern era), oldest to newest.
MODERN_VERSIONS: tuple[str, ...] = (MODERN_VERSION,)

# Reserved request `_meta` keys of the modern era (2026-07-28 "per-request protocol fields").
META_PROTOCOL_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
META_CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_LOG_LEVEL = "io.modelcontextprotocol/logLevel"
# Reserved result `_meta` key: the server's Implementation, stamped on modern results.
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"
# Reserved notification/result `_meta` key on a `subscriptions/listen` stream: the listen id.
META_SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
# Every reserved key a request may carry; stripped before a request crosses into the other era.
REQUEST_META_KEYS: frozenset[str] = frozenset(
    {META_PROTOCOL_VERSION, META_CLIENT_INFO, META_CLIENT_CAPABILITIES, META_LOG_LEVEL}
)
# Result fields that exist only in the modern era (`resultType`, caching hints).
MODERN_RESULT_KEYS: frozenset[str] = frozenset({"resultType", "ttlMs", "cacheScope"})


def negotiate(requested: str | None) -> str:
    """The version to answer an `initialize` with: the client's if we speak it, else our latest.

    The MCP spec has the server answer with a version it supports and lets the client disconnect
    when it cannot speak that one, so an unknown request is not an error here.
    """
    if requested is not None and requested in HANDSHAKE_VERSIONS:
        return requested
    return LATEST_HANDSHAKE
