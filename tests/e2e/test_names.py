"""Exposed names fit the client that reads them (issue 13, points 3 and 4): a per-session length
budget from the client's `clientInfo.name`, the daemon's `maxNameLength` or `mcpool attach
--max-name-length`, and `daemonctl explain` taking the names users see in their clients."""

from __future__ import annotations

import trio

from .harness import DaemonFactory, fake_server
from .support import STEP_TIMEOUT, call_text, raw_attach, raw_call, raw_text, tool_names

# 55 characters: `<server>__echo` fits 64, but not 64 after Claude Code's `mcp__mcpool__`.
LONG_SERVER = "atlassian-confluence-enterprise-workspace-production-eu"


async def _names(client: object) -> list[str]:
    listed = await client.request("tools/list")  # type: ignore[attr-defined]
    return [tool["name"] for tool in listed["result"]["tools"]]


async def test_each_client_gets_names_that_fit_after_its_own_prefix(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    settings = str(daemon.settings_file("settings.json", {LONG_SERVER: fake_server()}))
    with trio.fail_after(STEP_TIMEOUT * 4):
        async with daemon.raw() as claude, daemon.raw() as other, daemon.raw() as gemini:
            claude_id = await raw_attach(claude, [settings], "claude-code")
            await raw_attach(other, [settings], "some-editor")
            await raw_attach(gemini, [settings], "gemini-cli-mcp-client")
            claude_names = await _names(claude)
            other_names = await _names(other)
            gemini_names = await _names(gemini)
            # An unknown client gets the names as they are (they fit 64)...
            assert f"{LONG_SERVER}__echo" in other_names
            # ...Claude Code's fit 64 after `mcp__mcpool__`, gemini-cli's 63 after `mcp_mcpool_`,
            # each keeping the tool's own name whole, and they still route.
            assert all(len("mcp__mcpool__" + n) <= 64 for n in claude_names), claude_names
            assert all(len("mcp_mcpool_" + n) <= 63 for n in gemini_names), gemini_names
            (echo,) = [n for n in claude_names if n.endswith("__echo")]
            answer = await raw_call(claude, echo, {"text": "fits"})
            assert "fits" in raw_text(answer)
            # explain takes the name as the user saw it in Claude Code.
            explained = await daemon.ctl("explain", claude_id, f"mcp__mcpool__{echo}")
            assert [m["exposed"] for m in explained["matches"]] == [echo]
            assert explained["matches"][0]["visible"] is True


async def test_the_daemon_option_sets_every_sessions_budget(daemon_factory: DaemonFactory) -> None:
    daemon = await daemon_factory(daemon={"maxNameLength": 30})
    settings = str(daemon.settings_file("settings.json", {LONG_SERVER: fake_server()}))
    with trio.fail_after(STEP_TIMEOUT * 2):
        async with daemon.raw() as client:
            await raw_attach(client, [settings], "claude-code")
            names = await _names(client)
    assert names and all(len(n) <= 30 for n in names), names
    assert len(set(names)) == len(names)


async def test_attach_max_name_length_wins_over_the_client(daemon_factory: DaemonFactory) -> None:
    daemon = await daemon_factory(daemon={"maxNameLength": 60})
    settings = daemon.settings_file("settings.json", {LONG_SERVER: fake_server()})
    flag = ("--max-name-length", "24")
    async with daemon.attach([settings], "budgeted", extra_args=flag) as session:
        names = await tool_names(session)
        echo = next(n for n in names if n.endswith("__echo"))
        answer = await call_text(session, echo, {"text": "ok"})
    assert names and all(len(n) <= 24 for n in names), names
    assert "ok" in answer
