"""Issue 18, item 1: `mcpool daemon --http` at 2026-07-28 answers as the revision's
streamable-http page says: JSON-RPC errors carry 400 or 404 (not 200), the methods the revision
removed (`initialize`, `ping`, `logging/setLevel`) are unknown methods there, and an unsupported
MCP-Protocol-Version is -32022 with the request's id and the versions served.

Real HTTP requests (httpx2) against a real daemon with a stdio upstream behind it.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from e2e.harness import DaemonFactory
from e2e.support import STEP_TIMEOUT
from e2e.test_http_fence import http_daemon

pytest.importorskip("h11")

MODERN = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"},
}


def body(msg_id: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": msg_id,
        "method": method,
        "params": {**(params or {}), "_meta": dict(META)},
    }


async def post(
    port: int, message: dict[str, Any], version: str = MODERN, **headers: str
) -> httpx2.Response:
    async with httpx2.AsyncClient(timeout=STEP_TIMEOUT) as client:
        return await client.post(
            f"http://127.0.0.1:{port}/mcp",
            content=json.dumps(message),
            headers={
                "content-type": "application/json",
                "accept": "application/json, text/event-stream",
                "mcp-protocol-version": version,
                "mcp-method": str(message["method"]),
                **headers,
            },
        )


def sse_messages(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


async def test_modern_errors_carry_400_and_404(daemon_factory: DaemonFactory) -> None:
    _daemon, port = await http_daemon(daemon_factory)

    for msg_id, method in enumerate(("initialize", "ping", "logging/setLevel", "no/such"), 1):
        params = {"level": "info"} if method == "logging/setLevel" else {}
        reply = await post(port, body(msg_id, method, params))
        assert reply.status_code == 404, (method, reply.text)
        assert reply.headers["content-type"] == "application/json"
        error = reply.json()
        assert error["id"] == msg_id and error["error"]["code"] == -32601, error

    # A malformed envelope (no client capabilities) is invalid params: 400.
    bad = body(7, "tools/list")
    del bad["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
    reply = await post(port, bad)
    assert reply.status_code == 400, reply.text
    assert reply.json()["id"] == 7 and reply.json()["error"]["code"] == -32602

    # Headers that contradict the body: HeaderMismatch, 400.
    reply = await post(port, body(8, "tools/list"), **{"mcp-method": "prompts/list"})
    assert reply.status_code == 400, reply.text
    assert reply.json()["id"] == 8 and reply.json()["error"]["code"] == -32020

    # A request that succeeds is still a 200 stream with its result.
    reply = await post(port, body(9, "tools/list"))
    assert reply.status_code == 200, reply.text
    [result] = [m for m in sse_messages(reply.text) if m.get("id") == 9]
    assert result["result"]["resultType"] == "complete"
    assert "fake__echo" in [t["name"] for t in result["result"]["tools"]]


async def test_unsupported_version_names_the_request_and_what_is_served(
    daemon_factory: DaemonFactory,
) -> None:
    _daemon, port = await http_daemon(daemon_factory)
    reply = await post(port, body(42, "tools/list"), version="1900-01-01")
    assert reply.status_code == 400, reply.text
    error = reply.json()
    assert error["id"] == 42, error
    assert error["error"]["code"] == -32022
    assert error["error"]["data"]["requested"] == "1900-01-01"
    supported = error["error"]["data"]["supported"]
    assert supported[0] == MODERN and "2025-11-25" in supported, supported

    # In the body only (the header names a served version): the session's own -32022, 400.
    message = body(43, "tools/list")
    message["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "1900-01-01"
    reply = await post(port, message)
    assert reply.status_code == 400, reply.text
    assert reply.json()["id"] == 43 and reply.json()["error"]["code"] == -32022
    assert MODERN in reply.json()["error"]["data"]["supported"]
