"""Issue 18, item 1: `mcpool daemon --http` at 2026-07-28 answers as the revision's
streamable-http page says: JSON-RPC errors carry 400 or 404 (not 200), the methods the revision
removed (`initialize`, `ping`, `logging/setLevel`) are unknown methods there, and an unsupported
MCP-Protocol-Version is -32022 with the request's id and the versions served.

Real HTTP requests (httpx2) against a real daemon with a stdio upstream behind it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from e2e.harness import DaemonFactory
from e2e.support import STEP_TIMEOUT
from e2e.test_http_fence import free_port, http_daemon

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

    removed = ("initialize", "ping", "logging/setLevel", "resources/subscribe", "no/such")
    for msg_id, method in enumerate(removed, 1):
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

    # A missing Mcp-Method, or a missing Mcp-Name when the body names a tool: 400 too.
    async with httpx2.AsyncClient(timeout=STEP_TIMEOUT) as client:
        reply = await client.post(
            f"http://127.0.0.1:{port}/mcp",
            content=json.dumps(body(10, "tools/list")),
            headers={
                "content-type": "application/json",
                "accept": "application/json, text/event-stream",
                "mcp-protocol-version": MODERN,
            },
        )
    assert reply.status_code == 400 and reply.json()["error"]["code"] == -32020, reply.text
    reply = await post(port, body(11, "tools/call", {"name": "fake__echo", "arguments": {}}))
    assert reply.status_code == 400 and reply.json()["error"]["code"] == -32020, reply.text
    named = body(12, "tools/call", {"name": "fake__echo", "arguments": {"text": "hi"}})
    reply = await post(port, named, **{"mcp-name": "fake__echo"})
    assert reply.status_code == 200, reply.text
    assert [m["id"] for m in sse_messages(reply.text) if "id" in m] == [12]

    # The body's protocol version differs from the header's: HeaderMismatch, not -32022.
    other = body(13, "tools/list")
    other["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "v999.0.0"
    reply = await post(port, other)
    assert reply.status_code == 400 and reply.json()["error"]["code"] == -32020, reply.text
    assert reply.json()["id"] == 13

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
    message = body(42, "tools/list")
    message["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "1900-01-01"
    reply = await post(port, message, version="1900-01-01")
    assert reply.status_code == 400, reply.text
    error = reply.json()
    assert error["id"] == 42, error
    assert error["error"]["code"] == -32022
    assert error["error"]["data"]["requested"] == "1900-01-01"
    supported = error["error"]["data"]["supported"]
    assert supported == [MODERN], supported  # what server/discover lists

    # Both header and body name it (the suite's probe): the same answer.
    message = body(43, "server/discover")
    message["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "v999.0.0"
    reply = await post(port, message, version="v999.0.0")
    assert reply.status_code == 400, reply.text
    assert reply.json()["id"] == 43 and reply.json()["error"]["code"] == -32022
    assert reply.json()["error"]["data"] == {"supported": [MODERN], "requested": "v999.0.0"}


async def test_a_retry_whose_input_responses_is_not_an_object_is_invalid_params(
    daemon_factory: DaemonFactory,
) -> None:
    _daemon, port = await http_daemon(daemon_factory)
    for msg_id, bad in enumerate((7, None, ["x"], {"user_name": 12345}), 1):
        params = {"name": "fake__echo", "arguments": {"text": "x"}, "inputResponses": bad}
        reply = await post(port, body(msg_id, "tools/call", params), **{"mcp-name": "fake__echo"})
        assert reply.status_code == 400, reply.text
        assert reply.json()["id"] == msg_id and reply.json()["error"]["code"] == -32602


async def test_param_headers_are_checked_against_the_tool_they_mirror(
    daemon_factory: DaemonFactory,
) -> None:
    """streamable-http, "Server Behavior for Custom Headers": mcpool processes the body, so it
    checks each Mcp-Param-* header of a tools/call against the argument the tool's x-mcp-header
    names: missing, mismatched or undecodable is -32020 with HTTP 400; agreeing is served."""
    server = str(Path(__file__).parents[2] / "tools" / "conformance_server.py")
    upstream = {"command": sys.executable, "args": [server, "stdio"], "prefix": False}
    daemon = await daemon_factory({"conformance": upstream}, start=False)
    port = free_port()
    argv = daemon.argv()
    daemon.argv = lambda: [*argv, "--http", f"127.0.0.1:{port}"]  # type: ignore[method-assign]
    await daemon.start()
    call = {"name": "test_header_echo", "arguments": {"region": "us-west1"}}
    named = {"mcp-name": "test_header_echo"}

    async def answer(msg_id: int, args: dict[str, Any], **headers: str) -> httpx2.Response:
        with trio.fail_after(STEP_TIMEOUT):
            while True:  # the endpoint listens once the daemon is up
                try:
                    message = body(msg_id, "tools/call", {**call, "arguments": args})
                    return await post(port, message, **named, **headers)
                except httpx2.ConnectError:
                    await trio.sleep(0.05)

    reply = await answer(1, call["arguments"], **{"mcp-param-region": "us-west1"})
    assert reply.status_code == 200, reply.text
    [result] = [m for m in sse_messages(reply.text) if m.get("id") == 1]
    assert result["result"]["content"][0]["text"] == "region=us-west1", result
    reply = await answer(2, call["arguments"], **{"mcp-param-region": "=?base64?dXMtd2VzdDE=?="})
    assert reply.status_code == 200, reply.text
    for msg_id, headers in (
        (3, {}),  # the value is in the body, its header is not sent
        (4, {"mcp-param-region": "eu-north1"}),
        (5, {"mcp-param-region": "=?base64?dXMtd2VzdDE?="}),  # no padding: not valid Base64
    ):
        reply = await answer(msg_id, call["arguments"], **headers)
        assert reply.status_code == 400, (headers, reply.text)
        error = reply.json()
        assert error["id"] == msg_id and error["error"]["code"] == -32020, error
    reply = await answer(6, {}, **{"mcp-param-region": "us-west1"})  # header without a value
    assert reply.status_code == 400 and reply.json()["error"]["code"] == -32020, reply.text
