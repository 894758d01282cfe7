"""daemonctl against a real daemon, run as a user would: human tables and `--json`, exit codes,
`explain` for an included, an excluded and a not-in-include-list tool, and the JSON-lines log."""

from __future__ import annotations

import json
import re
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

from e2e.harness import DaemonFactory, DaemonProcess, fake_server, run_daemonctl
from e2e.support import STEP_TIMEOUT, raw_attach

SECRET = "sk-e2e-very-secret"


async def ctl(daemon: DaemonProcess, *args: str, check: bool = True) -> tuple[int, str, str]:
    done = await run_daemonctl(daemon.sock, *args, env=daemon.env, check=check)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def ctl_json(daemon: DaemonProcess, *args: str) -> Any:
    return json.loads((await ctl(daemon, *args, "--json"))[1])


def _server() -> dict[str, Any]:
    return fake_server(FAKE_TOOLS="read_file,write_file", API_KEY=SECRET)


async def test_every_command_human_and_json(daemon_factory: DaemonFactory) -> None:
    daemon = await daemon_factory()
    inc = daemon.settings_file("inc.json", {"files": {**_server(), "includeTools": ["read_file"]}})
    exc = daemon.settings_file("exc.json", {"files": {**_server(), "excludeTools": ["write_file"]}})
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(daemon.attach([inc], "inc"))
        await stack.enter_async_context(daemon.attach([exc], "exc"))

        # status: counts, processes, total upstream RSS.
        status = await ctl_json(daemon, "status")
        assert (status["sessions"], status["entries"], status["processes"]) == (2, 1, 1)
        assert status["pid"] == daemon.pid
        assert isinstance(status["rss"], int)
        assert status["rss"] > 0
        assert {c["path"]: c["status"] for c in status["config"]}[str(daemon.config_path)] == "ok"
        _, human, _ = await ctl(daemon, "status")
        assert re.search(rf"pid\s+{daemon.pid}\b", human)
        assert re.search(r"upstream rss\s+\d+\.\d MiB", human)
        assert str(daemon.config_path) in human

        # servers: one shared entry, era, transport, RSS, uptime, restarts, fingerprint prefix.
        (entry,) = await ctl_json(daemon, "servers")
        assert entry["name"] == "files"
        assert entry["state"] == "active"
        assert entry["transport"] == "stdio"
        assert entry["era"]
        assert re.fullmatch(r"[0-9a-f]{12}", entry["fingerprint"])
        assert entry["id"] == f"files::{entry['fingerprint']}"
        assert len(entry["refs"]) == 2
        assert entry["rss"] > 0
        assert entry["restarts"] == 0
        assert entry["uptime"] >= 0
        _, human, _ = await ctl(daemon, "servers")
        row = next(line for line in human.splitlines() if line.startswith("files "))
        for text in (entry["id"], "active", "stdio", str(entry["pid"]), "MiB"):
            assert text in row
        assert entry["fingerprint"][:8] in row
        for output in (human, json.dumps(entry), (await ctl(daemon, "status"))[1]):
            assert SECRET not in output  # X2

        # sessions: attached-since and pending notifications.
        sessions = {s["name"]: s for s in await ctl_json(daemon, "sessions")}
        assert set(sessions) == {"inc", "exc"}
        assert sessions["inc"]["pending_notifications"] == 0
        assert sessions["inc"]["attached_at"] > status["started_at"]
        assert sessions["inc"]["handles"][0]["policy"]["includeTools"] == ["read_file"]
        _, human, _ = await ctl(daemon, "sessions")
        # NAME, ERA (the negotiated protocol version), VIA (the bridge handed its stdio over),
        # CWD, ATTACHED.
        assert sessions["inc"]["via"] == "attach"
        version = re.escape(sessions["inc"]["protocol_version"])
        assert re.search(rf"inc\s+{version}\s+attach\s+\S+\s+\d\d:\d\d:\d\d \(\d+s\)", human)
        inc_id = sessions["inc"]["id"]

        # tools: what one session sees, with its routes.
        tools = await ctl_json(daemon, "tools", inc_id, "--server", "files")
        assert [t["exposed"] for t in tools if t["kind"] == "tool"] == ["files__read_file"]
        assert tools[0] == {
            "exposed": "files__read_file",
            "kind": "tool",
            "server": "files",
            "entry": entry["id"],
            "upstream": "read_file",
            "callable": True,
            "refused": None,
        }
        _, human, _ = await ctl(daemon, "tools", "exc")  # a session name works too
        assert "files__read_file" in human
        assert "files__write_file" not in human
        assert "files__echo" in human


async def test_explain_included_excluded_and_not_in_include_list(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    inc = daemon.settings_file("inc.json", {"files": {**_server(), "includeTools": ["read_file"]}})
    exc = daemon.settings_file("exc.json", {"files": {**_server(), "excludeTools": ["write_file"]}})
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(daemon.attach([inc], "inc"))
        await stack.enter_async_context(daemon.attach([exc], "exc"))

        # Included: visible through includeTools; the other session sees it too.
        included = await ctl_json(daemon, "explain", "inc", "files__read_file")
        (match,) = included["matches"]
        assert match["visible"] is True
        assert (match["rule"], match["filter"]) == ("listed in includeTools", "includeTools")
        assert (match["server"], match["upstream"]) == ("files", "read_file")
        assert match["source"] == str(inc)
        assert [o["name"] for o in match["seen_by"]] == ["exc"]
        assert match["hidden_from"] == []
        code, human, _ = await ctl(daemon, "explain", "inc", "files__read_file")
        assert code == 0
        assert human.startswith("files__read_file: VISIBLE in session ")
        assert "listed in includeTools" in human
        assert f"server 'files' in {inc}" in human
        assert re.search(r"seen by\s+\S+ \(exc\) as files__read_file", human)

        # Excluded, asked by its upstream name: hidden by excludeTools in this session, and by
        # includeTools in the other one.
        excluded = await ctl_json(daemon, "explain", "exc", "write_file")
        (match,) = excluded["matches"]
        assert match["visible"] is False
        assert (match["rule"], match["filter"]) == ("excluded by excludeTools", "excludeTools")
        assert match["exposed"] == "files__write_file"
        assert match["source"] == str(exc)
        assert match["policy"]["excludeTools"] == ["write_file"]
        assert match["seen_by"] == []
        assert [(o["name"], o["rule"]) for o in match["hidden_from"]] == [
            ("inc", "not listed in includeTools")
        ]
        code, human, _ = await ctl(daemon, "explain", "exc", "write_file")
        assert code == 0
        assert "files__write_file: HIDDEN" in human
        assert 'excludeTools = ["write_file"]' in human

        # Not in the include list: hidden by includeTools; the exclude-list session sees it.
        missing = await ctl_json(daemon, "explain", "inc", "files__echo")
        (match,) = missing["matches"]
        assert match["visible"] is False
        assert (match["rule"], match["filter"]) == ("not listed in includeTools", "includeTools")
        assert [o["name"] for o in match["seen_by"]] == ["exc"]
        code, human, _ = await ctl(daemon, "explain", "inc", "files__echo")
        assert "HIDDEN" in human
        assert 'includeTools = ["read_file"]' in human

        # Nothing of that name: exit 1, explained.
        code, human, _ = await ctl(daemon, "explain", "inc", "no_such_tool", check=False)
        assert code == 1
        assert "no server of session" in human


async def test_explain_finds_a_tool_of_a_server_the_session_lacks(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    with_files = daemon.settings_file("a.json", {"files": _server()})
    other = daemon.settings_file("b.json", {"other": fake_server(FAKE_TOOLS="solo")})
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(daemon.attach([with_files], "a"))
        await stack.enter_async_context(daemon.attach([other], "b"))
        code, human, _ = await ctl(daemon, "explain", "a", "solo", check=False)
        assert code == 1
        assert "server other" in human
        assert "do not list a server named 'other'" in human


async def test_exit_codes(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    daemon = await daemon_factory()
    code, _, err = await ctl(daemon, "tools", "nobody", check=False)
    assert code == 1
    assert err.startswith("daemonctl: ")
    code, _, err = await ctl(daemon, "explain", "only-one-arg", check=False)
    assert code == 2
    assert "usage:" in err
    done = await run_daemonctl(tmp_path / "none.sock", "status", check=False)
    assert done.returncode == 3
    assert b"no mcpool daemon is running" in done.stderr


async def test_reload_and_restart_show_a_one_line_result(daemon_factory: DaemonFactory) -> None:
    daemon = await daemon_factory({"files": _server()})
    async with daemon.attach([daemon.config_path], "s"):
        code, out, _ = await ctl(daemon, "reload")
        assert code == 0
        assert re.fullmatch(
            r"reload applied: \d+ files \(.*ok.*\) in \d+\.\d\d s", out.splitlines()[-1]
        )
        (before,) = await ctl_json(daemon, "servers")
        code, out, _ = await ctl(daemon, "restart", "files")
        assert code == 0, out
        assert re.fullmatch(
            r"restarted: files, 1 of 1 entry up \(\d+\.\d\d s\)", out.splitlines()[-1]
        )
        (after,) = await ctl_json(daemon, "servers")
        assert after["pid"] != before["pid"]
        assert after["restarts"] >= 1


async def test_start_reports_an_already_running_daemon(daemon_factory: DaemonFactory) -> None:
    daemon = await daemon_factory()
    code, out, _ = await ctl(daemon, "start")
    assert code == 0
    assert out == f"mcpool daemon already running (pid {daemon.pid}) at {daemon.sock}\n"
    result = await ctl_json(daemon, "start")
    assert (result["pid"], result["started"]) == (daemon.pid, False)


def _log_records(daemon: DaemonProcess) -> list[dict[str, Any]]:
    return [json.loads(line) for line in daemon.log_path.read_text().splitlines()]


async def test_json_lines_log_under_the_state_folder(daemon_factory: DaemonFactory) -> None:
    daemon = await daemon_factory({"files": _server()})
    async with daemon.attach([daemon.config_path], "logged"):
        pass
    await daemon.stop()
    records = _log_records(daemon)
    assert {"ts", "level", "msg"} <= set(records[0])
    messages = [r["msg"] for r in records]
    assert "daemon started" in messages
    assert "session attached" in messages
    assert messages[-1] == "daemon stopped"
    assert SECRET not in daemon.log_path.read_text()


async def test_log_level_from_the_config_and_the_command_line(
    daemon_factory: DaemonFactory,
) -> None:
    quiet = await daemon_factory({"files": _server()}, daemon={"logLevel": "warning"})
    async with quiet.attach([quiet.config_path], "quiet"):
        pass
    await quiet.stop()
    if quiet.log_path.exists():
        assert {r["level"] for r in _log_records(quiet)} <= {"warning", "error"}

    # --log-level wins over the config.
    loud = await daemon_factory({"files": _server()}, daemon={"logLevel": "warning"}, start=False)
    base = loud.argv()
    loud.argv = lambda: [*base, "--log-level", "info"]  # type: ignore[method-assign]
    await loud.start()
    async with loud.attach([loud.config_path], "loud"):
        pass
    await loud.stop()
    assert "session attached" in [r["msg"] for r in _log_records(loud)]


async def test_start_starts_a_detached_daemon_and_stop_ends_it(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory(start=False)
    code, out, _ = await ctl(daemon, "start")
    assert code == 0
    started = re.fullmatch(
        rf"mcpool daemon started \(pid (\d+)\) at {re.escape(str(daemon.sock))} in \d+\.\d\d s\n",
        out,
    )
    assert started, out
    status = await ctl_json(daemon, "status")
    assert status["pid"] == int(started.group(1))
    code, out, _ = await ctl(daemon, "stop")
    assert (code, out) == (0, f"mcpool daemon (pid {status['pid']}) stopped\n")
    code, _, _ = await ctl(daemon, "status", check=False)
    assert code == 3


async def test_status_lists_a_project_file_only_while_a_session_reads_it(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory({"f": _server()})
    project = daemon.settings_file("project.json", {"g": _server()})

    def paths(status: dict[str, Any]) -> set[str]:
        return {f["path"] for f in status["config"]}

    async with daemon.raw() as client:
        await raw_attach(client, [str(project)], "project")
        assert str(project) in paths(await ctl_json(daemon, "status"))
    with trio.fail_after(STEP_TIMEOUT):
        while str(project) in paths(await ctl_json(daemon, "status")):
            await trio.sleep(0.05)
    # The daemon's own config stays; a long-lived daemon forgets projects nobody attaches.
    assert paths(await ctl_json(daemon, "status")) == {str(daemon.config_path)}
