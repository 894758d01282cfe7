"""The upstream side of the protocol eras (pool/_eras.py): pure decisions, no processes."""

from __future__ import annotations

from mcpool.pool._eras import (
    discover_params,
    discovered,
    envelope,
    listen_filter,
    locked_modern,
    stamp,
    wrap_output_schemas,
    wrap_structured,
)
from mcpool.protocol import (
    META_CLIENT_CAPABILITIES,
    META_CLIENT_INFO,
    META_LOG_LEVEL,
    META_PROTOCOL_VERSION,
    META_SERVER_INFO,
)

INFO = {"name": "mcpool", "version": "0"}


def test_the_probe_carries_the_modern_envelope_and_no_capabilities() -> None:
    meta = discover_params(INFO)["_meta"]
    assert meta == {
        META_PROTOCOL_VERSION: "2026-07-28",
        META_CLIENT_INFO: INFO,
        META_CLIENT_CAPABILITIES: {},
    }


def test_a_discover_result_listing_a_modern_version_is_modern_evidence() -> None:
    found = discovered(
        {
            "supportedVersions": ["2026-07-28"],
            "capabilities": {"tools": {"listChanged": True}},
            "instructions": "use it",
            "resultType": "complete",
            "_meta": {META_SERVER_INFO: {"name": "up", "version": "1"}},
        }
    )
    assert found is not None
    assert found.version == "2026-07-28"
    assert found.capabilities == {"tools": {"listChanged": True}}
    assert found.instructions == "use it"
    assert found.server_info == {"name": "up", "version": "1"}


def test_anything_else_from_discover_means_the_handshake_era() -> None:
    assert discovered(None) is None
    assert discovered([]) is None
    assert discovered({}) is None
    assert discovered({"supportedVersions": "2026-07-28"}) is None
    # A discover-answering server that advertises only handshake versions (go-sdk's default).
    assert discovered({"supportedVersions": ["2025-11-25"], "capabilities": {}}) is None


def test_minus_32022_naming_a_modern_version_means_a_late_probe_locked_the_server() -> None:
    locked = {"code": -32022, "message": "x", "data": {"supported": ["2026-07-28"]}}
    assert locked_modern(locked)
    assert not locked_modern({"code": -32022, "data": {"supported": ["2025-11-25"]}})
    assert not locked_modern({"code": -32601, "message": "Method not found"})
    assert not locked_modern({"code": -32022})
    assert not locked_modern(None)


def test_stamp_replaces_reserved_keys_and_keeps_the_rest() -> None:
    params = {
        "name": "t",
        "_meta": {"progressToken": "mcpool-1", META_PROTOCOL_VERSION: "1999-01-01"},
    }
    out = stamp(params, envelope(INFO, {"sampling": {}}, log_level="info"))
    assert out["name"] == "t"
    assert out["_meta"] == {
        "progressToken": "mcpool-1",
        META_PROTOCOL_VERSION: "2026-07-28",
        META_CLIENT_INFO: INFO,
        META_CLIENT_CAPABILITIES: {"sampling": {}},
        META_LOG_LEVEL: "info",
    }
    assert stamp({}, envelope(INFO, {}))["_meta"][META_PROTOCOL_VERSION] == "2026-07-28"


def test_the_listen_filter_asks_for_what_the_server_announces_and_the_subscribed_uris() -> None:
    caps = {
        "tools": {"listChanged": True},
        "prompts": {"listChanged": False},
        "resources": {"listChanged": True, "subscribe": True},
    }
    assert listen_filter(caps, set()) == {"toolsListChanged": True, "resourcesListChanged": True}
    assert listen_filter(caps, {"b://2", "a://1"})["resourceSubscriptions"] == ["a://1", "b://2"]
    # No subscribe capability: URIs are not asked for. Nothing at all: no stream needed.
    assert "resourceSubscriptions" not in listen_filter({"resources": {}}, {"a://1"})
    assert listen_filter({"tools": {}}, set()) == {}


def test_non_object_output_schemas_are_wrapped_and_named() -> None:
    tools = [
        {"name": "n", "inputSchema": {"type": "object"}, "outputSchema": {"type": "integer"}},
        {"name": "o", "inputSchema": {"type": "object"}, "outputSchema": {"type": "object"}},
        {"name": "p", "inputSchema": {"type": "object"}},
    ]
    out, wrapped = wrap_output_schemas(tools)
    assert wrapped == frozenset({"n"})
    assert out[0]["outputSchema"] == {
        "type": "object",
        "properties": {"result": {"type": "integer"}},
        "required": ["result"],
    }
    assert out[1] is tools[1]
    assert out[2] is tools[2]
    assert tools[0]["outputSchema"] == {"type": "integer"}  # the listed objects are not mutated


def test_structured_output_of_a_wrapped_tool_is_wrapped_the_same_way() -> None:
    result = {"content": [], "structuredContent": 3, "resultType": "complete"}
    assert wrap_structured(result)["structuredContent"] == {"result": 3}
    assert result["structuredContent"] == 3
    assert wrap_structured({"content": []}) == {"content": []}
