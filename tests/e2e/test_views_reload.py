"""Issue 3 end to end: same-fingerprint refresh through reload and runtime replacement.

Real daemon, real `mcpool attach` bridges, the real SDK client, the stdlib fake upstream.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
import trio

from e2e.harness import DaemonProcess, fake_server, write_settings

WAIT = 15.0  # every wait below is bounded by this


class Recorder:
    """Counts list_changed notifications the SDK client receives."""

    def __init__(self) -> None:
        self.tools_changed = 0
        self.changed = trio.Event()

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.tools_changed += 1
            self.changed.set()


def tool_meta(tools: types.ListToolsResult, name: str) -> dict[str, Any]:
    for tool in tools.tools:
        if tool.name == name:
            return dict(tool.meta or {})
    raise AssertionError(f"{name} not listed: {[t.name for t in tools.tools]}")


async def call_pid(session: Any) -> int:
    result = await session.call_tool("fake__pid", {})
    return int(result.structured_content["pid"])


async def session_info(d: DaemonProcess, name: str) -> dict[str, Any]:
    for s in await d.ctl("sessions"):
        if s["name"] == name:
            return s
    raise AssertionError(f"no session named {name}")


async def test_metadata_only_change_reuses_transport_and_projects_meta(daemon_factory):
    d = await daemon_factory()
    entry = {**fake_server(), "excludeTools": ["crash"]}
    settings = write_settings(d.root / "s.json", {"fake": entry})
    rec = Recorder()
    async with d.attach([settings], "alpha", message_handler=rec) as session:
        pid_before = await call_pid(session)
        before = await session.list_tools()
        assert "fake__sleep" in [t.name for t in before.tools]
        assert "mcpool/trust" not in tool_meta(before, "fake__echo")
        info_before = await session_info(d, "alpha")

        write_settings(
            settings,
            {"fake": {**entry, "trust": True, "alwaysLoadTools": True,
                      "excludeTools": ["crash", "sleep"]}},
        )  # fmt: skip
        await d.ctl("reload")
        with trio.fail_after(WAIT):
            await rec.changed.wait()
        after = await session.list_tools()
        names = [t.name for t in after.tools]
        assert "fake__sleep" not in names
        meta = tool_meta(after, "fake__echo")
        assert meta["mcpool/server"] == "fake"
        assert meta["mcpool/trust"] is True
        assert meta["anthropic/alwaysLoad"] is True
        assert meta["mcpool/alwaysLoad"] is True
        # Transport reuse: the same upstream process serves the new view.
        assert await call_pid(session) == pid_before
        echoed = await session.call_tool("fake__echo", {"text": "after the change"})
        assert echoed.content[0].text == "after the change"
        info_after = await session_info(d, "alpha")
        assert info_after["handles"][0]["id"] == info_before["handles"][0]["id"]
        assert info_after["handles"][0]["policy"]["excludeTools"] == ["crash", "sleep"]
        assert info_after["generation"] > info_before["generation"]


async def test_canonically_equivalent_settings_cause_zero_churn(daemon_factory):
    d = await daemon_factory()
    entry = {**fake_server(), "excludeTools": ["crash", "sleep"], "includeTools": None}
    entry.pop("includeTools")
    settings = write_settings(d.root / "s.json", {"fake": entry})
    rec = Recorder()
    async with d.attach([settings], "beta", message_handler=rec) as session:
        pid_before = await call_pid(session)
        info_before = await session_info(d, "beta")
        # Reordered, duplicated excludeTools and an explicit alwaysLoadTools false: equivalent.
        write_settings(
            settings,
            {"fake": {**entry, "excludeTools": ["sleep", "crash", "sleep"],
                      "alwaysLoadTools": False}},
        )  # fmt: skip
        await d.ctl("reload")
        await session.send_ping()
        info_after = await session_info(d, "beta")
        assert info_after["generation"] == info_before["generation"]
        assert info_after["notifications_sent"] == info_before["notifications_sent"]
        assert await call_pid(session) == pid_before
        assert rec.tools_changed == 0


async def test_runtime_same_fingerprint_replacement_refreshes_the_handle(daemon_factory):
    d = await daemon_factory()
    entry = fake_server()
    settings = write_settings(d.root / "s.json", {"fake": entry})
    rec = Recorder()
    async with d.attach([settings], "gamma", message_handler=rec) as session:
        pid_before = await call_pid(session)
        info = await session_info(d, "gamma")
        result = await d.ctl(
            "session", "set-server", info["id"], "fake",
            json.dumps({**entry, "includeTools": ["echo", "pid(whatever)"]}),
        )  # fmt: skip
        assert result["action"] == "refresh"
        assert result["id"] == info["handles"][0]["id"]
        with trio.fail_after(WAIT):
            await rec.changed.wait()
        tools = await session.list_tools()
        assert sorted(t.name for t in tools.tools) == ["fake__echo", "fake__pid"]
        assert await call_pid(session) == pid_before


async def test_session_scoped_server_is_kept_when_its_identity_matches(daemon_factory):
    d = await daemon_factory()
    entry = {**fake_server(), "scope": "session"}
    settings = write_settings(d.root / "s.json", {"fake": entry})
    async with d.attach([settings], "delta") as session:
        pid_before = await call_pid(session)
        info_before = await session_info(d, "delta")
        assert "::unpooled-" in info_before["handles"][0]["id"]
        write_settings(settings, {"fake": {**entry, "trust": False}})
        await d.ctl("reload")
        info_after = await session_info(d, "delta")
        assert info_after["handles"][0]["id"] == info_before["handles"][0]["id"]
        assert await call_pid(session) == pid_before


async def test_pooling_off_reconnects_on_a_policy_change(daemon_factory):
    d = await daemon_factory(env={"MCPOOL_NO_POOL": "1"})
    entry = fake_server()
    settings = write_settings(d.root / "s.json", {"fake": entry})
    other = write_settings(d.root / "o.json", {"fake": entry})
    async with d.attach([settings], "eps") as session, d.attach([other], "zeta") as session2:
        pid_before = await call_pid(session)
        # Pooling off: even identical settings give each session its own upstream.
        assert await call_pid(session2) != pid_before
        write_settings(settings, {"fake": {**entry, "excludeTools": ["crash"]}})
        await d.ctl("reload")
        pid_after = await call_pid(session)
        assert pid_after != pid_before
        tools = await session.list_tools()
        assert "fake__crash" not in [t.name for t in tools.tools]
