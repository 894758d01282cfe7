"""The upstream environment and settings variables (issue 12 items 4, 5, 13; issue 13 point 1),
with real processes: the daemon (started directly or autostarted by a bridge), real `mcpool
attach` bridges with differing environments, and tools/fake_upstream.py reporting what it sees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import trio
from mcp import ClientSession

from mcpool.pool._environ import SPAWN_MARKER, UPSTREAM_MARKER, base_environment

from .harness import (
    DaemonFactory,
    DaemonProcess,
    attached_session,
    fake_server,
    run_daemonctl,
)
from .support import (
    PROTOCOL_VERSION,
    STEP_TIMEOUT,
    call_text,
    raw_call,
    raw_text,
    servers_of,
    tool_names,
    wait_until,
)

SECRET = "s3cr3t-only-for-client-a"


async def upstream_environ(session: ClientSession, tool: str = "fake__env") -> dict[str, str]:
    environ = json.loads(await call_text(session, tool, {"name": "*"}))
    assert isinstance(environ, dict)
    return environ


def client_env(daemon: DaemonProcess, **extra: str) -> dict[str, str]:
    """A client's environment: what mcpool reads plus variables of its own."""
    return {**daemon.attach_env(), **extra}


def assert_is_the_base(environ: dict[str, str], daemon_pid: int) -> None:
    """The documented base: the daemon's allowlisted variables plus the markers, nothing else."""
    daemon_env = psutil.Process(daemon_pid).environ()
    assert environ.pop(UPSTREAM_MARKER) == str(daemon_pid)
    owner, _, serial = environ.pop(SPAWN_MARKER).partition(".")
    assert owner == str(daemon_pid) and serial.isdigit()
    assert environ == base_environment(daemon_env)


async def test_an_autostarted_daemon_gives_shared_upstreams_neither_clients_variables(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory(start=False)
    settings = daemon.settings_file("settings.json", {"fake": fake_server()})
    env_a = client_env(daemon, SECRET_TOKEN=SECRET, AWS_PROFILE="prod-a")
    env_b = client_env(daemon, OTHER_SECRET="b-secret", AWS_PROFILE="prod-b")
    # Client a's bridge finds no daemon and starts one, with client a's whole environment.
    async with (
        attached_session(daemon.sock, [settings], "a", env=env_a, cwd=daemon.root) as a,
        attached_session(daemon.sock, [settings], "b", env=env_b, cwd=daemon.root) as b,
    ):
        seen_a = await upstream_environ(a)
        seen_b = await upstream_environ(b)
        status = await daemon.ctl("status")
        servers = await servers_of(daemon)
    assert len(servers) == 1, servers  # one shared process
    assert seen_a == seen_b
    daemon_env = psutil.Process(status["pid"]).environ()
    assert daemon_env.get("SECRET_TOKEN") == SECRET  # the daemon did inherit client a's
    for name in ("SECRET_TOKEN", "OTHER_SECRET", "AWS_PROFILE"):
        assert name not in seen_a, name
    assert SECRET not in json.dumps(seen_a)
    assert_is_the_base(seen_a, status["pid"])
    await run_daemonctl(daemon.sock, "stop", env=daemon.env)


async def test_a_daemon_run_directly_passes_only_the_base_too(
    daemon_factory: DaemonFactory,
) -> None:
    # As under systemd or from a login shell: the daemon's own environment holds extras.
    daemon = await daemon_factory(
        {"fake": fake_server(FAKE_SPAWN_LOG="/dev/null")},
        env={"SECRET_TOKEN": SECRET, "AWS_PROFILE": "ops", "LC_TIME": "C", "TZ": "UTC"},
    )
    async with daemon.attach([daemon.config_path], "one") as one:
        seen = await upstream_environ(one)
    assert "SECRET_TOKEN" not in seen and "AWS_PROFILE" not in seen
    assert (seen["LC_TIME"], seen["TZ"], seen["FAKE_SPAWN_LOG"]) == ("C", "UTC", "/dev/null")
    seen.pop("FAKE_SPAWN_LOG")  # the entry's own env comes on top of the base
    assert_is_the_base(seen, daemon.pid)


async def test_variables_expand_from_each_sessions_environment_into_the_identity(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    entry = fake_server()
    entry["env"] = {"PROFILE_SEEN": "${AWS_PROFILE}", "REGION_SEEN": "${REGION:-eu-west-1}"}
    entry["args"] = [*entry["args"], "--profile=${AWS_PROFILE}"]
    settings = daemon.settings_file(".mcp.json", {"fake": entry})
    env_a = client_env(daemon, AWS_PROFILE="alpha")
    env_b = client_env(daemon, AWS_PROFILE="beta", REGION="us-east-2")
    async with (
        daemon.attach([settings], "a1", env=env_a) as a1,
        daemon.attach([settings], "b", env=env_b) as b,
        daemon.attach([settings], "a2", env=dict(env_a)) as a2,
    ):
        pids = [await call_text(s, "fake__pid") for s in (a1, b, a2)]
        seen = [await upstream_environ(s) for s in (a1, b)]
        servers = await servers_of(daemon)
    assert pids[0] == pids[2] != pids[1]  # same values share, different ones never do
    assert len(servers) == 2, servers
    assert (seen[0]["PROFILE_SEEN"], seen[0]["REGION_SEEN"]) == ("alpha", "eu-west-1")
    assert (seen[1]["PROFILE_SEEN"], seen[1]["REGION_SEEN"]) == ("beta", "us-east-2")
    args = sorted(s["transport_detail"]["args"][-1] for s in servers)
    assert args == ["--profile=alpha", "--profile=beta"]
    # The variable itself reached the upstream only through the entry's env.
    assert "AWS_PROFILE" not in seen[0] and "REGION" not in seen[1]


async def test_an_unset_variable_skips_that_server_with_an_error_naming_everything(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    needs = {**fake_server(), "env": {"API_KEY": "${MCPOOL_TEST_NEVER_SET}"}}
    settings = daemon.settings_file(".mcp.json", {"needs": needs, "fine": fake_server()})
    env = client_env(daemon)
    async with daemon.attach([settings], "one", env=env) as one:
        names = await tool_names(one)
        status = await daemon.ctl("status")
        servers = await servers_of(daemon)
        table = (await run_daemonctl(daemon.sock, "status", env=daemon.env)).stdout.decode()
    assert "fine__pid" in names and not any(n.startswith("needs__") for n in names)
    (skipped,) = status["skipped"]
    assert (skipped["server"], skipped["file"]) == ("needs", str(settings))
    for part in ("${MCPOOL_TEST_NEVER_SET}", "env.API_KEY", str(settings), "'needs'"):
        assert part in skipped["error"], (part, skipped)
    refused = [s for s in servers if s["state"] == "refused"]
    assert [s["name"] for s in refused] == ["needs"]
    assert "SKIPPED SERVER" in table and "needs" in table
    log = daemon.log_path.read_text()
    assert "server 'needs' skipped" in log and "MCPOOL_TEST_NEVER_SET" in log


async def test_a_header_value_with_a_newline_is_refused_and_never_printed(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    secret = "Bearer s3cr3t-header-value\n"
    remote = {"httpUrl": "http://127.0.0.1:9/mcp", "headers": {"Authorization": secret}}
    settings = daemon.settings_file(".mcp.json", {"remote": remote, "fine": fake_server()})
    async with daemon.attach([settings], "one", env=client_env(daemon)) as one:
        await call_text(one, "fine__pid")
        outputs = [
            (await run_daemonctl(daemon.sock, *args, env=daemon.env)).stdout.decode()
            for args in (
                ("servers",),
                ("servers", "--json"),
                ("status",),
                ("status", "--json"),
                ("logs", "remote"),
                ("logs", "remote", "--json"),
                ("logs",),
            )
        ]
        status = await daemon.ctl("status")
    for out in outputs:
        assert "s3cr3t" not in out, out
    (skipped,) = status["skipped"]
    assert "headers.Authorization" in skipped["error"] and str(settings) in skipped["error"]
    assert "newline" in skipped["error"]
    assert "s3cr3t" not in daemon.log_path.read_text()


async def test_an_unparseable_url_does_not_break_daemonctl_servers(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    settings = daemon.settings_file(
        ".mcp.json",
        {
            "port": {"httpUrl": "http://user:pw@127.0.0.1:99999/mcp?token=SECRET"},
            "ipv6": {"httpUrl": "http://[::1/mcp?token=SECRET"},
            "fine": fake_server(),
        },
    )
    async with daemon.attach([settings], "one", env=client_env(daemon)) as one:
        await call_text(one, "fine__pid")
        table = (await run_daemonctl(daemon.sock, "servers", env=daemon.env)).stdout.decode()
        servers = await servers_of(daemon)
        await call_text(one, "fine__pid")  # the daemon is still there
    urls = {s["name"]: (s.get("transport_detail") or {}).get("url") for s in servers}
    assert urls["port"] == "http://127.0.0.1:99999/mcp"
    assert urls["ipv6"] == "http://[::1/mcp"
    assert "SECRET" not in table and "pw" not in json.dumps(servers)


async def test_a_missing_cwd_is_refused_not_run_elsewhere(daemon_factory: DaemonFactory) -> None:
    daemon = await daemon_factory()
    spawns = daemon.root / "spawns.log"
    typo = {**fake_server(FAKE_SPAWN_LOG=str(spawns)), "cwd": "./no-such-folder"}
    settings = daemon.settings_file(".mcp.json", {"typo": typo, "fine": fake_server()})
    missing = str(daemon.root / "no-such-folder")
    async with daemon.attach([settings], "one", env=client_env(daemon)) as one:
        names = await tool_names(one)
        servers = await servers_of(daemon)
        status = await daemon.ctl("status")
    assert not any(n.startswith("typo__") for n in names)
    assert not spawns.exists()  # never started anywhere
    (refused,) = [s for s in servers if s["name"] == "typo"]
    assert refused["state"] == "refused"
    for part in (missing, str(settings), "'typo'", "cwd"):
        assert part in refused["last_error"], (part, refused)
    assert status["skipped"][0]["server"] == "typo"
    assert missing in daemon.log_path.read_text()


async def test_a_cwd_removed_after_the_settings_were_read_fails_the_spawn(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory(daemon={"backoffInitial": 0.05, "backoffMax": 0.2})
    folder = daemon.root / "work"
    folder.mkdir()
    spawns = daemon.root / "spawns.log"
    entry = {**fake_server(FAKE_SPAWN_LOG=str(spawns)), "cwd": str(folder)}
    settings = daemon.settings_file(".mcp.json", {"fake": entry})
    async with daemon.attach([settings], "one", env=client_env(daemon)) as one:
        pid = int(await call_text(one, "fake__pid"))
        folder.rmdir()
        psutil.Process(pid).kill()

        async def failed() -> bool:
            (server,) = await servers_of(daemon)
            return "does not exist" in (server.get("last_error") or "")

        with trio.fail_after(STEP_TIMEOUT):
            await wait_until(failed)
        (server,) = await servers_of(daemon)
    assert str(folder) in server["last_error"]
    assert len(spawns.read_text().split()) == 1  # the respawn did not run in another folder


async def test_an_attach_from_the_daemons_own_upstream_refuses_to_run(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    argv = [sys.executable, "-m", "mcpool", "attach", "--socket", str(daemon.sock)]

    async def attach_with_marker(value: str) -> subprocess.CompletedProcess[bytes]:
        env = {**daemon.attach_env(), "PATH": os.environ["PATH"], UPSTREAM_MARKER: value}
        with trio.fail_after(STEP_TIMEOUT):
            return await trio.run_process(
                argv, env=env, stdin=b"", capture_stdout=True, capture_stderr=True, check=False
            )

    own = await attach_with_marker(str(daemon.pid))
    sessions_after_own = await daemon.ctl("sessions")
    # A marker from another daemon (a bridge run by an upstream of `mcpool demo`'s private
    # daemon, say) is no loop here: that attach goes ahead (and ends with its empty stdin).
    other = await attach_with_marker(str(daemon.pid + 100_000))
    assert own.returncode == 1, own
    message = f"refusing to attach to the mcpool daemon (pid {daemon.pid})"
    assert message.encode() in own.stderr, own.stderr
    assert sessions_after_own == []
    assert other.returncode == 0, other
    log = daemon.log_path.read_text()
    assert log.count("session attached") == 1  # only the second one ever attached


async def test_entries_that_launch_mcpool_are_skipped_and_disguised_ones_refuse(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    direct = {"command": sys.executable, "args": ["-m", "mcpool", "attach"]}
    # What static detection cannot see: the run-time marker stops it.
    disguised = {
        "command": "/bin/sh",
        "args": ["-c", f"exec {sys.executable} -m mcpool attach --socket {daemon.sock}"],
    }
    settings = daemon.settings_file(
        ".mcp.json", {"mcpool": direct, "disguised": disguised, "fine": fake_server()}
    )
    async with daemon.attach([settings], "one", env=client_env(daemon)) as one:
        names = await tool_names(one)

        async def disguised_failed() -> bool:
            found = [s for s in await servers_of(daemon) if s["name"] == "disguised"]
            return bool(found and found[0].get("last_error"))

        with trio.fail_after(STEP_TIMEOUT):
            await wait_until(disguised_failed)
        servers = await servers_of(daemon)
        status = await daemon.ctl("status")
        sessions = await daemon.ctl("sessions")
        logs = await daemon.ctl("logs", "disguised")
    assert [n for n in names if not n.startswith("fine__")] == []
    (skipped,) = status["skipped"]
    assert skipped["server"] == "mcpool" and skipped["file"] == str(settings)
    assert "launches mcpool itself" in skipped["error"]
    (nested,) = [s for s in servers if s["name"] == "disguised"]
    assert "refusing to attach to the mcpool daemon" in nested["last_error"]
    assert "refusing to attach to the mcpool daemon" in "\n".join(logs["lines"])
    assert len(sessions) == 1, sessions  # the nested bridge never became a session


async def test_a_session_without_a_bridge_expands_from_the_base_environment(
    daemon_factory: DaemonFactory,
) -> None:
    entry = fake_server()
    entry["env"] = {"SEEN_SECRET": "${SECRET_TOKEN:-absent}", "SEEN_LANG": "${LANG:-none}"}
    daemon = await daemon_factory({"fake": entry}, env={"SECRET_TOKEN": SECRET, "LANG": "C.UTF-8"})
    async with daemon.raw() as client:  # a raw MCP client: no mcpool/attach, no env sent
        init = await client.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        )
        assert "result" in init, init
        await client.notify("notifications/initialized")

        async def listed() -> bool:
            tools = (await client.request("tools/list", {}))["result"]["tools"]
            return any(t["name"] == "fake__env" for t in tools)

        with trio.fail_after(STEP_TIMEOUT):
            await wait_until(listed)
        seen = [
            raw_text(await raw_call(client, "fake__env", {"name": name}))
            for name in ("SEEN_SECRET", "SEEN_LANG")
        ]
    # The daemon's own SECRET_TOKEN is not in its base environment; LANG is.
    assert seen == ["absent", "C.UTF-8"]


async def test_an_attach_with_a_malformed_env_is_refused_and_the_daemon_stays(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory({"fake": fake_server()})
    async with daemon.raw() as client:
        reply = await client.request(
            "mcpool/attach", {"sources": [], "name": "bad", "env": {"A": ["not", "a", "str"]}}
        )
    assert reply["error"]["code"] == -32602, reply
    async with daemon.attach([daemon.config_path], "after") as after:
        await call_text(after, "fake__pid")
