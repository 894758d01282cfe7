"""The guardian: kills upstream process groups when the daemon dies, even by SIGKILL (L4).

A tiny stdlib-only process started with the daemon (and again if it dies: `Guardian.watch`).
The daemon writes `+PGID` / `-PGID` lines to its stdin as upstream groups come and go. When that
pipe reaches end of file the daemon is gone (however it died), and the guardian sends SIGTERM,
then SIGKILL, to every group still registered.

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
from collections.abc import Callable

TERM_GRACE = 1.0  # upstreams get this long after SIGTERM before SIGKILL
# A guardian that keeps dying at once is restarted at most this often (no fork storm).
GUARDIAN_RESTART_INTERVAL = 1.0
# Without pidfds (not Linux), how often the daemon looks whether its guardian still runs.
GUARDIAN_POLL_INTERVAL = 1.0


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
    """The daemon's side: start the guardian, tell it about process groups, and keep one running.

    The groups are remembered here too, so a guardian that died (killed, OOM) is replaced by one
    that is told every group still registered (`watch`): the promise holds for the daemon's life.
    """

    def __init__(self) -> None:
        self._groups: set[int] = set()
        self._closed = False
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        r, w = os.pipe()
        try:
            self._proc = subprocess.Popen(
                # Run as a script, not `-m`: importing the package would load trio for nothing.
                [sys.executable, "-I", os.path.abspath(__file__)],
                stdin=r,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        self._fd = w
        self.pid = self._proc.pid
        if self._groups:
            self._send("".join(f"+{pgid}\n" for pgid in sorted(self._groups)))

    def register(self, pgid: int) -> None:
        self._groups.add(pgid)
        self._send(f"+{pgid}\n")

    def unregister(self, pgid: int) -> None:
        self._groups.discard(pgid)
        self._send(f"-{pgid}\n")

    def _send(self, line: str) -> None:
        # Lines are tiny and the guardian reads continuously: a blocking write cannot stall.
        # A dead guardian's pipe fails (EPIPE): `watch` starts a new one, told every group.
        with contextlib.suppress(OSError):
            os.write(self._fd, line.encode())

    def _close_pipe(self) -> None:
        fd, self._fd = self._fd, -1  # never close a number the kernel may have handed out again
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    async def watch(self, log: Callable[..., None]) -> None:
        """Wait for the guardian to die; log it and start a new one, for as long as we run."""
        import trio  # the guardian script itself must not import trio

        last_start = trio.current_time()
        while not self._closed:
            await _wait_exit(self._proc)
            if self._closed:
                return
            status = self._proc.wait()
            old = self.pid
            await trio.sleep_until(last_start + GUARDIAN_RESTART_INTERVAL)
            self._close_pipe()
            try:
                self._start()
            except OSError as exc:
                log(
                    "error",
                    f"the guardian process {old} exited (status {status}) and a new one could "
                    f"not be started: {exc}; upstreams would outlive a daemon crash",
                    pid=old,
                )
                # Try again after the interval; `_proc` still names the reaped process.
                last_start = trio.current_time()
                continue
            last_start = trio.current_time()
            self.restarts += 1
            log(
                "warning",
                f"the guardian process {old} exited (status {status}); started a new one "
                f"({self.pid}) and told it {len(self._groups)} upstream process group(s)",
                pid=old,
                new_pid=self.pid,
                groups=len(self._groups),
            )

    def close(self) -> None:
        """Normal shutdown: every group was already closed; let the guardian exit."""
        self._closed = True
        self._close_pipe()
        try:
            self._proc.wait(timeout=TERM_GRACE + 1.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()


async def _wait_exit(proc: subprocess.Popen[bytes]) -> None:
    """Until `proc` exits (not reaped): a pidfd where there is one, else a slow poll."""
    import trio

    if proc.poll() is not None:
        return
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        # No event exists for another process's exit without a pidfd: poll.
        while proc.poll() is None:  # noqa: ASYNC110
            await trio.sleep(GUARDIAN_POLL_INTERVAL)
        return
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)


if __name__ == "__main__":
    _main()
