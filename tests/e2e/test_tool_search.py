"""Issue 31 with real processes: mcpool's own tool search for clients that have none.

A daemon with its default `"toolSearch": "auto"`, the fake stdio upstream with 300 tools
(tool_0..tool_299, each answering its own name; tool_5 excluded by the settings), raw socket
sessions that say who they are by clientInfo: Codex (no search of its own, lists once) is served
mcpool's search and call tools; Claude Code (its own search) the whole list; gemini-cli (no
search, re-lists) gets what it found added to its list, with a list_changed.
"""

from __future__ import annotations

import json
from typing import Any

import trio

from e2e.harness import DaemonFactory, DaemonProcess, RawSocketClient, fake_server, write_settings
from e2e.test_notifications import next_notification

STEP = 20.0
SEARCH, CALL = "mcpool_search_tools", "mcpool_call_tool"


async def open_as(
    client: RawSocketClient,
    d: DaemonProcess,
    name: str,
    exclude: tuple[str, ...] = ("tool_5",),
    **attach: Any,
) -> tuple[str, dict[str, dict[str, Any]]]:
    """A session of client `name` on the 300-tool server (`exclude` excluded): its id and its
    tools/list."""
    entry = {**fake_server(FAKE_TOOL_COUNT=300), "excludeTools": list(exclude)}
    settings = write_settings(d.root / f"{name}.json", {"up": entry})
    reply = await client.request(
        "mcpool/attach",
        {"sources": [str(settings)], "cwd": str(d.root), "name": name, **attach},
    )
    sid = str(reply["result"]["session"])
    await client.request(
        "initialize",
        {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": name, "version": "1"},
        },
    )
    await client.notify("notifications/initialized")
    listed = await client.request("tools/list", {})
    return sid, {t["name"]: t for t in listed["result"]["tools"]}


async def call(client: RawSocketClient, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    reply = await client.request("tools/call", {"name": name, "arguments": arguments})
    result: dict[str, Any] = reply["result"]
    return result


def found(result: dict[str, Any]) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = json.loads(result["content"][0]["text"])["tools"]
    return tools


async def test_codex_is_served_the_search_and_finds_and_calls_through_it(
    daemon_factory: DaemonFactory,
) -> None:
    d = await daemon_factory()
    async with d.raw() as client:
        with trio.fail_after(STEP):
            sid, tools = await open_as(client, d, "codex-mcp-client")
            hits = found(await call(client, SEARCH, {"query": "return tool 217"}))
            answered = await call(client, CALL, {"name": "up__tool_217", "arguments": {}})
            fives = found(await call(client, SEARCH, {"query": "tool 5", "limit": 20}))
            excluded = await call(client, CALL, {"name": "up__tool_5", "arguments": {}})
            sessions = await d.ctl("sessions")
    assert len(tools) <= 12 and {SEARCH, CALL} <= set(tools), sorted(tools)
    # The count is the session's whole view: 299 counted tools (tool_5 is excluded) and the
    # fake's 9 builtins.
    assert "among the 308 this session can call" in tools[SEARCH]["description"]
    assert hits[0]["name"] == "up__tool_217"
    assert hits[0]["inputSchema"]["type"] == "object"
    assert answered["content"][0]["text"] == "tool_217" and not answered.get("isError")
    # What the session may not see is neither found nor callable.
    assert "up__tool_5" not in {t["name"] for t in fives} and fives
    assert excluded["isError"] is True
    (row,) = [s for s in sessions if s["id"] == sid]
    assert row["tool_search"]["on"] is True and row["tool_search"]["mode"] == "auto"
    assert row["tool_search"]["spared_bytes"] > 10_000


async def test_a_client_with_its_own_search_or_told_off_is_served_the_whole_list(
    daemon_factory: DaemonFactory,
) -> None:
    d = await daemon_factory()
    async with d.raw() as claude, d.raw() as codex:
        with trio.fail_after(STEP):
            _, claude_tools = await open_as(claude, d, "claude-code", exclude=())
            _, codex_tools = await open_as(codex, d, "codex-mcp-client", toolSearch="off")
    assert SEARCH not in claude_tools and SEARCH not in codex_tools
    assert sum(1 for n in claude_tools if n.startswith("up__tool_")) == 300
    assert sum(1 for n in codex_tools if n.startswith("up__tool_")) == 299  # tool_5 excluded


async def test_a_relisting_client_gets_what_it_found_added_to_its_list(
    daemon_factory: DaemonFactory,
) -> None:
    d = await daemon_factory()
    async with d.raw() as client:
        with trio.fail_after(STEP):
            _, tools = await open_as(client, d, "gemini-cli-mcp-client")
            assert SEARCH in tools and "up__tool_42" not in tools
            hits = found(await call(client, SEARCH, {"query": "tool 42", "limit": 1}))
            await next_notification(client, "notifications/tools/list_changed")
            listed = await client.request("tools/list", {})
    names = {t["name"] for t in listed["result"]["tools"]}
    assert hits[0]["name"] == "up__tool_42"
    assert {"up__tool_42", SEARCH, CALL} <= names and len(names) <= 12
