"""The daemon stays reachable: found without XDG_RUNTIME_DIR (issue 13 point 2), its socket put
back when removed, and `daemonctl` let in at the open-file limit (issue 12 item 14)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio
from mcp import ClientSession, StdioServerParameters, stdio_client

from mcpool.daemon._listener import SOCKET_CHECK_INTERVAL
from mcpool.daemon._paths import RUN_USER_BASE_ENV

from .harness import (
    ATTACH_TIMEOUT,
    DaemonFactory,
    RawSocketClient,
    daemonctl_argv,
    fake_server,
    kill_leftovers,
    raw_socket_client,
    run_daemonctl,
    write_settings,
)
from .support import call_text, wait_until

# A removed socket is back within one check interval; two more absorb a loaded machine.
RECREATE_TIMEOUT = SOCKET_CHECK_INTERVAL * 3
# `daemonctl start` spawns a cold daemon (imports, settings, bind).
START_TIMEOUT = 20.0


async def daemonctl(env: dict[str, str], *args: str) -> str:
    """`daemonctl ARGS` without --socket: the socket is whatever its environment finds."""
    argv = daemonctl_argv("-", *args)
    del argv[argv.index("--socket") : argv.index("--socket") + 2]
    with trio.fail_after(START_TIMEOUT):
        done = await trio.run_process(argv, env=env, capture_stdout=True, capture_stderr=True)
    return done.stdout.decode()


def connects(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


async def test_a_removed_socket_and_its_folder_are_put_back(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    folder = daemon.sock.parent
    os.unlink(daemon.sock)
    assert not connects(daemon.sock)
    with trio.fail_after(RECREATE_TIMEOUT):
        await wait_until(lambda: connects(daemon.sock))
    assert (await daemon.ctl("status"))["pid"] == daemon.pid

    shutil.rmtree(folder)  # a tmp cleaner, or `rm -r`: the lock file goes too
    with trio.fail_after(RECREATE_TIMEOUT):
        await wait_until(lambda: connects(daemon.sock))
    assert folder.stat().st_mode & 0o777 == 0o700
    assert (folder / "daemon.sock.lock").exists()
    assert (await daemon.ctl("status"))["pid"] == daemon.pid
    log = daemon.log_path.read_text()
    assert f"the socket {daemon.sock} was removed; re-created it" in log
    assert log.count("re-created it") == 2


async def test_daemonctl_gets_in_at_the_open_file_limit(daemon_factory: DaemonFactory) -> None:
    daemon = await daemon_factory()
    await daemon.ctl("status")  # whatever a status call opens once is open now
    fd_dir = f"/proc/{daemon.pid}/fd"
    open_fds = [int(name) for name in os.listdir(fd_dir)]
    # No fd number left free at or above the highest in use, then the gaps below filled.
    limit = max(open_fds) + 1
    resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE, (limit, limit))
    async with AsyncExitStack() as stack:
        # Counted again each time: an fd the daemon had open for a moment leaves a gap.
        while len(os.listdir(fd_dir)) < limit:
            filler: RawSocketClient = await stack.enter_async_context(
                raw_socket_client(daemon.sock)
            )
            # Answered, so accepted: the daemon holds one more fd.
            assert "result" in await filler.request("mcpool/admin/status")
        # Without a reserve the connection waits in the backlog and daemonctl times out.
        done = await run_daemonctl(daemon.sock, "status", "--json", env=daemon.env)
        assert json.loads(done.stdout)["pid"] == daemon.pid
        # The reserve is for admin calls: a session gets a clear refusal, not a half-open one.
        async with raw_socket_client(daemon.sock) as late:
            params = {"sources": [], "cwd": None, "name": "late"}
            refused = await late.request("mcpool/attach", params)
        assert refused["error"]["message"] == "The daemon is at its open-file limit", refused
        assert f"RLIMIT_NOFILE is {limit}" in refused["error"]["data"]["reason"]
        # Each time, the reserve was taken back when the connection ended.
        done = await run_daemonctl(daemon.sock, "status", "--json", env=daemon.env)
        assert json.loads(done.stdout)["pid"] == daemon.pid
    assert "the fd reserve lets one admin connection in" in daemon.log_path.read_text()


@pytest.fixture
def run_user_base() -> Iterator[Path]:
    """A stand-in for /run/user holding our runtime folder (creating /run/user/<uid> itself
    would change the machine for every other test)."""
    base = Path(tempfile.mkdtemp(prefix="mcpr", dir="/tmp"))
    (base / str(os.geteuid())).mkdir(mode=0o700)
    yield base
    shutil.rmtree(base, ignore_errors=True)


async def test_a_client_that_drops_xdg_runtime_dir_reaches_the_same_daemon(
    run_user_base: Path, tmp_path: Path
) -> None:
    runtime = run_user_base / str(os.geteuid())
    sock = runtime / "mcpool" / "daemon.sock"
    home = tmp_path / "home"
    home.mkdir()
    shell_env = {k: v for k, v in os.environ.items() if not k.startswith(("MCPOOL_", "XDG_"))}
    # The user's shell has XDG_RUNTIME_DIR; the client below passes a bare environment.
    shell_env.update(HOME=str(home), XDG_RUNTIME_DIR=str(runtime))
    shell_env[RUN_USER_BASE_ENV] = str(run_user_base)
    settings = write_settings(tmp_path / "settings.json", {"fake": fake_server()})
    try:
        # The user's own `daemonctl`, no --socket: it finds the runtime folder by XDG_RUNTIME_DIR.
        started = await daemonctl(shell_env, "start", "--json")
        assert json.loads(started)["socket"] == str(sock)
        # What the SDK's default environment passes (Codex passes less): no XDG_RUNTIME_DIR.
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "mcpool", "attach", "--settings", str(settings), "--name", "bare"],
            env={"HOME": str(home), RUN_USER_BASE_ENV: str(run_user_base)},
            cwd=tmp_path,
        )
        async with (
            stdio_client(params) as (read, write),
            ClientSession(read, write) as session,
        ):
            with trio.fail_after(ATTACH_TIMEOUT):
                await session.initialize()
            assert await call_text(session, "fake__echo", {"text": "hi"}) == "hi"
            # One daemon: the bridge's session is on the one the user's daemonctl sees.
            sessions = json.loads(await daemonctl(shell_env, "sessions", "--json"))
            assert [s["name"] for s in sessions] == ["bare"]
        await daemonctl(shell_env, "stop")
    finally:
        kill_leftovers([], [str(run_user_base), str(tmp_path)])
