from __future__ import annotations

import pytest

from mcpool.protocol import (
    ATTACH_FAILED,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    MESSAGE_TOO_LARGE,
    METHOD_NOT_FOUND,
    NOT_ROUTABLE,
    PARSE_ERROR,
    RESOURCE_NOT_FOUND,
    SESSION_CLOSING,
    SETTINGS_INVALID,
    UPSTREAM_CLOSED,
    UPSTREAM_TIMEOUT,
    UPSTREAM_UNAVAILABLE,
    ErrorObject,
    InvalidParams,
    InvalidRequest,
    LocalProtocolError,
    McpoolError,
    Message,
    MessageTooLarge,
    MethodNotFound,
    ParseError,
    ProtocolError,
    RemoteProtocolError,
    SettingsError,
    UpstreamClosed,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
    decode,
    error_response,
)


def test_jsonrpc_codes() -> None:
    assert (PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR) == (
        -32700,
        -32600,
        -32601,
        -32602,
        -32603,
    )
    assert RESOURCE_NOT_FOUND == -32002


def test_mcpool_codes_are_outside_the_reserved_range() -> None:
    ours = [
        UPSTREAM_UNAVAILABLE,
        UPSTREAM_CLOSED,
        UPSTREAM_TIMEOUT,
        MESSAGE_TOO_LARGE,
        ATTACH_FAILED,
        SETTINGS_INVALID,
        SESSION_CLOSING,
        NOT_ROUTABLE,
    ]
    assert ours == list(range(-31001, -31009, -1))
    assert all(not -32768 <= code <= -32000 for code in ours)


def test_hierarchy() -> None:
    for cls in (ParseError, InvalidRequest, InvalidParams, MessageTooLarge):
        assert issubclass(cls, RemoteProtocolError)
    assert issubclass(RemoteProtocolError, ProtocolError)
    assert issubclass(LocalProtocolError, ProtocolError)
    assert issubclass(ProtocolError, McpoolError)
    assert issubclass(MethodNotFound, McpoolError)
    for cls in (UpstreamUnavailable, UpstreamClosed, UpstreamTimeout):
        assert issubclass(cls, UpstreamError)
    assert issubclass(UpstreamError, McpoolError)
    assert issubclass(SettingsError, McpoolError)
    assert issubclass(McpoolError, Exception)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ParseError("bad", offset=3), PARSE_ERROR),
        (InvalidRequest("bad"), INVALID_REQUEST),
        (InvalidParams("bad"), INVALID_PARAMS),
        (MessageTooLarge(limit=1, size=2), MESSAGE_TOO_LARGE),
        (LocalProtocolError("bad"), INTERNAL_ERROR),
        (MethodNotFound("x/y"), METHOD_NOT_FOUND),
        (UpstreamUnavailable("time", "crash loop"), UPSTREAM_UNAVAILABLE),
        (UpstreamClosed("time", "exited with status 1"), UPSTREAM_CLOSED),
        (UpstreamTimeout("time", "no answer in 60 s", timeout=60), UPSTREAM_TIMEOUT),
        (SettingsError("not an object"), SETTINGS_INVALID),
        (
            McpoolError("session is closing", code=SESSION_CLOSING, message="Session closing"),
            -31007,
        ),
    ],
)
def test_every_error_explains_itself(error: McpoolError, code: int) -> None:
    assert error.code == code
    assert isinstance(error.data, dict)
    assert error.data["reason"]
    assert error.message
    obj = error.to_error_object()
    assert obj == ErrorObject(code=code, message=error.message, data=error.data)
    assert error.message in str(error)
    assert error.data["reason"] in str(error)


def test_upstream_errors_name_the_server() -> None:
    error = UpstreamTimeout("time", "no answer", timeout=60)
    assert error.server == "time"
    assert error.data == {"reason": "no answer", "server": "time", "timeout": 60}


def test_method_not_found_names_the_method() -> None:
    error = MethodNotFound("x/y")
    assert error.method == "x/y"
    assert error.data["method"] == "x/y"


def test_message_too_large() -> None:
    error = MessageTooLarge(limit=10, size=11)
    assert (error.limit, error.size) == (10, 11)
    assert error.data["limit"] == 10


def test_parse_error_offset() -> None:
    assert ParseError("x", offset=4).offset == 4
    assert ParseError("x").offset is None


def test_settings_error_names_its_location() -> None:
    error = SettingsError(
        "args must be an array", path="/h/.mcp.json", server="time", field="args", line=3, column=7
    )
    assert (error.path, error.server, error.field, error.line, error.column) == (
        "/h/.mcp.json",
        "time",
        "args",
        3,
        7,
    )
    for part in ("/h/.mcp.json:3:7", "'time'", "'args'"):
        assert part in error.message
    assert error.data == {
        "reason": "args must be an array",
        "path": "/h/.mcp.json",
        "server": "time",
        "field": "args",
        "line": 3,
        "column": 7,
    }


def test_settings_error_with_nothing_known() -> None:
    error = SettingsError("bad")
    assert error.message == "Invalid settings"
    assert error.data == {"reason": "bad"}
    assert error.path is None


def test_settings_error_without_path() -> None:
    assert "line 2, column 0" in SettingsError("bad", line=2, column=0).message


def test_error_becomes_a_wire_response() -> None:
    error = UpstreamClosed("time", "exited")
    obj = error.to_error_object()
    line = error_response(7, obj.code, obj.message, obj.data)
    msg = decode(line)
    assert isinstance(msg, Message)
    assert msg.is_response
    assert b'"server":"time"' in line
