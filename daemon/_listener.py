"""The daemon's listening socket, kept reachable for the daemon's whole life.

Theory of operation. `ListenSocket` binds the socket in a folder that passed the trust check
(X3, `_paths.prepare_socket_dir`) and remembers the inode it bound. A tmp cleaner, a user's
`rm -r`, or a reinstall may remove the socket or its folder under a running daemon, which then
keeps running, unreachable: every new bridge starts a second daemon. So `run` looks at the path
every SOCKET_CHECK_INTERVAL (one `lstat`; an idle daemon wakes for nothing else) and, when the
inode is no longer the one it bound, re-creates the folder (with the same checks) and the socket,
and logs it. The flock that makes one daemon per socket lives in the same folder: when the lock
file went too, the daemon takes the new one; when another daemon already holds it (a bridge
started one meanwhile), that daemon serves the path now and this one stops.

`FdReserve` keeps a few spare fds so that an admin connection still gets in at the open-file
limit: an accept that fails with EMFILE releases them, the next connection is accepted with
their room (admin requests only) and the reserve is taken again when it ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Callable
from enum import Enum
from pathlib import Path

import trio

from . import _paths

LISTEN_BACKLOG = 128
# How often the daemon checks that its socket is still at its path: one lstat, so a removed
# socket is back within seconds while an idle daemon wakes at most once per interval.
SOCKET_CHECK_INTERVAL = 3.0
# Spare fds for one admin connection at the fd limit: its socket, plus the /proc files and
# folder that `status` reads (psutil), one at a time.
RESERVE_FDS = 4


class SocketState(Enum):
    OURS = "ours"  # the inode we bound is at the path
    GONE = "gone"  # nothing at the path, or its folder is gone
    REPLACED = "replaced"  # something else is at the path


def socket_state(bound: tuple[int, int] | None, found: os.stat_result | None) -> SocketState:
    """Whether the path still holds the socket we bound ((st_dev, st_ino)), from its lstat."""
    if found is None:
        return SocketState.GONE
    if bound is not None and (found.st_dev, found.st_ino) == bound:
        return SocketState.OURS
    return SocketState.REPLACED


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def take_lock(sock_path: str) -> int | None:
    """The flock that makes this the one daemon of `sock_path` (None: another holds it)."""
    lock_path = str(_paths.lock_path(Path(sock_path)))
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class ListenSocket:
    """The listening socket at `path`; `listener` is replaced when `run` re-creates it."""

    def __init__(self, path: str, lock_fd: int | None, log: Callable[..., None]) -> None:
        self.path = path
        self.lock_fd = lock_fd
        self.log = log
        self.listener: trio.socket.SocketType | None = None
        self._bound: tuple[int, int] | None = None
        self._closed = False
        self._last_problem: str | None = None

    def bind(self) -> trio.socket.SocketType:
        """Check (or create) the folder, then bind and listen. We hold the lock: any socket
        file left at the path is stale."""
        _paths.prepare_socket_dir(Path(self.path))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            raw.bind(self.path)
            found = os.lstat(self.path)
            raw.listen(LISTEN_BACKLOG)
        except BaseException:
            raw.close()
            raise
        finally:
            os.umask(old_umask)
        self._bound = (found.st_dev, found.st_ino)
        previous, self.listener = self.listener, trio.socket.from_stdlib_socket(raw)
        if previous is not None:
            previous.close()  # the accept loop moves to the new listener
        return self.listener

    def is_ours(self) -> bool:
        """Whether the path still holds the socket this daemon bound."""
        return socket_state(self._bound, _lstat(self.path)) is SocketState.OURS

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        if self.listener is not None:
            self.listener.close()

    async def run(self, stop: Callable[[str], None]) -> None:
        """Every SOCKET_CHECK_INTERVAL, put the socket back if it was removed (see the module
        docstring); `stop(reason)` when another daemon now serves the path."""
        while not self._closed:
            await trio.sleep(SOCKET_CHECK_INTERVAL)
            if self._closed:
                return
            state = socket_state(self._bound, _lstat(self.path))
            if state is SocketState.OURS:
                continue
            try:
                held = self._hold_lock()
                if held:
                    self.bind()
            except (OSError, _paths.UnsafeSocketPath) as exc:
                # Retried every interval; logged once per distinct problem, not every 3 s.
                if str(exc) != self._last_problem:
                    self._last_problem = str(exc)
                    self.log("error", f"cannot re-create the socket {self.path}: {exc}")
                continue
            if not held:
                self.log(
                    "warning",
                    f"the socket {self.path} was removed and another daemon now serves it; "
                    "this one stops",
                )
                stop("another daemon serves the socket")
                return
            self._last_problem = None
            what = "removed" if state is SocketState.GONE else "replaced"
            self.log("warning", f"the socket {self.path} was {what}; re-created it")

    def _hold_lock(self) -> bool:
        """Whether we (still, or again) hold the lock of this path, re-creating the folder and
        taking a new lock file when the old one was removed with the folder. Raises what stops
        it from knowing (an unsafe folder, no fd left): the caller retries next interval."""
        if self.lock_fd is not None:
            held = os.fstat(self.lock_fd)
            found = _lstat(str(_paths.lock_path(Path(self.path))))
            if found is not None and (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino):
                return True
        _paths.prepare_socket_dir(Path(self.path))
        fd = take_lock(self.path)
        if fd is None:
            return False
        if self.lock_fd is not None:
            os.close(self.lock_fd)
        self.lock_fd = fd
        return True


class FdReserve:
    """A few fds (on /dev/null) held back for an admin connection at the open-file limit."""

    def __init__(self, size: int = RESERVE_FDS) -> None:
        self.size = size
        self._fds: list[int] = []
        self.refill()

    @property
    def held(self) -> int:
        return len(self._fds)

    def refill(self) -> None:
        while len(self._fds) < self.size:
            try:
                self._fds.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            except OSError:
                return  # still at the limit: retried when the next connection ends

    def release(self) -> bool:
        """Free the reserve's fds; False when there was nothing to free."""
        if not self._fds:
            return False
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        return True

    def close(self) -> None:
        self.release()
