"""The daemon's listening socket: put back when removed, given up to a daemon that took over."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path
from typing import Any

import trio
import trio.testing

from mcpool.daemon._listener import (
    SOCKET_CHECK_INTERVAL,
    FdReserve,
    ListenSocket,
    SocketState,
    socket_state,
    take_lock,
)
from mcpool.daemon._paths import lock_path, prepare_socket_dir


class Recorder:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []
        self.stopped: list[str] = []

    def log(self, level: str, message: str, **fields: Any) -> None:
        self.lines.append((level, message))

    def stop(self, reason: str) -> None:
        self.stopped.append(reason)


def test_socket_state_compares_the_bound_inode() -> None:
    st = os.lstat("/")
    assert socket_state((st.st_dev, st.st_ino), st) is SocketState.OURS
    assert socket_state((st.st_dev, st.st_ino + 1), st) is SocketState.REPLACED
    assert socket_state((st.st_dev, st.st_ino), None) is SocketState.GONE


def started(sock_dir: Path, rec: Recorder) -> ListenSocket:
    path = sock_dir / "run" / "daemon.sock"
    prepare_socket_dir(path)
    lock = take_lock(str(path))
    assert lock is not None
    listen = ListenSocket(str(path), lock, rec.log)
    listen.bind()
    return listen


def connects(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


async def test_a_removed_socket_and_folder_are_put_back(
    sock_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rec = Recorder()
    listen = started(sock_dir, rec)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listen.run, rec.stop)
            os.unlink(listen.path)
            await trio.sleep(SOCKET_CHECK_INTERVAL * 1.5)
            assert listen.is_ours()
            assert connects(listen.path)
            assert rec.lines[-1] == (
                "warning",
                f"the socket {listen.path} was removed; re-created it",
            )

            # The whole folder, lock file included: a new folder (0700) and a new lock held.
            old_lock = listen.lock_fd
            shutil.rmtree(sock_dir / "run")
            await trio.sleep(SOCKET_CHECK_INTERVAL)
            assert listen.is_ours()
            assert (sock_dir / "run").stat().st_mode & 0o777 == 0o700
            assert listen.lock_fd != old_lock
            assert take_lock(listen.path) is None  # we hold the new lock file
            assert connects(listen.path)
            assert rec.stopped == []
            nursery.cancel_scope.cancel()
    finally:
        listen.close()


async def test_a_daemon_that_took_over_the_path_keeps_it(
    sock_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rec = Recorder()
    listen = started(sock_dir, rec)
    try:
        shutil.rmtree(sock_dir / "run")
        # Another daemon (a bridge started one) made the folder again and holds its lock.
        prepare_socket_dir(Path(listen.path))
        other = take_lock(listen.path)
        assert other is not None
        with trio.fail_after(SOCKET_CHECK_INTERVAL * 2):
            await listen.run(rec.stop)
        assert rec.stopped == ["another daemon serves the socket"]
        assert not os.path.lexists(listen.path)  # nothing of the other daemon's was touched
        assert lock_path(Path(listen.path)).exists()
        os.close(other)
    finally:
        listen.close()


async def test_an_unsafe_folder_in_its_place_is_never_used_and_reported_once(
    sock_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rec = Recorder()
    listen = started(sock_dir, rec)
    folder = sock_dir / "run"
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listen.run, rec.stop)
            shutil.rmtree(folder)
            folder.mkdir()
            folder.chmod(0o777)  # what another user could have put there meanwhile
            await trio.sleep(SOCKET_CHECK_INTERVAL * 5.5)  # half-way: never a tie with a check
            errors = [m for level, m in rec.lines if level == "error"]
            assert len(errors) == 1, rec.lines  # once, not every interval
            assert "mode 0777" in errors[0]
            assert str(folder) in errors[0]
            assert os.listdir(folder) == []  # no lock, no socket in it
            folder.chmod(0o700)
            await trio.sleep(SOCKET_CHECK_INTERVAL)
            assert listen.is_ours()
            assert rec.stopped == []
            nursery.cancel_scope.cancel()
    finally:
        listen.close()


def test_the_fd_reserve_frees_and_takes_back_its_fds() -> None:
    reserve = FdReserve(3)
    assert reserve.held == 3
    assert reserve.release() is True
    assert reserve.held == 0
    assert reserve.release() is False  # nothing left to free: the accept loop backs off
    reserve.refill()
    assert reserve.held == 3
    reserve.close()
