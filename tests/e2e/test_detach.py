"""X6: the daemon belongs to nobody's process tree (issue 26 item 1).

Whoever starts it (`mcpool attach` on a cold start, `daemonctl start`), the daemon runs detached:
its parent is not the starter, it has a session and process group of its own, its stdio is
/dev/null and its 0600 stderr file, its cwd "/", and it holds none of the starter's descriptors.
A client that ends its MCP server as Copilot CLI and opencode do (SIGTERM to the server's whole
process tree by parent pid, to its process group and to its session) ends only its own bridge:
the daemon, the shared upstream and another client's session carry on. A daemon that cannot
start is still reported by its starter, with its exit status or reason and its stderr file.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
import trio

from .harness import (
    REPO,
    attach_args,
    attached_session,
    daemonctl_argv,
    daemonctl_json,
    fake_server,
    kill_leftovers,
    write_settings,
)
from .support import alive, call_text, wait_until

STAND_IN = REPO / "tests" / "e2e" / "tree_killing_client.py"
# A cold daemon start plus one attach and one call; a loaded machine included.
STEP = 20.0
# How many starters race for one socket.
RACERS = 4


class Place:
    """One test's socket, settings and environment, with no daemon running yet."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self.sock_dir = Path(tempfile.mkdtemp(prefix="mcpd", dir="/tmp"))
        self.sock = self.sock_dir / "daemon.sock"
        self.settings = write_settings(tmp_path / "settings.json", {"fake": fake_server()})
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("MCPOOL_")},
            "XDG_STATE_HOME": str(tmp_path / "state"),
            "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
        }
        self.stderr_file = tmp_path / "state" / "mcpool" / "daemon.stderr"

    def attach_argv(self, name: str) -> list[str]:
        return [sys.executable, *attach_args(self.sock, [self.settings], name)]

    async def daemon_pid(self) -> int:
        status = await daemonctl_json(self.sock, "status", env=self.env)
        return int(status["pid"])

    def cleanup(self) -> None:
        pids = [p.pid for p in psutil.process_iter() if _mentions(p, str(self.sock))]
        kill_leftovers(pids, [str(self.sock_dir), str(self.root)])
        shutil.rmtree(self.sock_dir, ignore_errors=True)


def _mentions(proc: psutil.Process, needle: str) -> bool:
    try:
        return needle in " ".join(proc.cmdline())
    except psutil.Error:
        return False


@pytest.fixture
async def place(tmp_path: Path) -> AsyncIterator[Place]:
    where = Place(tmp_path)
    try:
        yield where
    finally:
        where.cleanup()


def ancestors(pid: int) -> list[int]:
    """The parent chain of `pid` up to (not including) pid 0."""
    chain = []
    proc: psutil.Process | None = psutil.Process(pid)
    while proc is not None and proc.ppid() != 0:
        chain.append(proc.ppid())
        proc = proc.parent()
    return chain


async def read_json_line(stream: trio.abc.ReceiveStream, buf: bytearray) -> dict[str, object]:
    with trio.fail_after(STEP):
        while b"\n" not in buf:
            chunk = await stream.receive_some()
            assert chunk, "the client stand-in ended early"
            buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    value = json.loads(line)
    assert isinstance(value, dict), value
    return value


async def test_a_client_killing_its_servers_tree_group_and_session_leaves_the_daemon_alone(
    place: Place,
) -> None:
    # The client stand-in runs in a session (and group) of its own, like a client launched from
    # a terminal: its group and session kills then reach nothing of the test's.
    stand_in = await trio.lowlevel.open_process(
        [sys.executable, str(STAND_IN), *place.attach_argv("tree-killer")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=place.env,
        start_new_session=True,
    )
    assert stand_in.stdin is not None and stand_in.stdout is not None
    buf = bytearray()
    try:
        # Its `mcpool attach` found no daemon and started one (a cold start).
        first = await read_json_line(stand_in.stdout, buf)
        server, upstream = int(first["server"]), int(first["upstream"])  # type: ignore[call-overload]
        daemon = await place.daemon_pid()
        lineage = ancestors(daemon)
        # psutil handles remember the start time: a reused pid is not taken for the survivor.
        daemon_proc, upstream_proc = psutil.Process(daemon), psutil.Process(upstream)
        # Another client's session on the same daemon, sharing the same upstream process.
        async with attached_session(
            place.sock, [place.settings], "bystander", env=place.env
        ) as bystander:
            assert int(await call_text(bystander, "fake__pid")) == upstream

            await stand_in.stdin.send_all(b"exit\n")
            done = await read_json_line(stand_in.stdout, buf)
            with trio.fail_after(STEP):
                assert await stand_in.wait() == 0
            killed = set(done["killed"])  # type: ignore[call-overload]
            # The stand-in killed its server's tree and reaped the server.
            assert server in killed and not psutil.pid_exists(server)

            # The daemon and the shared upstream are the same processes, still running, and
            # the bystander's session still works.
            assert daemon not in killed and upstream not in killed, killed
            assert alive(daemon_proc), "the daemon died with the client"
            assert alive(upstream_proc), "the shared upstream died with the client"
            assert int(await call_text(bystander, "fake__pid")) == upstream
            assert await place.daemon_pid() == daemon
    finally:
        if stand_in.returncode is None:
            stand_in.kill()
            await stand_in.wait()
    # Recorded before the kill: the daemon was never in the stand-in's tree, group or session.
    assert stand_in.pid not in lineage and server not in lineage, lineage
    assert os.getpgid(daemon) not in (stand_in.pid, os.getpgid(os.getpid()))
    assert os.getsid(daemon) not in (stand_in.pid, os.getsid(os.getpid()))


async def test_daemonctl_start_runs_the_daemon_detached_with_nothing_of_its_starter(
    place: Place,
) -> None:
    # A descriptor the starter leaves open (no close-on-exec), as a client may: never the
    # daemon's.
    leaked_r, leaked_w = os.pipe()
    os.set_inheritable(leaked_w, True)
    try:
        starter = await trio.lowlevel.open_process(
            daemonctl_argv(place.sock, "start", "--json"),
            env=place.env,
            stdout=subprocess.PIPE,
            pass_fds=(leaked_w,),
            start_new_session=True,
        )
    finally:
        os.close(leaked_w)
    assert starter.stdout is not None
    out = bytearray()
    with trio.fail_after(STEP):
        while chunk := await starter.stdout.receive_some():
            out += chunk
        assert await starter.wait() == 0
    result = json.loads(out)
    assert result["started"] is True
    pid = int(result["pid"])
    daemon = psutil.Process(pid)
    assert starter.pid not in ancestors(pid)
    # Its own session and group: not the starter's (whose session id is its pid) nor the test's.
    assert os.getsid(pid) not in (starter.pid, os.getsid(0))
    assert os.getpgid(pid) not in (starter.pid, os.getpgid(0))
    assert os.getsid(pid) == os.getpgid(pid)
    assert daemon.cwd() == "/"
    assert os.readlink(f"/proc/{pid}/fd/0") == os.devnull
    assert os.readlink(f"/proc/{pid}/fd/1") == os.devnull
    assert os.readlink(f"/proc/{pid}/fd/2") == str(place.stderr_file)
    assert stat.S_IMODE(place.stderr_file.stat().st_mode) == 0o600
    # The pipe's write end went nowhere: with the starter gone, its read end sees end of file.
    os.set_blocking(leaked_r, False)
    try:
        assert os.read(leaked_r, 1) == b""
    finally:
        os.close(leaked_r)
    # A second start finds it running.
    again = await daemonctl_json(place.sock, "start", env=place.env)
    assert again["started"] is False and again["pid"] == pid


async def test_racing_starts_have_one_winner_and_every_starter_names_it(place: Place) -> None:
    argv = daemonctl_argv(place.sock, "start", "--json")
    results: list[subprocess.CompletedProcess[bytes]] = []

    async def start() -> None:
        done = await trio.run_process(
            argv, env=place.env, capture_stdout=True, capture_stderr=True, check=False
        )
        results.append(done)

    with trio.fail_after(STEP):
        async with trio.open_nursery() as nursery:
            for _ in range(RACERS):
                nursery.start_soon(start)
    assert [done.returncode for done in results] == [0] * RACERS, [r.stderr for r in results]
    answers = [json.loads(done.stdout) for done in results]
    pids = {answer["pid"] for answer in answers}
    assert len(pids) == 1, answers
    # Exactly one starter's daemon serves; the others lost the race (or came late) and say so.
    assert sum(answer["started"] for answer in answers) == 1, answers
    winner = pids.pop()
    with trio.fail_after(STEP):
        await wait_until(
            lambda: [p.pid for p in psutil.process_iter() if _serves(p, place.sock)] == [winner]
        )


def _serves(proc: psutil.Process, sock: Path) -> bool:
    try:
        cmd = proc.cmdline()
        return "daemon" in cmd and str(sock) in cmd and alive(proc)
    except psutil.Error:
        return False


async def test_a_daemon_that_cannot_start_is_reported_with_its_status_and_reason(
    place: Place,
) -> None:
    # The socket's folder cannot be made (its parent is missing): the daemon's own refusal.
    missing = place.sock_dir / "no" / "such" / "daemon.sock"
    with trio.fail_after(STEP):
        done = await trio.run_process(
            [sys.executable, *attach_args(missing, [place.settings], "x")],
            env=place.env,
            stdin=subprocess.DEVNULL,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 1
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert "the daemon failed to start (exit status 1: cannot create the socket folder" in lines[0]
    assert lines[0].endswith(f"see {place.stderr_file}")

    # A daemon that dies before its `main` runs (a broken install): the reason comes from what
    # it wrote to its stderr file.
    broken = place.root / "broken"
    broken.mkdir()
    (broken / "trio.py").write_text("raise ImportError('this trio is broken')\n")
    with trio.fail_after(STEP):
        done = await trio.run_process(
            [sys.executable, *attach_args(place.sock, [place.settings], "x")],
            env={**place.env, "PYTHONPATH": str(broken)},
            stdin=subprocess.DEVNULL,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 1
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert "ImportError: this trio is broken" in lines[0]
    assert lines[0].endswith(f"see {place.stderr_file}")
