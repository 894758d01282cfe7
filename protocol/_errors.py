"""Error codes and the typed exceptions every layer raises.

Every McpoolError knows the JSON-RPC error it becomes (`code`, `message`, `data`); exceptions are
turned into wire errors in one place per connection, through `to_error_object()`. `data` always
explains itself with at least a "reason", because a bare code tells a user nothing (DESIGN P7).

Families follow h11: a LocalProtocolError means we produced, or were asked to produce, something
invalid; a RemoteProtocolError means the peer sent something invalid.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from msgspec import UNSET, Struct

__all__ = [
    "ATTACH_FAILED",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "MESSAGE_TOO_LARGE",
    "METHOD_NOT_FOUND",
    "NOT_ROUTABLE",
    "PARSE_ERROR",
    "RESOURCE_NOT_FOUND",
    "SESSION_CLOSING",
    "SETTINGS_INVALID",
    "UNSUPPORTED_PROTOCOL_VERSION",
    "UPSTREAM_CLOSED",
    "UPSTREAM_TIMEOUT",
    "UPSTREAM_UNAVAILABLE",
    "CannotStart",
    "InvalidParams",
    "InvalidRequest",
    "LocalProtocolError",
    "McpoolError",
    "MessageTooLarge",
    "MethodNotFound",
    "ParseError",
    "ProtocolError",
    "RemoteProtocolError",
    "SettingsError",
    "UpstreamClosed",
    "UpstreamError",
    "UpstreamTimeout",
    "UpstreamUnavailable",
]

# JSON-RPC 2.0.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

# MCP, legacy era (resources/read of an unknown URI). The modern era answers INVALID_PARAMS.
RESOURCE_NOT_FOUND = -32002
# MCP, modern era: the per-request protocol version is not one the server speaks; data names
# {"supported": [...], "requested": ...}. Auto-negotiating clients do not fall back on it.
UNSUPPORTED_PROTOCOL_VERSION = -32022

# mcpool's own codes sit outside the reserved -32768..-32000 range so they can never be mistaken
# for an upstream's JSON-RPC or MCP error (DESIGN P7).
UPSTREAM_UNAVAILABLE = -31001  # not running, failed to start, or crash-looping
UPSTREAM_CLOSED = -31002  # exited while the request was in flight
UPSTREAM_TIMEOUT = -31003
MESSAGE_TOO_LARGE = -31004
ATTACH_FAILED = -31005
SETTINGS_INVALID = -31006
SESSION_CLOSING = -31007
NOT_ROUTABLE = -31008  # no server of this session offers that resource or prompt


class ErrorObject(Struct, omit_defaults=True):
    """A JSON-RPC error object, as sent (protocol/_jsonrpc.py's envelopes carry it)."""

    code: int
    message: str
    data: Any = UNSET


class McpoolError(Exception):
    """Base of every error mcpool raises on purpose.

    `code` and `message` default per class; `data` is {"reason": reason, **extra}.
    """

    code: int = INTERNAL_ERROR
    default_message: ClassVar[str] = "Internal error"

    def __init__(
        self,
        reason: str,
        *,
        message: str | None = None,
        code: int | None = None,
        **extra: Any,
    ) -> None:
        self.message: str = message if message is not None else self.default_message
        if code is not None:
            self.code = code
        self.data: dict[str, Any] = {"reason": reason, **extra}
        super().__init__(f"{self.message}: {reason}")

    @property
    def reason(self) -> str:
        reason: str = self.data["reason"]
        return reason

    def to_error_object(self) -> ErrorObject:
        return ErrorObject(code=self.code, message=self.message, data=self.data)

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(code={self.code}, message={self.message!r}, data={self.data!r})"


class ProtocolError(McpoolError):
    code = INVALID_REQUEST
    default_message = "Protocol error"


class LocalProtocolError(ProtocolError):
    """We produced, or were asked to produce, something that is not valid on the wire."""

    code = INTERNAL_ERROR
    default_message = "Internal error"


class RemoteProtocolError(ProtocolError):
    """The peer sent something that is not valid on the wire."""

    code = INVALID_REQUEST
    default_message = "Invalid Request"


class ParseError(RemoteProtocolError):
    code = PARSE_ERROR
    default_message = "Parse error"

    def __init__(self, reason: str, *, offset: int | None = None, **extra: Any) -> None:
        # offset: the byte of the line where decoding failed, None when the decoder did not say.
        super().__init__(reason, offset=offset, **extra)

    @property
    def offset(self) -> int | None:
        offset: int | None = self.data["offset"]
        return offset


class InvalidRequest(RemoteProtocolError):
    code = INVALID_REQUEST
    default_message = "Invalid Request"


class InvalidParams(RemoteProtocolError):
    code = INVALID_PARAMS
    default_message = "Invalid params"


class MessageTooLarge(RemoteProtocolError):
    code = MESSAGE_TOO_LARGE
    default_message = "Message too large"

    def __init__(self, *, limit: int, size: int) -> None:
        # size is a lower bound when the line was still incomplete.
        super().__init__(
            f"a line of at least {size} bytes exceeds the limit of {limit} bytes",
            limit=limit,
            size=size,
        )
        self.limit = limit
        self.size = size


class MethodNotFound(McpoolError):
    code = METHOD_NOT_FOUND
    default_message = "Method not found"

    def __init__(self, method: str, reason: str | None = None, **extra: Any) -> None:
        super().__init__(reason or f"no handler for method {method!r}", method=method, **extra)
        self.method = method


class UpstreamError(McpoolError):
    """An upstream server could not serve a request; data always names the server."""

    code = UPSTREAM_UNAVAILABLE
    default_message = "Upstream server error"

    def __init__(self, server: str, reason: str, **extra: Any) -> None:
        super().__init__(reason, server=server, **extra)
        self.server = server


class UpstreamUnavailable(UpstreamError):
    code = UPSTREAM_UNAVAILABLE
    default_message = "Upstream server unavailable"


class CannotStart(UpstreamUnavailable):
    """A server that cannot work for a reason no retry fixes (its command is not there or not
    executable, a dependency is missing): its entry is `failed` with the reason, not retried."""


class UpstreamClosed(UpstreamError):
    code = UPSTREAM_CLOSED
    default_message = "Upstream server closed"


class UpstreamTimeout(UpstreamError):
    code = UPSTREAM_TIMEOUT
    default_message = "Upstream server timed out"


class SettingsError(McpoolError):
    """Invalid settings (a file or a runtime settings object), located as precisely as known."""

    code = SETTINGS_INVALID
    default_message = "Invalid settings"

    def __init__(
        self,
        reason: str,
        *,
        path: str | os.PathLike[str] | None = None,
        server: str | None = None,
        field: str | None = None,
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        self.path = os.fspath(path) if path is not None else None
        self.server = server
        self.field = field
        self.line = line
        self.column = column
        where = self._where()
        located: dict[str, Any] = {
            k: v
            for k, v in (
                ("path", self.path),
                ("server", server),
                ("field", field),
                ("line", line),
                ("column", column),
            )
            if v is not None
        }
        super().__init__(
            reason,
            message=f"Invalid settings ({where})" if where else None,
            **located,
        )

    def _where(self) -> str:
        parts: list[str] = []
        if self.path is not None:
            location = self.path
            if self.line is not None:
                location += f":{self.line}"
                if self.column is not None:
                    location += f":{self.column}"
            parts.append(location)
        elif self.line is not None:
            column = f", column {self.column}" if self.column is not None else ""
            parts.append(f"line {self.line}{column}")
        if self.server is not None:
            parts.append(f"server {self.server!r}")
        if self.field is not None:
            parts.append(f"field {self.field!r}")
        return ", ".join(parts)
