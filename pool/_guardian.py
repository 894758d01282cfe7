"""The guardian: kills upstream process groups when the daemon dies, even by SIGKILL (L4).

A tiny stdlib-only process started once per daemon. The daemon writes `+PGID` / `-PGID` lines to
its stdin as upstream groups come and go. When that pipe reaches end of file the daemon is gone
(however it died), and the guardian sends SIGTERM, then SIGKILL, to every group still registered.

PR_SET_PDEATHSIG is no substitute: it fires when the *thread* that forked exits, and trio forks
from worker threads that come and go; nor does it reach grandchildren (`npx` -> `node`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

TERM_GRACE = 1.0  # upstreams get this long after SIGTERM before SIGKILL


def _main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal ^C is for the daemon, not for us
    groups: set[int] = set()
    buf = b""
    while True:
        try:
            data = os.read(0, 4096)
        except InterruptedError:
            continue
        if not data:
            break
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line[:1] == b"+":
                groups.add(int(line[1:]))
            elif line[:1] == b"-":
                groups.discard(int(line[1:]))
    _kill_all(groups)


def _kill_all(groups: set[int]) -> None:
    alive = set()
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGTERM)
            alive.add(pgid)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + TERM_GRACE
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        for pgid in list(alive):
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                alive.discard(pgid)
    for pgid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


class Guardian:
    """The daemon's side: start the guardian and tell it about process groups."""

    def __init__(self) -> None:
        r, w = os.pipe()
        self._proc = subprocess.Popen(
            # Run as a script, not `-m`: importing the package would load trio for nothing.
            [sys.executable, "-I", os.path.abspath(__file__)],
            stdin=r,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        os.close(r)
        self._fd = w
        self.pid = self._proc.pid

    def register(self, pgid: int) -> None:
        self._send(f"+{pgid}\n")

    def unregister(self, pgid: int) -> None:
        self._send(f"-{pgid}\n")

    def _send(self, line: str) -> None:
        # Lines are tiny and the guardian reads continuously: a blocking write cannot stall.
        with contextlib.suppress(OSError):
            os.write(self._fd, line.encode())

    def close(self) -> None:
        """Normal shutdown: every group was already closed; let the guardian exit."""
        with contextlib.suppress(OSError):
            os.close(self._fd)
        try:
            self._proc.wait(timeout=TERM_GRACE + 1.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()


if __name__ == "__main__":
    _main()
