"""Issue 28 item 1: the first list is as complete as the client will ever see.

Codex and Qwen Code list tools once and never again on list_changed, so on a cold daemon (no
stored discovery) their first list waits for a server never seen up up to `listOnceBudget`
(8 s); clients that re-list keep the short `startupBudget`. A server not up within that budget
is remembered (across daemon runs) and not waited for again until it has been up.

Real processes: daemons, the fake upstream with a start-up delay, raw socket sessions that
name themselves as the real clients do in `clientInfo`.
"""

from __future__ import annotations

from typing import Any

import trio

from e2e.harness import DaemonFactory, DaemonProcess, RawSocketClient, fake_server, write_settings
from e2e.test_startup import attach_raw, next_notification, tool_names

SLOW_START = 3  # seconds: an npx-launched server on a first run
FIRST_LIST_BOUND = 15.0  # bounds a hang; the waits themselves are the daemon's


def init(client_name: str) -> dict[str, Any]:
    return {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": client_name, "version": "1"},
    }


async def first_list(client: RawSocketClient, d: DaemonProcess, client_name: str) -> set[str]:
    settings = write_settings(
        d.root / "s.json",
        {"slow": fake_server(FAKE_STARTUP_DELAY=SLOW_START, FAKE_TOOLS="late")},
    )
    await attach_raw(client, d, settings, client_name)
    with trio.fail_after(FIRST_LIST_BOUND):
        await client.request("initialize", init(client_name))
        await client.notify("notifications/initialized")
        return tool_names(await client.request("tools/list"))


async def test_a_list_once_client_waits_for_a_slow_server_and_a_re_listing_one_does_not(
    daemon_factory: DaemonFactory,
) -> None:
    options = {"startupBudget": 1.5, "listOnceBudget": 8}
    codex = await daemon_factory(daemon=options)
    claude = await daemon_factory(daemon=options)
    async with codex.raw() as a, claude.raw() as b:
        # Codex's clientInfo: its only list holds the server that took 3 s to start.
        assert "slow__late" in await first_list(a, codex, "codex-mcp-client")
        # Claude Code's: served after the startup budget without it; it arrives by
        # list_changed, which Claude Code follows.
        assert "slow__late" not in await first_list(b, claude, "claude-code")
        await next_notification(b, "notifications/tools/list_changed")
        assert "slow__late" in tool_names(await b.request("tools/list"))


async def test_a_listOnceClients_option_names_more_clients(daemon_factory: DaemonFactory) -> None:
    d = await daemon_factory(
        daemon={"startupBudget": 1.5, "listOnceBudget": 8, "listOnceClients": ["my-agent"]}
    )
    async with d.raw() as client:
        assert "slow__late" in await first_list(client, d, "My-Agent 2")


async def test_a_server_not_up_in_time_is_not_waited_for_on_the_next_run(
    daemon_factory: DaemonFactory,
) -> None:
    options = {"startupBudget": 0.5, "listOnceBudget": 2}
    hung = {"hung": fake_server(FAKE_STARTUP_DELAY=3600, FAKE_TOOLS="never")}
    first = await daemon_factory(daemon=options)
    settings = write_settings(first.root / "h.json", hung)
    async with first.raw() as client:
        await attach_raw(client, first, settings, "codex")
        with trio.fail_after(FIRST_LIST_BOUND):
            await client.request("initialize", init("codex-mcp-client"))
            assert tool_names(await client.request("tools/list")) == set()
    cache = first.env["XDG_CACHE_HOME"]
    await first.stop()
    log = first.log_path.read_text()
    assert "'hung' is still starting" in log, log

    # The next run, with the first one's cache: the server is not waited for, and it says so.
    second = await daemon_factory(daemon=options, env={"XDG_CACHE_HOME": cache})
    # (the same file: a server's working folder defaults to its settings file's, and is part
    # of what it is)
    async with second.raw() as client:
        await attach_raw(client, second, settings, "codex")
        with trio.fail_after(FIRST_LIST_BOUND):
            await client.request("initialize", init("codex-mcp-client"))
            assert tool_names(await client.request("tools/list")) == set()
    log = second.log_path.read_text()
    assert "'hung' is not waited for" in log, log
