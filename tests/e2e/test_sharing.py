"""Sharing (I1, L1, policy keys, P2): sessions attached through the real `mcpool attach` with the
real SDK client share one upstream per transport identity, see their own projection of it, and
get their own results back when they call it concurrently."""

from __future__ import annotations

import sys
from typing import Any

import mcp_types as types
import trio

from .harness import FAKE_UPSTREAM, DaemonFactory, fake_server
from .support import STEP_TIMEOUT, call_text, servers_of, text_of


async def test_two_sessions_with_the_same_settings_share_one_upstream(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    settings = daemon.settings_file("settings.json", {"fake": fake_server()})
    async with daemon.attach([settings], "one") as one, daemon.attach([settings], "two") as two:
        pid_one = await call_text(one, "fake__pid")
        pid_two = await call_text(two, "fake__pid")
        servers = await servers_of(daemon)
        sessions = await daemon.ctl("sessions")
    assert pid_one == pid_two
    assert len(servers) == 1, servers
    (entry,) = servers
    assert entry["name"] == "fake"
    assert entry["pid"] == int(pid_one)
    assert len(sessions) == 2, sessions
    assert sorted(entry["refs"]) == sorted(s["id"] for s in sessions)


def _tools_by_name(result: types.ListToolsResult) -> dict[str, types.Tool]:
    return {tool.name: tool for tool in result.tools}


def _meta(tool: types.Tool) -> dict[str, Any]:
    return dict(tool.meta or {})


async def test_policy_only_differences_share_one_process_with_different_tool_lists(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    base = fake_server(FAKE_TOOLS="alpha,beta")
    plain = daemon.settings_file("plain.json", {"fake": base})
    included = daemon.settings_file(
        "included.json",
        {"fake": {**base, "includeTools": ["pid", "alpha(args)"], "trust": True}},
    )
    excluded = daemon.settings_file(
        "excluded.json",
        {"fake": {**base, "excludeTools": ["alpha", "echo"], "alwaysLoadTools": True}},
    )
    untrusted = daemon.settings_file(
        "untrusted.json", {"fake": {**base, "trust": False, "alwaysLoadTools": False}}
    )
    async with (
        daemon.attach([plain], "plain") as s_plain,
        daemon.attach([included], "included") as s_included,
        daemon.attach([excluded], "excluded") as s_excluded,
        daemon.attach([untrusted], "untrusted") as s_untrusted,
    ):
        pids = {await call_text(s, "fake__pid") for s in (s_plain, s_included, s_excluded)}
        with trio.fail_after(STEP_TIMEOUT):
            lists = [
                _tools_by_name(await s.list_tools())
                for s in (s_plain, s_included, s_excluded, s_untrusted)
            ]
        servers = await servers_of(daemon)

    assert len(pids) == 1, pids
    assert len(servers) == 1, servers
    assert len(servers[0]["refs"]) == 4
    plain_tools, included_tools, excluded_tools, untrusted_tools = lists

    everything = {
        f"fake__{n}"
        for n in ("pid", "echo", "env", "sleep", "progress", "crash", "set_tools", "log", "fail")
    } | {"fake__alpha", "fake__beta"}
    assert set(plain_tools) == everything
    assert set(included_tools) == {"fake__pid", "fake__alpha"}
    assert set(excluded_tools) == everything - {"fake__alpha", "fake__echo"}
    assert set(untrusted_tools) == everything

    # _meta projection: server always; trust only when set (false stays distinct from missing);
    # both alwaysLoad keys only when alwaysLoadTools is true.
    for tool in plain_tools.values():
        assert _meta(tool) == {"mcpool/server": "fake"}, tool
    for tool in included_tools.values():
        assert _meta(tool) == {"mcpool/server": "fake", "mcpool/trust": True}, tool
    for tool in excluded_tools.values():
        assert _meta(tool) == {
            "mcpool/server": "fake",
            "anthropic/alwaysLoad": True,
            "mcpool/alwaysLoad": True,
        }, tool
    for tool in untrusted_tools.values():
        assert _meta(tool) == {"mcpool/server": "fake", "mcpool/trust": False}, tool


async def test_env_or_args_differences_get_separate_processes(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    base = fake_server(FAKE_MARK="a")
    other_env = fake_server(FAKE_MARK="b")
    other_args = {**base, "args": [str(FAKE_UPSTREAM), "--unused-flag"]}
    assert base["command"] == sys.executable
    files = [
        daemon.settings_file(f"{label}.json", {"fake": entry})
        for label, entry in (("base", base), ("env", other_env), ("args", other_args))
    ]
    async with (
        daemon.attach([files[0]], "base") as s_base,
        daemon.attach([files[1]], "env") as s_env,
        daemon.attach([files[2]], "args") as s_args,
    ):
        pids = [await call_text(s, "fake__pid") for s in (s_base, s_env, s_args)]
        marks = [
            await call_text(s, "fake__env", {"name": "FAKE_MARK"}) for s in (s_base, s_env, s_args)
        ]
        servers = await servers_of(daemon)
    assert len(set(pids)) == 3, pids
    assert marks == ["a", "b", "a"]
    assert len(servers) == 3, servers
    assert {s["pid"] for s in servers} == {int(pid) for pid in pids}
    assert len({s["fingerprint"] for s in servers}) == 3
    assert all(len(s["refs"]) == 1 for s in servers), servers


CALLS_PER_SESSION = 50
SESSIONS = 4


async def test_200_concurrent_calls_from_4_sessions_each_get_their_own_result(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    settings = daemon.settings_file("settings.json", {"fake": fake_server()})
    results: dict[str, str] = {}

    async def call(session: Any, text: str) -> None:
        result = await session.call_tool("fake__echo", {"text": text})
        assert not result.is_error, result
        results[text] = text_of(result)

    async with (
        daemon.attach([settings], "c0") as s0,
        daemon.attach([settings], "c1") as s1,
        daemon.attach([settings], "c2") as s2,
        daemon.attach([settings], "c3") as s3,
    ):
        sessions = (s0, s1, s2, s3)
        with trio.fail_after(STEP_TIMEOUT * 3):
            async with trio.open_nursery() as nursery:
                for n in range(CALLS_PER_SESSION):
                    for i, session in enumerate(sessions):
                        nursery.start_soon(call, session, f"session {i} call {n}")
        servers = await servers_of(daemon)
    assert len(results) == SESSIONS * CALLS_PER_SESSION
    assert all(text == echoed for text, echoed in results.items())
    assert len(servers) == 1, servers
