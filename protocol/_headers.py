"""The 2026-07-28 Streamable HTTP request metadata (transports/streamable-http, "Request Metadata").

Pure functions shared by both sides: the client mirrors `method`, `params.name`/`params.uri` and a
tool's `x-mcp-header` arguments into `Mcp-Method`, `Mcp-Name` and `Mcp-Param-*` headers; the
server compares what it was sent with the body and picks the HTTP status a JSON-RPC error must
carry in that revision (400 for a malformed or mismatched request, 404 for an unknown method).
"""

from __future__ import annotations

import base64
import re
from typing import Any

from ._errors import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    UNSUPPORTED_PROTOCOL_VERSION,
)

# MCP, modern era: headers and body disagree, or a required header is missing (-32020), and the
# request lacks a client capability the server requires (-32021) (basic/index, "Error Codes").
HEADER_MISMATCH = -32020
MISSING_REQUIRED_CLIENT_CAPABILITY = -32021

METHOD_HEADER = "mcp-method"
NAME_HEADER = "mcp-name"
PARAM_HEADER_PREFIX = "Mcp-Param-"
# The params member mirrored as `Mcp-Name`, per method (the spec's "Standard Request Headers").
NAME_BEARING = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
# Legacy-era methods 2026-07-28 removed (changelog, major changes 2, 4 and 5): a request for one
# at that revision is an unknown method (-32601, HTTP 404), not served under legacy semantics.
REMOVED_AT_MODERN = frozenset(
    {"initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"}
)

# The HTTP status of a JSON-RPC error at 2026-07-28 (streamable-http: 400 for unsupported
# version, header mismatch, missing capability; 404 with -32601 for an unknown method). Other
# codes (internal errors, tool failures, mcpool's own) are answered with 200.
_ERROR_STATUS = {
    PARSE_ERROR: 400,
    INVALID_REQUEST: 400,
    INVALID_PARAMS: 400,
    HEADER_MISMATCH: 400,
    MISSING_REQUIRED_CLIENT_CAPABILITY: 400,
    UNSUPPORTED_PROTOCOL_VERSION: 400,
    METHOD_NOT_FOUND: 404,
}

# `\Z`, never `$`: `$` also matches before a final newline, which would let "a\n" pass as a
# plain header value (a header injection). Each is used with `match`, anchored at the start.
_SAFE_VALUE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?\Z")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_SENTINEL = re.compile(r"=\?base64\?(.*)\?=\Z", re.DOTALL)
_SAFE_INTEGER = 2**53 - 1  # x-mcp-header integers must be JavaScript-safe


def error_status(code: Any) -> int:
    """The HTTP status a 2026-07-28 response carrying JSON-RPC error `code` is sent with."""
    return _ERROR_STATUS.get(code, 200) if isinstance(code, int) else 200


def encode_header_value(value: str) -> str:
    """`value` as a header value: itself when plain visible ASCII without edge whitespace and
    not looking like the sentinel, else `=?base64?...?=` of its UTF-8 ("Value Encoding")."""
    if _SAFE_VALUE.match(value) and not _SENTINEL.match(value):
        return value
    return "=?base64?" + base64.b64encode(value.encode()).decode("ascii") + "?="


def decode_header_value(value: str) -> str | None:
    """A header value as the client meant it (the sentinel decoded); None when undecodable."""
    match = _SENTINEL.match(value)
    if match is None:
        return value
    try:
        return base64.b64decode(match.group(1), validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def standard_headers(method: str, params: Any) -> dict[str, str]:
    """`Mcp-Method` always; `Mcp-Name` for the name-bearing methods when the body names one."""
    headers = {"Mcp-Method": method}
    key = NAME_BEARING.get(method)
    if key is not None and isinstance(params, dict):
        name = params.get(key)
        if isinstance(name, str):
            headers["Mcp-Name"] = encode_header_value(name)
    return headers


def _render(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and abs(value) <= _SAFE_INTEGER:
        return str(value)
    if isinstance(value, str):
        return value
    return None


def header_params(input_schema: Any) -> dict[tuple[str, ...], str] | str:
    """The `x-mcp-header` annotations of a tool's input schema, by property path; or, when one
    breaks the spec's constraints (not a token, duplicated, not a primitive, not reachable
    through `properties` alone), the reason the tool must be rejected."""
    found: dict[tuple[str, ...], str] = {}
    seen: set[str] = set()
    stack: list[tuple[tuple[str, ...] | None, Any]] = [((), input_schema)]
    while stack:
        path, schema = stack.pop()
        if not isinstance(schema, dict):
            continue
        token = schema.get("x-mcp-header")
        if token is not None:
            if not path:
                return "x-mcp-header on the schema root or off a properties chain"
            if not isinstance(token, str) or not _TOKEN.match(token):
                return f"x-mcp-header {token!r} is not an HTTP field-name token"
            if token.lower() in seen:
                return f"x-mcp-header {token!r} is used twice"
            if schema.get("type") not in ("string", "integer", "boolean"):
                return f"x-mcp-header {token!r} is on a non-primitive parameter"
            seen.add(token.lower())
            found[path] = token
        for key, sub in schema.items():
            if key == "properties" and isinstance(sub, dict):
                for name, prop in sub.items():
                    stack.append(((*path, name) if path is not None else None, prop))
            elif key in ("items", "not", "if", "then", "else", "additionalProperties"):
                stack.append((None, sub))
            elif key in ("allOf", "anyOf", "oneOf", "prefixItems") and isinstance(sub, list):
                stack.extend((None, s) for s in sub)
            elif key in ("$defs", "definitions", "patternProperties") and isinstance(sub, dict):
                stack.extend((None, s) for s in sub.values())
    return found


def _argument_at(arguments: Any, path: tuple[str, ...]) -> Any:
    """The value at an annotated property path of a call's arguments; None when absent."""
    node: Any = arguments
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def param_headers(annotated: dict[tuple[str, ...], str], arguments: Any) -> dict[str, str]:
    """`Mcp-Param-{token}` for each annotated argument present (and not null) in `arguments`."""
    headers: dict[str, str] = {}
    for path, token in annotated.items():
        rendered = _render(_argument_at(arguments, path))
        if rendered is not None:
            headers[PARAM_HEADER_PREFIX + token] = encode_header_value(rendered)
    return headers


def header_mismatch(method: str, params: Any, headers: dict[str, str]) -> str | None:
    """Why the standard headers of a request a server was sent (lowercase names, values
    trimmed) disagree with its body, or are missing ("Server Validation"); None when they agree.
    `Mcp-Name` is required when the body names something."""
    sent = headers.get(METHOD_HEADER)
    if sent is None:
        return "the Mcp-Method header is missing"
    if sent != method:
        return f"the Mcp-Method header {sent!r} does not match the body's method {method!r}"
    key = NAME_BEARING.get(method)
    body = params.get(key) if key is not None and isinstance(params, dict) else None
    if body is None:
        return None
    name = headers.get(NAME_HEADER)
    if name is None:
        return f"the Mcp-Name header is missing (the body's {key} is {body!r})"
    if decode_header_value(name) != body:
        return f"the Mcp-Name header does not match the body's {key} {body!r}"
    return None


_HEADER_CHARS = re.compile(r"[\x20-\x7e]*\Z")


def _body_matches(header: str, body: Any) -> bool:
    """A decoded `Mcp-Param-*` value against the body's value: integers numerically ("Server
    Validation" note: `42.0` and `42` are equal), booleans as `true`/`false`, strings exactly."""
    if isinstance(body, bool):
        return header == ("true" if body else "false")
    if isinstance(body, int | float):
        try:
            return float(header) == body
        except ValueError:
            return False
    return isinstance(body, str) and header == body


def param_header_mismatch(
    annotated: dict[tuple[str, ...], str], arguments: Any, headers: dict[str, str]
) -> str | None:
    """Why the `Mcp-Param-*` headers of a tools/call a server was sent (lowercase names,
    values trimmed) disagree with its body's arguments for the tool's `x-mcp-header`
    annotations (streamable-http, "Server Behavior for Custom Headers"); None when they agree.

    A value in the body needs its header; a header needs the value; a header's value must be
    visible ASCII, decode when it is the Base64 sentinel, and equal the body's value. Headers
    the tool does not annotate are not mcpool's to judge (intermediaries forward those).
    """
    for path, token in annotated.items():
        node = _argument_at(arguments, path)
        name = PARAM_HEADER_PREFIX + token
        sent = headers.get(name.lower())
        where = "arguments." + ".".join(path)
        if sent is None:
            if node is not None:
                return f"the {name} header is missing (the body's {where} is {node!r})"
            continue
        if not _HEADER_CHARS.match(sent):
            return f"the {name} header has characters outside visible ASCII"
        value = decode_header_value(sent)
        if value is None:
            return f"the {name} header is not valid Base64 inside =?base64?...?="
        if node is None:
            return f"the {name} header is sent but the body has no {where}"
        if not _body_matches(value, node):
            return f"the {name} header does not match the body's {where} {node!r}"
    return None
