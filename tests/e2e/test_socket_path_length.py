"""A socket path longer than a Unix socket address holds (issue 26 item 7): `mcpool attach`,
`mcpool daemon` and `daemonctl` each say so in one line naming the limit and the path, exit 1,
and start nothing; a path exactly at the limit still works."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from mcpool.daemon._paths import MAX_SOCKET_PATH

from .harness import attach_args, daemonctl_argv, daemonctl_json, kill_leftovers, write_settings

# One interpreter start and a few syscalls (the daemon imports trio first).
RUN_TIMEOUT = 20.0


@pytest.fixture
def deep_folder() -> Iterator[Path]:
    """A private folder under /tmp whose path leaves room for a socket name of any length."""
    top = Path(tempfile.mkdtemp(prefix="mcpl", dir="/tmp"))
    folder = top / ("d" * 40)
    folder.mkdir(mode=0o700)
    try:
        yield folder
    finally:
        kill_leftovers([], [str(top)])
        shutil.rmtree(top, ignore_errors=True)


def socket_of_length(folder: Path, size: int) -> Path:
    name = "s" * (size - len(str(folder)) - 1)
    path = folder / name
    assert len(os.fsencode(path)) == size
    return path


def environment(tmp_path: Path) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("MCPOOL_")},
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }


@pytest.mark.parametrize("command", ["attach", "daemon", "daemonctl status", "daemonctl start"])
async def test_a_socket_path_too_long_is_one_line_naming_the_limit_and_the_path(
    command: str, deep_folder: Path, tmp_path: Path
) -> None:
    sock = socket_of_length(deep_folder, MAX_SOCKET_PATH + 1)
    settings = write_settings(tmp_path / "s.json", {})
    argv = {
        "attach": [sys.executable, *attach_args(sock, [settings], "x")],
        "daemon": [sys.executable, "-m", "mcpool", "daemon", "--socket", str(sock)],
        "daemonctl status": daemonctl_argv(sock, "status"),
        "daemonctl start": daemonctl_argv(sock, "start"),
    }[command]
    with trio.fail_after(RUN_TIMEOUT):
        done = await trio.run_process(
            argv,
            env=environment(tmp_path),
            stdin=subprocess.DEVNULL,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 1, done
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert f"at most {MAX_SOCKET_PATH} bytes" in lines[0]
    assert f"{sock} is {MAX_SOCKET_PATH + 1} bytes long" in lines[0]
    assert "Traceback" not in done.stderr.decode()
    # Nothing was started or created: no daemon, no socket, no stderr file of a started one.
    assert os.listdir(deep_folder) == []
    assert not (tmp_path / "state" / "mcpool" / "daemon.stderr").exists()


async def test_a_socket_path_at_the_limit_serves(deep_folder: Path, tmp_path: Path) -> None:
    sock = socket_of_length(deep_folder, MAX_SOCKET_PATH)
    env = environment(tmp_path)
    started = await daemonctl_json(sock, "start", env=env)
    try:
        assert started["started"] is True
        status = await daemonctl_json(sock, "status", env=env)
        assert status["pid"] == started["pid"]
    finally:
        await daemonctl_json(sock, "stop", env=env)
