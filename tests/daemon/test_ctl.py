"""`daemonctl` as a subprocess against a fake admin server answering canned results."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpool.daemon._ctl import age, new_lines

# Every wait in these tests is bounded by this; a healthy run takes milliseconds.
WAIT = 10.0
NOW = time.time()
SECRET = "sk-very-secret-value"

STATUS = {
    "pid": 4242,
    "version": "0.1.0",
    "socket": "/run/user/1000/mcpool/daemon.sock",
    "started_at": NOW - 133,
    "uptime": 133.0,
    "config": [
        {
            "path": "/home/u/.config/mcpool/config.json",
            "kind": "daemon",
            "status": "ok",
            "error": None,
            "loaded_at": NOW - 100,
        },
        {
            "path": "/p/.mcp.json",
            "kind": "settings",
            "status": "error",
            "error": "line 3: expected ','",
            "loaded_at": None,
        },
    ],
    "sessions": 2,
    "entries": 1,
    "processes": 1,
    "rss": 70 << 20,
    "registry_errors": [{"session": "sess-b", "error": "duplicate exposed name time__now"}],
    "notes": ["watching 2 files"],
}
SERVERS = [
    {
        "name": "time",
        "id": "time::3f9a1c2b",
        "fingerprint": "3f9a1c2b7d11",
        "state": "ready",
        "refs": ["sess-a", "sess-b"],
        "pid": 5151,
        "started_at": NOW - 60,
        "transport": "stdio",
        "era": "2025-06-18",
        "restarts": 0,
        "last_error": None,
        "rss": 66 << 20,
        # Not part of the wire; here to prove the human view shows only the fields it names.
        "env": {"API_KEY": SECRET},
        "headers": {"Authorization": SECRET},
    },
    {
        "name": "scratch",
        "id": "scratch::unpooled-1",
        "fingerprint": "aa00bb11cc22",
        "state": "crash-loop",
        "refs": [],
        "pid": None,
        "started_at": None,
        "transport": "stdio",
        "era": None,
        "restarts": 5,
        "last_error": "exited with status 1 [bold]",
        "rss": None,
    },
]
SESSIONS = [
    {
        "id": "sess-a",
        "name": "proj",
        "cwd": "/p",
        "attached_at": NOW - 30,
        "servers": ["time"],
        "generation": 3,
        "pending_notifications": 0,
        "via": "attach",
        "handles": [{"server": "time", "id": "time::3f9a1c2b", "policy": {"trust": True}}],
    }
]
TOOLS = [
    {
        "exposed": "time__now",
        "kind": "tool",
        "server": "time",
        "entry": "time::3f9a1c2b",
        "upstream": "now",
    }
]
RESULTS: dict[str, Any] = {
    "status": STATUS,
    "servers": SERVERS,
    "sessions": SESSIONS,
    "tools": TOOLS,
    "reload": {"files": [{"path": "/p/.mcp.json", "status": "ok", "error": None}]},
    "restart": {"entries": [{"id": "time::3f9a1c2b", "result": "restarted"}]},
    "logs": {"lines": ["12:00:00 started", "12:00:01 time: ready"]},
    "setServer": {"action": "refresh"},
    "explain": {
        "session": "sess-a",
        "session_name": "proj",
        "name": "write_file",
        "matches": [
            {
                "kind": "tool",
                "server": "files",
                "entry": "files::aa00bb11cc22",
                "entry_state": "active",
                "upstream": "write_file",
                "exposed": "files__write_file",
                "visible": False,
                "rule": "excluded by excludeTools",
                "filter": "excludeTools",
                "policy": {
                    "trust": None,
                    "includeTools": None,
                    "excludeTools": ["write_file"],
                    "alwaysLoadTools": False,
                },
                "source": "/p/.mcp.json",
                "seen_by": [
                    {
                        "session": "sess-b",
                        "name": "other",
                        "entry": "files::aa00bb11cc22",
                        "exposed": "files__write_file",
                    }
                ],
                "hidden_from": [],
            }
        ],
        "elsewhere": [],
    },
}


class FakeAdmin:
    """Answers `mcpool/admin/<command>` from `results`; a callable result gets the params."""

    def __init__(self, path: Path, results: dict[str, Any]) -> None:
        self.path = path
        self.results = results
        self.requests: list[dict[str, Any]] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            for line in conn.makefile("rb"):
                request = json.loads(line)
                self.requests.append(request)
                command = request["method"].removeprefix("mcpool/admin/")
                answer = self.results.get(command)
                if callable(answer):
                    answer = answer(request["params"])
                if isinstance(answer, Exception):
                    response = {"jsonrpc": "2.0", "id": request["id"], "error": answer.args[0]}
                else:
                    response = {"jsonrpc": "2.0", "id": request["id"], "result": answer}
                conn.sendall(json.dumps(response).encode() + b"\n")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(WAIT)


@pytest.fixture
def admin(sock_dir: Path) -> Iterator[FakeAdmin]:
    # The canned times are relative to NOW (import time); a test may run minutes later (after
    # the slow tests), so move them to this moment: ages in the tables stay as written.
    fake = FakeAdmin(sock_dir / "daemon.sock", _shifted(RESULTS, time.time() - NOW))
    yield fake
    fake.close()


def _shifted(value: Any, delta: float) -> Any:
    if isinstance(value, dict):
        return {
            k: (v + delta if k.endswith("_at") and isinstance(v, float) else _shifted(v, delta))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_shifted(v, delta) for v in value]
    return value


def _daemonctl_command() -> list[str]:
    script = Path(sys.executable).with_name("daemonctl")
    if script.exists():
        return [str(script)]
    code = "import sys; from mcpool.daemon._ctl import main; sys.exit(main())"
    return [sys.executable, "-c", code]


def daemonctl(sock: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_daemonctl_command(), "--socket", str(sock), *args],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "method", "params"),
    [
        (["status"], "status", {}),
        (["servers"], "servers", {}),
        (["sessions"], "sessions", {}),
        (["tools", "sess-a"], "tools", {"session": "sess-a", "server": None}),
        (["tools", "sess-a", "--server", "time"], "tools", {"session": "sess-a", "server": "time"}),
        (["restart", "time"], "restart", {"name": "time"}),
        (["reload"], "reload", {}),
        (
            ["explain", "sess-a", "write_file"],
            "explain",
            {"session": "sess-a", "name": "write_file"},
        ),
        (["logs"], "logs", {"name": None, "lines": 50}),
        (["logs", "time", "-n", "5"], "logs", {"name": "time", "lines": 5}),
        (
            ["session", "set-server", "sess-a", "time", '{"command": "uvx", "trust": true}'],
            "setServer",
            {"session": "sess-a", "name": "time", "entry": {"command": "uvx", "trust": True}},
        ),
    ],
)
def test_json_prints_exactly_the_daemons_result(
    admin: FakeAdmin, args: list[str], method: str, params: dict[str, Any]
) -> None:
    proc = daemonctl(admin.path, *args, "--json")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert json.loads(proc.stdout) == admin.results[method]
    assert proc.stdout == json.dumps(admin.results[method], indent=2) + "\n"
    (request,) = admin.requests
    assert request["method"] == f"mcpool/admin/{method}"
    assert request["params"] == params


def test_json_is_accepted_before_the_command(admin: FakeAdmin) -> None:
    proc = daemonctl(admin.path, "--json", "servers")
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == admin.results["servers"]


def test_human_servers_table_shows_ids_and_never_env_or_header_values(admin: FakeAdmin) -> None:
    proc = daemonctl(admin.path, "servers")
    assert (proc.returncode, proc.stderr) == (0, "")
    out = proc.stdout
    for text in ("time::3f9a1c2b", "scratch::unpooled-1", "crash-loop", "66.0 MiB", "2025-06-18"):
        assert text in out
    # The fingerprint prefix and transport; never the full fingerprint's tail.
    assert "3f9a1c2b " in out
    assert "3f9a1c2b7d11" not in out
    assert "stdio" in out
    for column in ("TRANSPORT", "ERA", "RSS", "UP SINCE", "RESTARTS", "FINGERPRINT"):
        assert column in out
    # Error text is shown as written, not read as rich markup.
    assert "exited with status 1 [bold]" in out
    assert re.search(r"\d\d:\d\d:\d\d \((59s|1m0\ds)\)", out)
    assert SECRET not in out
    assert "\x1b[" not in out  # no colours when not a tty


def test_human_status_sessions_tools_reload_restart(admin: FakeAdmin) -> None:
    status = daemonctl(admin.path, "status").stdout
    for text in ("4242", "2m13s", "70.0 MiB", "/p/.mcp.json", "expected ','", "sess-b", "watching"):
        assert text in status
    sessions = daemonctl(admin.path, "sessions").stdout
    for text in ("sess-a", "proj", "/p", "time", "attach"):
        assert text in sessions
    assert re.search(r"\d\d:\d\d:\d\d \(3\ds\)", sessions)
    tools = daemonctl(admin.path, "tools", "sess-a").stdout
    for text in ("time__now", "tool", "time::3f9a1c2b", "now"):
        assert text in tools
    assert "/p/.mcp.json" in daemonctl(admin.path, "reload").stdout
    assert "restarted" in daemonctl(admin.path, "restart", "time").stdout
    logs = daemonctl(admin.path, "logs")
    assert logs.stdout == "12:00:00 started\n12:00:01 time: ready\n"
    set_server = daemonctl(admin.path, "session", "set-server", "sess-a", "time", "{}")
    assert set_server.stdout == "time: refresh\n"


def test_tools_marks_calls_the_current_settings_refuse(admin: FakeAdmin) -> None:
    assert "CALLS" not in daemonctl(admin.path, "tools", "sess-a").stdout  # none refused
    why = "hidden by policy (excluded by excludeTools); still listed until the reload ends"
    admin.results["tools"] = [
        {**TOOLS[0], "callable": True, "refused": None},
        {
            **TOOLS[0],
            "exposed": "time__zone",
            "upstream": "zone",
            "callable": False,
            "refused": why,
        },
    ]
    out = daemonctl(admin.path, "tools", "sess-a").stdout
    assert "CALLS" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("time__")}
    assert rows["time__now"].rstrip().endswith(" ok")
    assert "refused: hidden by" in rows["time__zone"]
    assert " ".join(out.split()).count("excluded by excludeTools") == 1


def test_empty_lists_say_so(admin: FakeAdmin) -> None:
    admin.results.update(servers=[], sessions=[], tools=[])
    assert daemonctl(admin.path, "servers").stdout.strip() == "no servers"
    assert daemonctl(admin.path, "sessions").stdout.strip() == "no sessions"
    assert daemonctl(admin.path, "tools", "s").stdout.strip() == "no tools or prompts"


def test_reload_with_a_broken_file_exits_1(admin: FakeAdmin) -> None:
    admin.results["reload"] = {"files": [{"path": "/p/x.json", "status": "error", "error": "bad"}]}
    proc = daemonctl(admin.path, "reload", "--json")
    assert proc.returncode == 1
    assert json.loads(proc.stdout) == admin.results["reload"]


def test_error_response_exits_1_with_the_message(admin: FakeAdmin) -> None:
    error = {"code": -31002, "message": "unknown session", "data": "no session sess-z"}
    admin.results["tools"] = RuntimeError(error)
    proc = daemonctl(admin.path, "tools", "sess-z")
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == "daemonctl: unknown session (no session sess-z)\n"


def test_no_daemon_exits_3(sock_dir: Path) -> None:
    missing = sock_dir / "nothing.sock"
    proc = daemonctl(missing, "status")
    assert proc.returncode == 3
    assert proc.stderr == f"no mcpool daemon is running at {missing}\n"
    # A socket file left behind by a dead daemon: connection refused.
    stale = sock_dir / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(stale))
    proc = daemonctl(stale, "servers", "--json")
    assert proc.returncode == 3
    assert proc.stderr == f"no mcpool daemon is running at {stale}\n"


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["bogus"],
        ["tools"],
        ["restart"],
        ["logs", "-n", "zero"],
        ["logs", "-n", "0"],
        ["session"],
        ["session", "set-server", "s", "time", "{not json"],
        ["session", "set-server", "s", "time", "[1, 2]"],
    ],
)
def test_usage_errors_exit_2(admin: FakeAdmin, args: list[str]) -> None:
    proc = daemonctl(admin.path, *args)
    assert proc.returncode == 2
    assert "usage:" in proc.stderr
    assert admin.requests == []


def test_stop_waits_until_the_socket_and_the_process_are_gone(admin: FakeAdmin) -> None:
    pretend_daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    def stop(params: dict[str, Any]) -> dict[str, Any]:
        def shut_down() -> None:
            time.sleep(0.2)
            admin.path.unlink()
            time.sleep(0.2)
            pretend_daemon.terminate()
            pretend_daemon.wait(WAIT)

        threading.Thread(target=shut_down, daemon=True).start()
        return {"pid": pretend_daemon.pid}

    admin.results["stop"] = stop
    try:
        began = time.monotonic()
        proc = daemonctl(admin.path, "stop")
        assert (proc.returncode, proc.stderr) == (0, "")
        assert proc.stdout == f"mcpool daemon (pid {pretend_daemon.pid}) stopped\n"
        assert time.monotonic() - began >= 0.4
        assert pretend_daemon.poll() is not None
    finally:
        pretend_daemon.kill()
        pretend_daemon.wait(WAIT)


def test_logs_follow_prints_only_new_lines_until_interrupted(admin: FakeAdmin) -> None:
    log = ["a 1", "a 2"]

    def logs(params: dict[str, Any]) -> dict[str, Any]:
        lines = list(log)
        log.append(f"a {len(log) + 1}")
        return {"lines": lines[-params["lines"] :]}

    admin.results["logs"] = logs
    proc = subprocess.Popen(
        [*_daemonctl_command(), "--socket", str(admin.path), "logs", "-f"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout = proc.stdout
        assert stdout is not None
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.extend(stdout.readline() for _ in range(4)))
        reader.start()
        reader.join(WAIT)  # the first poll is FOLLOW_INTERVAL (1 s) after the first print
        assert got == ["a 1\n", "a 2\n", "a 3\n", "a 4\n"]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=WAIT)
        assert proc.returncode == 130
        assert "Traceback" not in err
    finally:
        proc.kill()
        proc.wait(WAIT)


def test_new_lines_finds_the_seam_between_two_tails() -> None:
    assert new_lines([], ["x"]) == ["x"]
    assert new_lines(["a", "b"], ["a", "b"]) == []
    assert new_lines(["a", "b"], ["a", "b", "c", "d"]) == ["c", "d"]
    assert new_lines(["b", "c"], ["a", "b", "c", "d"]) == ["d"]  # a wider window
    assert new_lines(["a", "b", "c"], ["b", "c", "d"]) == ["d"]  # a scrolled window
    assert new_lines(["a", "b"], ["x", "y"]) == ["x", "y"]  # rotated, or a burst past the window


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (59.9, "59s"), (133, "2m13s"), (3600, "1h00m"), (90061, "1d01h"), (-5, "0s")],
)
def test_age(seconds: float, text: str) -> None:
    assert age(seconds) == text


def test_import_does_not_pull_in_rich() -> None:
    code = "import sys, mcpool.daemon._ctl; print(any(m.startswith('rich') for m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT, check=True
    )
    assert out.stdout == "False\n"


def test_human_explain_names_the_rule_the_file_and_other_sessions(admin: FakeAdmin) -> None:
    proc = daemonctl(admin.path, "explain", "sess-a", "write_file")
    assert (proc.returncode, proc.stderr) == (0, "")
    out = proc.stdout
    assert out.startswith("files__write_file: HIDDEN in session sess-a (proj)\n")
    for text in (
        "tool 'write_file' of server 'files' (entry files::aa00bb11cc22, active)",
        "excluded by excludeTools",
        'excludeTools = ["write_file"]',
        "server 'files' in /p/.mcp.json",
        "sess-b (other) as files__write_file",
    ):
        assert text in out


def test_explain_of_an_unknown_name_exits_1_and_says_where_it_is(admin: FakeAdmin) -> None:
    admin.results["explain"] = {
        "session": "sess-a",
        "session_name": "proj",
        "name": "now",
        "matches": [],
        "elsewhere": [
            {
                "kind": "tool",
                "server": "time",
                "entry": "time::3f9a1c2b",
                "upstream": "now",
                "reason": "this session's settings do not list a server named 'time'",
            }
        ],
    }
    proc = daemonctl(admin.path, "explain", "sess-a", "now")
    assert proc.returncode == 1
    assert "now: no server of session sess-a (proj) offers it" in proc.stdout
    assert "do not list a server named 'time'" in proc.stdout


def test_reload_and_restart_end_with_a_one_line_result(admin: FakeAdmin) -> None:
    reload = daemonctl(admin.path, "reload").stdout.splitlines()
    assert re.fullmatch(r"reload applied: 1 files \(1 ok\) in \d+\.\d\d s", reload[-1])
    restart = daemonctl(admin.path, "restart", "time").stdout.splitlines()
    assert re.fullmatch(r"restarted: time, 1 of 1 entry up \(\d+\.\d\d s\)", restart[-1])
    admin.results["restart"] = {
        "entries": [{"id": "time::3f9a1c2b", "result": "crash-loop", "error": "exit 1"}]
    }
    failed = daemonctl(admin.path, "restart", "time")
    assert failed.returncode == 1
    assert failed.stdout.splitlines()[-1].startswith("restart incomplete: time, 0 of 1 entry up")
