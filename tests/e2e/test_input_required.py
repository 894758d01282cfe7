"""A handshake-era session keeps elicitation on an upstream mcpool speaks 2026-07-28 to
(issue 15, point 4): the tests' own HTTP upstream speaks both eras, and its `protocolVersion`
setting pins the modern one (unpinned, a handshake-era session would get a connection of its own
era: issue 29 item 1); mcpool declares what the session can be asked for, and turns the
upstream's input_required answer into the elicitation/create request the session's client
answers, then retries the call with the answer (inputResponses, requestState)."""

from __future__ import annotations

import sys
from typing import Any

import mcp_types as types
import pytest
import trio
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from wire import WireServer

from e2e.harness import DaemonFactory, attach_args

CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
# The upstream as these tests configure it: spoken to at 2026-07-28 whatever a session speaks.
MODERN_PINNED = {"type": "http", "protocolVersion": "2026-07-28"}
WAIT = 20.0  # a cold daemon, the bridge, the era probe and discovery on a loaded machine


async def test_a_handshake_session_answers_a_modern_upstreams_elicitation(
    daemon_factory: DaemonFactory, nursery: trio.Nursery
) -> None:
    server = WireServer(modern=True)
    await server.serve(nursery)
    d = await daemon_factory()
    settings = d.settings_file("s.json", {"both": MODERN_PINNED | {"url": server.url}})
    asked: list[str] = []

    async def elicitation(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"name": "Ada"})

    params = StdioServerParameters(
        command=sys.executable,
        args=attach_args(d.sock, [settings], "old"),
        env=d.attach_env(),
        cwd=d.root,
    )
    with trio.fail_after(WAIT):
        async with (
            stdio_client(params) as (read, write),
            ClientSession(read, write, elicitation_callback=elicitation) as session,
        ):
            init = await session.initialize()
            assert init.protocol_version == "2025-11-25"  # a handshake-era session
            result = await session.call_tool("both__say", {})
    assert asked == ["your name?"]
    assert [c.text for c in result.content if isinstance(c, types.TextContent)] == ["Ada (state-1)"]
    assert not result.is_error
    servers = await d.ctl("servers")
    assert servers[0]["era"] == "modern"
    declared = server.envelopes[0][CLIENT_CAPABILITIES]
    assert "elicitation" in declared, server.envelopes


async def test_input_a_handshake_session_cannot_give_is_refused_with_the_reason(
    daemon_factory: DaemonFactory, nursery: trio.Nursery
) -> None:
    server = WireServer(modern=True)
    await server.serve(nursery)
    d = await daemon_factory()
    settings = d.settings_file("s.json", {"both": MODERN_PINNED | {"url": server.url}})
    params = StdioServerParameters(
        command=sys.executable,
        args=attach_args(d.sock, [settings], "plain"),
        env=d.attach_env(),
        cwd=d.root,
    )
    with trio.fail_after(WAIT):
        async with (
            stdio_client(params) as (read, write),
            ClientSession(read, write) as session,  # no elicitation capability
        ):
            await session.initialize()
            with pytest.raises(MCPError) as caught:
                await session.call_tool("both__say", {})
    assert "no elicitation capability" in str(caught.value.error.data), caught.value.error
    assert CLIENT_CAPABILITIES in server.envelopes[0]
    assert "elicitation" not in server.envelopes[0][CLIENT_CAPABILITIES]
