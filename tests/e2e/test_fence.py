"""Issue 12, items 1, 2 and 14: peers that go away mid-write, admin params typed at the boundary,
the daemon's exit status, and `mcpool attach` with its stdin already closed.

Real daemon processes throughout. A peer that "goes away before its answer" is a connection
that sends its line and closes at once, repeated, as `curl --unix-socket` did: whether a given
try closes before the daemon writes is up to the scheduler, and the daemon must survive both.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from e2e.harness import (
    ATTACH_TIMEOUT,
    DAEMON_STOP_TIMEOUT,
    DaemonFactory,
    DaemonProcess,
    attach_args,
    daemonctl_argv,
    fake_server,
    run_daemonctl,
)
from e2e.support import STEP_TIMEOUT, alive, process, raw_attach, servers_of, wait_until

INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
METHOD_NOT_FOUND = -32601
# Each hostile peer is tried this many times: the unpatched daemon died within three.
TRIES = 10
# A restart that takes this long gives a caller time to give up while it waits.
SLOW_START = 1.5
HTTP_REQUEST = b"GET / HTTP/1.1\r\nHost: localhost\r\nUser-Agent: curl/8\r\nAccept: */*\r\n\r\n"


async def hang_up_after(sock: Path, data: bytes) -> None:
    """Connect, send `data`, close without reading anything."""
    stream = await trio.open_unix_socket(str(sock))
    try:
        await stream.send_all(data)
    finally:
        await stream.aclose()


async def still_serving(daemon: DaemonProcess) -> None:
    """The daemon process is up and answers `daemonctl status`."""
    assert daemon.process is not None
    assert daemon.process.poll() is None, daemon.output()
    status = await daemon.ctl("status")
    assert status["pid"] == daemon.pid


def log_records(daemon: DaemonProcess) -> list[dict[str, Any]]:
    return [json.loads(line) for line in daemon.log_path.read_text().splitlines() if line]


# -- peers that go away mid-write ----------------------------------------------------------------


async def test_raw_http_on_the_socket_then_close_does_not_kill_the_daemon(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    for _ in range(TRIES):
        await hang_up_after(daemon.sock, HTTP_REQUEST)
        await hang_up_after(daemon.sock, b"\xff\xfe not json\n")
    await still_serving(daemon)


async def test_curl_on_the_socket_does_not_kill_the_daemon(daemon_factory: DaemonFactory) -> None:
    import shutil

    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    daemon = await daemon_factory()
    for _ in range(TRIES):
        with trio.fail_after(STEP_TIMEOUT):
            await trio.run_process(
                [curl, "-s", "-m", "5", "--unix-socket", str(daemon.sock), "http://localhost/"],
                check=False,
                capture_stdout=True,
                capture_stderr=True,
            )
    await still_serving(daemon)


async def test_a_bridge_that_closes_before_its_attach_answer_ends_only_its_session(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory({"fake": fake_server()})
    attach = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "mcpool/attach",
        "params": {"sources": [str(daemon.config_path)], "cwd": None, "name": "gone"},
    }
    line = json.dumps(attach).encode() + b"\n"
    for _ in range(TRIES):
        await hang_up_after(daemon.sock, line)
    # The same with a hand-off: the bridge passes the client's pipes, then dies.
    for _ in range(TRIES):
        handoff = {**attach, "params": {**attach["params"], "handoff": True}}
        r, w = os.pipe()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.connect(str(daemon.sock))
            data = json.dumps(handoff).encode() + b"\n"
            raw.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(_fds(r, w)))])
        os.close(r)
        os.close(w)
    await still_serving(daemon)
    # Every one of those sessions ended: none leaks.
    with trio.fail_after(STEP_TIMEOUT):
        await wait_until(lambda: _no_sessions(daemon))


def _fds(*fds: int) -> bytes:
    return b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds)


async def _no_sessions(daemon: DaemonProcess) -> bool:
    return await daemon.ctl("sessions") == []


async def test_an_admin_caller_that_leaves_while_restart_waits(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory({"slow": fake_server(FAKE_STARTUP_DELAY=SLOW_START)})
    async with daemon.raw() as client:
        await raw_attach(client, [str(daemon.config_path)], "holder", initialize=False)
        with trio.fail_after(STEP_TIMEOUT):
            await wait_until(lambda: _state(daemon, "active"))
        (before,) = await servers_of(daemon)
        # `daemonctl restart` interrupted (^C) while the daemon waits for the new process.
        argv = daemonctl_argv(daemon.sock, "restart", "slow")
        ctl = await trio.lowlevel.open_process(
            argv, env=daemon.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        with trio.fail_after(STEP_TIMEOUT):
            # No process while the new one starts (SLOW_START): the daemon is waiting.
            await wait_until(lambda: _restarting(daemon, before["pid"]))
        ctl.send_signal(signal.SIGINT)
        with trio.fail_after(STEP_TIMEOUT):
            assert await ctl.wait() == 130
        with trio.fail_after(STEP_TIMEOUT):
            await wait_until(lambda: _back(daemon, before["restarts"] + 1))
        # And a raw caller that sends restart and closes at once.
        restart = {"jsonrpc": "2.0", "id": 1, "method": "mcpool/admin/restart"}
        line = json.dumps({**restart, "params": {"name": "slow"}}).encode() + b"\n"
        await hang_up_after(daemon.sock, line)
        with trio.fail_after(STEP_TIMEOUT):
            await wait_until(lambda: _back(daemon, before["restarts"] + 2))
        await still_serving(daemon)


async def _state(daemon: DaemonProcess, state: str) -> bool:
    servers = await servers_of(daemon)
    return bool(servers) and servers[0]["state"] == state


async def _restarting(daemon: DaemonProcess, old_pid: int) -> bool:
    servers = await servers_of(daemon)
    return bool(servers) and servers[0]["pid"] != old_pid


async def _back(daemon: DaemonProcess, restarts: int) -> bool:
    """Active again after `restarts` restarts."""
    servers = await servers_of(daemon)
    return bool(servers) and servers[0]["restarts"] >= restarts and servers[0]["state"] == "active"


# -- admin params ----------------------------------------------------------------------------------

BAD_PARAMS = [
    ("logs", {"lines": "x"}, "lines"),
    ("logs", {"lines": -1}, "lines"),
    ("logs", {"lines": 10**9}, "lines"),
    ("logs", {"lines": 1.5}, "lines"),
    ("logs", {"name": {}}, "name"),
    ("status", {"collect": "yes"}, "collect"),
    ("restart", {}, "name"),
    ("restart", {"name": ["a"]}, "name"),
    ("tools", {"session": 5}, "session"),
    ("explain", {"session": "s", "name": None}, "name"),
    ("setServer", {"session": "s", "name": "n", "entry": []}, "entry"),
    ("setServer", {"session": "s", "entry": {}}, "name"),
]


async def test_bad_admin_params_are_invalid_params_naming_the_field(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    async with daemon.raw() as client:
        for command, params, field in BAD_PARAMS:
            answer = await client.request(f"mcpool/admin/{command}", params)
            error = answer.get("error")
            assert error is not None, (command, params, answer)
            assert error["code"] == INVALID_PARAMS, (command, params, answer)
            assert error["data"]["field"] == field, (command, params, answer)
            assert field in error["data"]["reason"], answer
        for params_value in ([1], "x", 5):
            raw = {"jsonrpc": "2.0", "id": 99, "method": "mcpool/admin/status"}
            await client.send({**raw, "params": params_value})
            answer = await client.receive()
            assert answer["error"]["code"] in (INVALID_PARAMS, -32600), answer
        # The same connection, and the daemon, go on answering.
        logs = await client.request("mcpool/admin/logs", {"lines": 1})
        assert len(logs["result"]["lines"]) == 1
        assert (await client.request("mcpool/admin/logs", {"lines": 0}))["result"]["lines"] == []
    await still_serving(daemon)
    done = await run_daemonctl(daemon.sock, "logs", "-n", "1000000", env=daemon.env, check=False)
    assert done.returncode == 2  # daemonctl refuses it before asking


async def test_test_hooks_exist_only_when_enabled(daemon_factory: DaemonFactory) -> None:
    daemon = await daemon_factory()
    async with daemon.raw() as client:
        for hook in ("testCrash", "testFail"):
            answer = await client.request(f"mcpool/admin/{hook}", {})
            assert answer["error"]["code"] == METHOD_NOT_FOUND, answer
    await still_serving(daemon)


async def test_an_unexpected_error_in_an_admin_handler_answers_that_caller_only(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory(env={"MCPOOL_TEST_HOOKS": "1"})
    async with daemon.raw() as client:
        answer = await client.request("mcpool/admin/testFail", {})
        assert answer["error"]["code"] == INTERNAL_ERROR, answer
        assert "forced by the test hook" in answer["error"]["data"]["reason"]
        assert (await client.request("mcpool/admin/status"))["result"]["pid"] == daemon.pid
    await still_serving(daemon)
    (record,) = [r for r in log_records(daemon) if "admin mcpool/admin/testFail" in r["msg"]]
    assert record["level"] == "error"
    assert "Traceback" in record["traceback"]
    assert "_admin_testFail" in record["traceback"]


# -- exit status -----------------------------------------------------------------------------------


async def test_an_unexpected_error_in_a_shared_task_exits_1_with_its_traceback(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory({"fake": fake_server()}, env={"MCPOOL_TEST_HOOKS": "1"})
    async with daemon.raw() as client, daemon.raw() as admin:
        await raw_attach(client, [str(daemon.config_path)], "bystander")
        (entry,) = await servers_of(daemon)
        upstream = process(entry["pid"])
        answer = await admin.request("mcpool/admin/testCrash", {})
        assert answer["result"]["pid"] == daemon.pid, answer
        assert daemon.process is not None
        with trio.fail_after(DAEMON_STOP_TIMEOUT):
            status = await daemon.process.wait()
    assert status == 1, daemon.output()
    failed = [r for r in log_records(daemon) if r["msg"].startswith("daemon failed")]
    assert len(failed) == 1, daemon.output()
    assert "RuntimeError: forced by the test hook" in failed[0]["msg"]
    assert "Traceback" in failed[0]["traceback"]
    assert log_records(daemon)[-1]["exit_status"] == 1
    stderr = daemon.stderr_path.read_text()
    assert "mcpool daemon: failed: RuntimeError: forced by the test hook" in stderr
    assert "Traceback" in stderr
    assert not daemon.sock.exists()
    # Its upstream does not outlive it (the guardian, L4).
    with trio.fail_after(STEP_TIMEOUT):
        await wait_until(lambda: not alive(upstream))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_requested_stop_exits_0(daemon_factory: DaemonFactory, signum: int) -> None:
    daemon = await daemon_factory()
    assert daemon.process is not None
    daemon.process.send_signal(signum)
    with trio.fail_after(DAEMON_STOP_TIMEOUT):
        assert await daemon.process.wait() == 0, daemon.output()


async def test_daemonctl_stop_exits_0(daemon_factory: DaemonFactory) -> None:
    daemon = await daemon_factory()
    assert await daemon.stop() == 0, daemon.output()
    assert log_records(daemon)[-1] == {**log_records(daemon)[-1], "exit_status": 0}


async def test_a_second_daemon_on_the_same_socket_exits_0(daemon_factory: DaemonFactory) -> None:
    daemon = await daemon_factory()
    with trio.fail_after(DAEMON_STOP_TIMEOUT):
        second = await trio.run_process(
            daemon.argv(), env=daemon.env, check=False, capture_stdout=True, capture_stderr=True
        )
    assert second.returncode == 0
    assert b"another daemon already serves" in second.stderr
    await still_serving(daemon)


async def test_an_http_endpoint_that_cannot_bind_exits_1(daemon_factory: DaemonFactory) -> None:
    pytest.importorskip("h11")
    daemon = await daemon_factory(start=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with trio.fail_after(DAEMON_STOP_TIMEOUT):
            done = await trio.run_process(
                [*daemon.argv(), "--http", f"127.0.0.1:{port}"],
                env=daemon.env,
                check=False,
                capture_stdout=True,
                capture_stderr=True,
            )
    assert done.returncode == 1, done.stderr
    assert b"cannot serve HTTP" in done.stderr


# -- mcpool attach with stdin already closed -------------------------------------------------------


@pytest.mark.parametrize("closed", ["<&-", "<&- >&-"])
async def test_attach_with_stdin_closed_ends_at_once_and_leaks_no_session(
    daemon_factory: DaemonFactory, closed: str
) -> None:
    daemon = await daemon_factory({"fake": fake_server()})
    args = attach_args(daemon.sock, [daemon.config_path], "closed-stdin")
    script = f'exec "$@" {closed}'
    with trio.fail_after(ATTACH_TIMEOUT):
        done = await trio.run_process(
            ["sh", "-c", script, "sh", sys.executable, *args],
            env={**os.environ, **daemon.attach_env()},
            check=False,
            capture_stdout=True,
            capture_stderr=True,
        )
    assert done.returncode == 0, done.stderr
    with trio.fail_after(STEP_TIMEOUT):
        await wait_until(lambda: _no_sessions(daemon))
    messages = [r["msg"] for r in log_records(daemon)]
    assert messages.count("session attached") == messages.count("session detached") == 1
    await still_serving(daemon)
