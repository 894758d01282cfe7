"""Issue 28 item 5: a client is told, in words it shows, that a server waits for the user's login.

Real processes: a daemon, an SDK client through `mcpool attach`, and the accounts server of
tests/e2e/oauth_server.py, which answers 401 until someone logs in. Nobody logs in here: the
entry waits in needs-login, and the session's client hears so by a warning log message naming
the server and the command, both when the entry gets there during the session and when it was
there before the session's handshake; a call of the server's tools says the same.
"""

from __future__ import annotations

from typing import Any

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
