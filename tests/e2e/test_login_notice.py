"""Issue 28 item 5: a client is told, in words it shows, that a server waits for the user's login.

Real processes: a daemon, an SDK client through `mcpool attach`, and the accounts server of
tests/e2e/oauth_server.py, which answers 401 until someone logs in. Nobody logs in here: the
entry waits in needs-login, and the session's client hears so by a warning log message naming
the server and the command, both when the entry gets there during the session and when it was
there before the session's handshake; a call of the server's tools says the same. A client that
declared URL-mode elicitation is asked to open the login's page instead, and the login completes
through it.
"""

from __future__ import annotations

import urllib.request
from typing import Any
from urllib.parse import urlsplit

import trio
from mcp import types

from .harness import DaemonFactory
from .test_oauth_callback import NAME, STEP_TIMEOUT, _daemon, accounts_server

ADVICE = f"run `daemonctl login {NAME}`"


async def test_a_server_waiting_for_login_is_told_to_the_client(
    daemon_factory: DaemonFactory,
) -> None:
    async with accounts_server() as origin:
        daemon = await _daemon(daemon_factory, origin)
        settings = daemon.settings_file(
            "session.json", {NAME: {"type": "http", "url": f"{origin}/mcp"}}
        )
        for round_ in ("during", "before"):
            heard: list[Any] = []
            told = trio.Event()

            async def on_log(params: types.LoggingMessageNotificationParams) -> None:
                heard.append(params)  # noqa: B023 (each round's list, awaited in that round)
                if ADVICE in str(params.data):
                    told.set()  # noqa: B023

            async with daemon.attach([settings], f"editor-{round_}", logging_callback=on_log):
                with trio.fail_after(STEP_TIMEOUT):
                    await told.wait()
                states = {s["name"]: s["state"] for s in await daemon.ctl("servers")}
            assert states[NAME] == "needs-login", states
            (notice,) = [p for p in heard if ADVICE in str(p.data)]
            assert notice.level == "warning"
            assert f"server '{NAME}' needs you to log in" in str(notice.data)


async def test_a_call_of_a_server_waiting_for_login_names_the_command(
    daemon_factory: DaemonFactory,
) -> None:
    async with accounts_server() as origin:
        daemon = await _daemon(daemon_factory, origin)
        settings = daemon.settings_file(
            "session.json", {NAME: {"type": "http", "url": f"{origin}/mcp"}}
        )
        async with daemon.attach([settings], "editor") as session:
            with trio.fail_after(STEP_TIMEOUT):
                while {s["name"]: s["state"] for s in await daemon.ctl("servers")}.get(
                    NAME
                ) != "needs-login":
                    await trio.sleep(0.1)
                result = await session.call_tool(f"{NAME}__whoami", {})
    assert result.is_error
    text = result.content[0]
    assert text.type == "text"
    assert ADVICE in text.text, text.text


async def _browse(url: str, account: str) -> int:
    """What the user's browser does with the page the client was asked to open: fetch it as
    `account`, following the redirects (to the authorization server and back to the daemon's
    listener); the final status."""

    def fetch() -> int:
        request = urllib.request.Request(url, headers={"X-Account": account})
        with urllib.request.urlopen(request, timeout=STEP_TIMEOUT) as answer:
            status: int = answer.status
            return status

    return await trio.to_thread.run_sync(fetch)


async def test_a_client_that_takes_url_elicitation_logs_in_without_a_terminal(
    daemon_factory: DaemonFactory,
) -> None:
    """The client declared URL-mode elicitation (the SDK's client does, as Claude Code, Codex
    and Copilot CLI do): it is asked to open the login's start page, the user's browser logs
    in there, the session hears the elicitation complete and the server's tool then answers
    with the user's account. No `daemonctl login` runs."""
    asked: list[Any] = []
    complete = trio.Event()

    async def on_elicit(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params)
        return types.ElicitResult(action="accept")

    async def on_message(message: Any) -> None:
        root = getattr(message, "root", message)
        if getattr(root, "method", None) == "notifications/elicitation/complete":
            complete.set()

    async with accounts_server() as origin:
        daemon = await _daemon(daemon_factory, origin)
        settings = daemon.settings_file(
            "session.json", {NAME: {"type": "http", "url": f"{origin}/mcp"}}
        )
        async with daemon.attach(
            [settings], "editor", elicitation_callback=on_elicit, message_handler=on_message
        ) as session:
            with trio.fail_after(STEP_TIMEOUT):
                while not asked:
                    await trio.sleep(0.05)
            (params,) = asked
            assert params.mode == "url"
            assert f"Server '{NAME}' needs you to log in" in params.message
            page = urlsplit(params.url)
            # The daemon's loopback start page, never the authorization URL with its state.
            assert page.hostname == "127.0.0.1" and not page.query, params.url
            assert await _browse(params.url, "owner") == 200
            with trio.fail_after(STEP_TIMEOUT):
                await complete.wait()
                while True:
                    tools = [t.name for t in (await session.list_tools()).tools]
                    if f"{NAME}__whoami" in tools:
                        break
                    await trio.sleep(0.1)
                result = await session.call_tool(f"{NAME}__whoami", {})
    text = result.content[0]
    assert text.type == "text"
    assert text.text == "account=owner"
