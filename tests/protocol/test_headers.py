"""2026-07-28 request metadata headers (protocol/_headers.py): the spec's own examples."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mcpool.protocol._headers import (
    decode_header_value,
    encode_header_value,
    error_status,
    header_mismatch,
    header_params,
    param_header_mismatch,
    param_headers,
    standard_headers,
)


def test_value_encoding_follows_the_spec_table() -> None:
    assert encode_header_value("us-west1") == "us-west1"
    assert encode_header_value("Hello, 世界") == "=?base64?SGVsbG8sIOS4lueVjA==?="
    assert encode_header_value(" padded ") == "=?base64?IHBhZGRlZCA=?="
    assert encode_header_value("line1\nline2") == "=?base64?bGluZTEKbGluZTI=?="
    assert encode_header_value("=?base64?literal?=") == "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="


def test_a_value_ending_in_a_newline_is_encoded_not_passed_as_it_is() -> None:
    # A regex `$` matches before a final newline: "a\n" once passed as a plain value.
    for value in ("a\n", "0\n", "=?base64?YQ==?=\n"):
        encoded = encode_header_value(value)
        assert encoded.startswith("=?base64?") and "\n" not in encoded
        assert decode_header_value(encoded) == value


@given(st.text())
def test_every_value_round_trips_and_is_a_safe_header(value: str) -> None:
    encoded = encode_header_value(value)
    assert all(0x20 <= ord(c) <= 0x7E for c in encoded)
    assert decode_header_value(encoded) == value


def test_standard_headers() -> None:
    assert standard_headers("tools/list", {}) == {"Mcp-Method": "tools/list"}
    assert standard_headers("tools/call", {"name": "get_weather"}) == {
        "Mcp-Method": "tools/call",
        "Mcp-Name": "get_weather",
    }
    uri = "file:///projects/myapp/config.json"
    assert standard_headers("resources/read", {"uri": uri})["Mcp-Name"] == uri
    assert standard_headers("prompts/get", {"name": 3}) == {"Mcp-Method": "prompts/get"}


def test_x_mcp_header_annotations_and_their_rules() -> None:
    schema = {
        "type": "object",
        "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "deep": {"properties": {"n": {"type": "integer", "x-mcp-header": "N"}}},
            "flag": {"type": "boolean", "x-mcp-header": "Flag"},
        },
    }
    found = header_params(schema)
    assert found == {("region",): "Region", ("deep", "n"): "N", ("flag",): "Flag"}
    assert isinstance(found, dict)
    assert param_headers(found, {"region": "eu", "deep": {"n": -7}, "flag": False}) == {
        "Mcp-Param-Region": "eu",
        "Mcp-Param-N": "-7",
        "Mcp-Param-Flag": "false",
    }
    assert param_headers(found, {"region": None, "deep": 1}) == {}  # absent or null: omitted

    def prop(p: dict[str, object]) -> dict[str, object]:
        return {"type": "object", "properties": {"a": p}}

    assert isinstance(header_params(prop({"type": "number", "x-mcp-header": "A"})), str)
    assert isinstance(header_params(prop({"type": "string", "x-mcp-header": "a b"})), str)
    assert isinstance(header_params(prop({"type": "string", "x-mcp-header": ""})), str)
    twice = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "x-mcp-header": "X"},
            "b": {"type": "string", "x-mcp-header": "x"},
        },
    }
    assert isinstance(header_params(twice), str)
    under_any = {"anyOf": [prop({"type": "string", "x-mcp-header": "A"})]}
    assert isinstance(header_params(under_any), str)
    assert header_params(None) == {}


def test_server_side_checks_and_statuses() -> None:
    assert header_mismatch("tools/list", {}, {"mcp-method": "tools/list"}) is None
    assert header_mismatch("tools/list", {}, {"mcp-method": "tools/call"}) is not None
    encoded = {"mcp-method": "tools/call", "mcp-name": "=?base64?SGVsbG8sIOS4lueVjA==?="}
    assert header_mismatch("tools/call", {"name": "Hello, 世界"}, encoded) is None
    assert header_mismatch("tools/call", {"name": "other"}, encoded) is not None
    assert error_status(-32601) == 404
    assert [error_status(c) for c in (-32700, -32600, -32602, -32020, -32021, -32022)] == [400] * 6
    assert error_status(-32603) == 200 and error_status(-31001) == 200 and error_status("x") == 200


REGION = {("region",): "Region"}


def test_param_headers_that_agree_with_the_body_pass() -> None:
    assert (
        param_header_mismatch(REGION, {"region": "us-west1"}, {"mcp-param-region": "us-west1"})
        is None
    )
    # The sentinel is decoded before comparing; a value without its closing ?= is literal.
    assert (
        param_header_mismatch(
            REGION, {"region": "Hello"}, {"mcp-param-region": "=?base64?SGVsbG8=?="}
        )
        is None
    )
    literal = "=?base64?SGVsbG8="
    assert param_header_mismatch(REGION, {"region": literal}, {"mcp-param-region": literal}) is None
    # Null or absent in the body: no header expected.
    assert param_header_mismatch(REGION, {"region": None}, {}) is None
    assert param_header_mismatch(REGION, {}, {}) is None
    # Integers numerically, booleans as true/false.
    counts = {("n",): "N", ("on",): "On"}
    agreeing = {"mcp-param-n": "42.0", "mcp-param-on": "true"}
    assert param_header_mismatch(counts, {"n": 42, "on": True}, agreeing) is None
    assert param_header_mismatch(counts, {"n": 42, "on": False}, agreeing) is not None


def test_param_headers_that_disagree_with_the_body_are_named() -> None:
    why = param_header_mismatch(REGION, {"region": "us-west1"}, {})
    assert why is not None and "Mcp-Param-Region header is missing" in why
    why = param_header_mismatch(REGION, {"region": "us-west1"}, {"mcp-param-region": "eu-north1"})
    assert why is not None and "does not match" in why
    why = param_header_mismatch(REGION, {}, {"mcp-param-region": "us-west1"})
    assert why is not None and "body has no arguments.region" in why
    # Base64 the sentinel cannot decode strictly: missing padding, characters off the alphabet.
    for bad in ("=?base64?SGVsbG8?=", "=?base64?SGVs!!!bG8=?="):
        why = param_header_mismatch(REGION, {"region": "Hello"}, {"mcp-param-region": bad})
        assert why is not None and "Base64" in why, bad
    why = param_header_mismatch(REGION, {"region": "é"}, {"mcp-param-region": "é"})
    assert why is not None and "visible ASCII" in why
