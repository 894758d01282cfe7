"""MCP protocol versions mcpool speaks, and handshake negotiation.

The legacy era negotiates a version in the `initialize` handshake; the modern era (MODERN_VERSION)
has no handshake and carries its version per request (DESIGN P1).
"""

from __future__ import annotations

# Oldest to newest: the legacy era, each negotiated through `initialize`.
HANDSHAKE_VERSIONS: tuple[str, ...] = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_HANDSHAKE = "2025-11-25"
MODERN_VERSION = "2026-07-28"


def negotiate(requested: str | None) -> str:
    """The version to answer an `initialize` with: the client's if we speak it, else our latest.

    The MCP spec has the server answer with a version it supports and lets the client disconnect
    when it cannot speak that one, so an unknown request is not an error here.
    """
    if requested is not None and requested in HANDSHAKE_VERSIONS:
        return requested
    return LATEST_HANDSHAKE
