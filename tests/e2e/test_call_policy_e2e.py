"""Issue 15.1 end to end: one upstream's bad tool name does not freeze a session's policy.

Real daemon, real `mcpool attach` bridge, the SDK client, two stdlib fake upstreams. One of them
publishes a tool named " y" at run time (`set_tools`), which rejects that server's part (S3); the
user's later settings changes still apply to every server, in the lists and at call time (S8).
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
import trio
from mcp import ClientSession

from e2e.harness import DaemonFactory, DaemonProcess, fake_server, write_settings
from e2e.support import STEP_TIMEOUT, call_text, text_of, tool_names, wait_until


class Inbox:
    """Counts the tools list_changed notifications the SDK client receives."""

    def __init__(self) -> None:
        self.changed = trio.Event()

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.changed.set()

    async def next_change(self) -> None:
        with trio.fail_after(STEP_TIMEOUT):
            await self.changed.wait()
        self.changed = trio.Event()


async def unknown(session: ClientSession, name: str) -> bool:
    with trio.fail_after(STEP_TIMEOUT):
        result = await session.call_tool(name, {})
    return bool(result.is_error) and text_of(result).startswith(f"Unknown tool: {name} ")


async def registry_errors(daemon: DaemonProcess) -> list[dict[str, Any]]:
    errors: list[dict[str, Any]] = (await daemon.ctl("status"))["registry_errors"]
    return errors


async def test_a_bad_tool_name_does_not_freeze_the_policy(daemon_factory: DaemonFactory) -> None:
    daemon = await daemon_factory(daemon={"logLevel": "debug"})
    servers: dict[str, Any] = {"good": fake_server(), "bad": fake_server()}
    settings = write_settings(daemon.root / "s.json", servers)
    inbox = Inbox()
    async with daemon.attach([settings], "alpha", message_handler=inbox) as session:
        assert {"good__echo", "bad__echo", "bad__pid"} <= set(await tool_names(session))
        await call_text(session, "bad__set_tools", {"names": [" y"]})
        with trio.fail_after(STEP_TIMEOUT):
            await wait_until(lambda: _has_error(daemon, "bad"))
        (row,) = await registry_errors(daemon)
        assert "' y' tool name has leading or trailing whitespace" in row["error"]
        assert row["server"] == "bad"

        # The user excludes a tool on each server: both apply, though bad's part is rejected.
        servers["good"] = {**fake_server(), "excludeTools": ["echo"]}
        servers["bad"] = {**fake_server(), "excludeTools": ["pid"]}
        write_settings(settings, servers)
        await daemon.ctl("reload")
        await inbox.next_change()
        names = await tool_names(session)
        assert "good__echo" not in names and "bad__pid" not in names
        assert {"good__pid", "bad__echo"} <= set(names)
        assert await unknown(session, "good__echo")
        assert await unknown(session, "bad__pid")
        assert await call_text(session, "bad__echo", {"text": "hi"}) == "hi"
        explained = await daemon.ctl("explain", "alpha", "good__echo")
        (match,) = [m for m in explained["matches"] if m["server"] == "good"]
        assert match["visible"] is False
        assert match["rule"] == "excluded by excludeTools"
        # Still reported: the bad name is still in bad's list.
        assert [r["server"] for r in await registry_errors(daemon)] == ["bad"]

        # Disabled: its calls stop, and its (stale) error goes with it.
        servers["bad"] = {**servers["bad"], "disabled": True}
        write_settings(settings, servers)
        await daemon.ctl("reload")
        await inbox.next_change()
        assert not any(n.startswith("bad__") for n in await tool_names(session))
        assert await unknown(session, "bad__echo")
        assert await call_text(session, "good__pid") != ""
        assert await registry_errors(daemon) == []
    # Generations at debug, the rejection at warning (issue 15.11).
    records = [json.loads(line) for line in (await daemon.ctl("logs", "-n", "1000"))["lines"]]
    published = [r["msg"] for r in records if "published" in r["msg"]]
    assert all(r["level"] == "debug" for r in records if "published" in r["msg"])
    assert any("published (settings)" in m and "changed: tools" in m for m in published)
    assert any(
        r["level"] == "warning" and "registry candidate rejected: server 'bad'" in r["msg"]
        for r in records
    )


async def _has_error(daemon: DaemonProcess, server: str) -> bool:
    return any(r.get("server") == server for r in await registry_errors(daemon))
