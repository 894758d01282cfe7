"""The guardian: kills upstream process groups when the daemon dies, even by SIGKILL (L4).

A tiny stdlib-only process started with the daemon (and again if it dies: `Guardian.watch`).
The daemon writes `+PGID` / `-PGID` lines to its stdin as upstream groups come and go. When that
pipe reaches end of file the daemon is gone (however it died), and the guardian sends SIGTERM,
then SIGKILL, to every group still registered, and to every process that left one.

PR_SET_PDEATHSIG is no substitute: it fires when the *thread* that forked exits, and trio forks
from worker threads that come and go; nor does it reach grandchildren (`npx` -> `node`).

Escaped descendants. A process group is what one `killpg` reaches, and an upstream's descendant
can leave it: setsid() or setpgid() (a server that daemonizes a helper). Such a process is
still found, by two means that need nothing while the daemon runs (no polling, no timer):
- Its tree: while it is the child (or grandchild) of its upstream, it is in the tree read from
  /proc/<pid>/task/<tid>/children (`escaped_descendants`). The daemon walks it when it closes
  the entry (pool/_upstream.py), first before stdin closes (a server that exits on end of file
  hands its children to init); the guardian walks every upstream's when the daemon died.
- Its environment: every stdio upstream's carries `MCPOOL_UPSTREAM=<daemon pid>` and
  `MCPOOL_UPSTREAM_ID=<daemon pid>.<n>`, one n per process started (pool/_environ.py), and what
  it starts inherits them. An orphan (a double fork whose middle process exited, or anything
  an upstream left when it exited or crashed) has lost the tree but kept those: the daemon
  reads every process's initial environment once when it closes an entry, in a worker thread,
  for that upstream's id; the guardian once when the daemon is gone, for the daemon's pid
  (`marked_processes`: /proc/<pid>/environ, readable only for our own processes, which are the
  only ones ours to end).
What escapes both: a process that left the group and its upstream's tree and dropped the
inherited environment.
Each one found is held by a pidfd (`ProcessSet`), so a signal never reaches another process
that reused its number.
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
# An upstream's tree is walked this far at most: a fork bomb must not make a close unbounded.
MAX_DESCENDANTS = 1024
# The mark every stdio upstream's environment carries (pool/_environ.py UPSTREAM_MARKER); spelled
# here because the guardian script imports nothing of the package.
UPSTREAM_MARKER = b"MCPOOL_UPSTREAM"
# Between checks whether the processes signalled at the daemon's death are gone.
KILL_POLL_INTERVAL = 0.05


class ProcessSet:
    """Processes held by pidfd (by pid where there are no pidfds): a signal reaches the very
    process that was added, never one that reused its number; `close` when done."""

    def __init__(self) -> None:
        self._held: dict[int, int] = {}  # pid -> pidfd, or -1
        self._closed = False

    def __len__(self) -> int:
        return len(self._held)

    @property
    def pidfds(self) -> list[int]:
        return [fd for fd in self._held.values() if fd >= 0]

    def add(self, pid: int) -> None:
        if pid in self._held or self._closed:
            return
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return  # already gone
        except (AttributeError, OSError):
            fd = -1  # no pidfds here: the pid, as killpg has it
        self._held[pid] = fd

    def signal(self, signum: int) -> None:
        for pid, fd in self._held.items():
            with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                if fd >= 0:
                    signal.pidfd_send_signal(fd, signum)
                else:
                    os.kill(pid, signum)

    def alive(self) -> bool:
        """Whether any of them has not exited yet (a zombie has)."""
        import select

        for pid, fd in self._held.items():
            if fd >= 0:
                poller = select.poll()  # a pidfd reads as ready once its process has exited
                poller.register(fd, select.POLLIN)
                if not poller.poll(0):
                    return True
            elif _running(pid):
                return True
        return False

    def close(self) -> None:
        """Let go of every pidfd; what is added afterwards is not held (nor signalled)."""
        self._closed = True
        held, self._held = self._held, {}
        for fd in held.values():
            if fd >= 0:
                os.close(fd)


def _stat_fields(pid: int) -> list[bytes] | None:
    """/proc/<pid>/stat after the command's closing parenthesis: state, ppid, pgrp, ..."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()
    except OSError:
        return None


def _running(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in (b"Z", b"X")


def descendants(pid: int, limit: int = MAX_DESCENDANTS) -> list[int]:
    """Every descendant of `pid` alive now, from /proc/<pid>/task/<tid>/children (each thread
    lists the children it forked); [] where /proc has no such files."""
    found: list[int] = []
    seen = {pid}
    stack = [pid]
    while stack and len(found) < limit:
        parent = stack.pop()
        try:
            tids = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue  # gone meanwhile
        for tid in tids:
            try:
                with open(f"/proc/{parent}/task/{tid}/children", "rb") as f:
                    children = f.read().split()
            except OSError:
                continue
            for raw in children:
                child = int(raw)
                if child not in seen and len(found) < limit:
                    seen.add(child)
                    found.append(child)
                    stack.append(child)
    return found


def escaped_descendants(group: int, into: ProcessSet) -> None:
    """Add to `into` the descendants of the group's leader (pid `group`) that left its group:
    what `killpg(group)` would miss."""
    for pid in descendants(group):
        fields = _stat_fields(pid)
        if fields is not None and int(fields[2]) != group:
            into.add(pid)


def mark(name: bytes | str, value: str) -> bytes:
    """The `NAME=value` entry `marked_processes` looks for."""
    return (name.encode() if isinstance(name, str) else name) + b"=" + value.encode()


def marked_processes(entry: bytes, groups: frozenset[int] = frozenset()) -> list[int]:
    """Every process (this one and those in `groups` aside: killpg has them) whose initial
    environment holds `entry` (`mark(...)`): what an upstream, or every upstream of a daemon,
    started. One read per process; other users' cannot be read, and are not ours to end."""
    wanted = b"\0" + entry + b"\0"
    me = os.getpid()
    found: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found  # no /proc here: nothing to find
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = b"\0" + f.read() + b"\0"
        except OSError:
            continue
        if wanted in environ:
            fields = _stat_fields(int(name))
            if fields is not None and int(fields[2]) not in groups:
                found.append(int(name))
    return found


def _main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal ^C is for the daemon, not for us
    daemon_pid = int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid()
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
    _kill_all(groups, daemon_pid)


def _kill_all(groups: set[int], daemon_pid: int) -> None:
    """SIGTERM every group and every process that left one, wait, SIGKILL what is left."""
    escaped = ProcessSet()
    # First, while the upstreams still run (nobody has signalled them yet): their trees.
    for pgid in groups:
        escaped_descendants(pgid, escaped)
    for pid in marked_processes(mark(UPSTREAM_MARKER, str(daemon_pid)), frozenset(groups)):
        escaped.add(pid)
    alive = set()
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGTERM)
            alive.add(pgid)
        except (ProcessLookupError, PermissionError):
            pass
    escaped.signal(signal.SIGTERM)
    deadline = time.monotonic() + TERM_GRACE
    while (alive or escaped.alive()) and time.monotonic() < deadline:
        time.sleep(KILL_POLL_INTERVAL)
        for pgid in list(alive):
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                alive.discard(pgid)
    for pgid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    escaped.signal(signal.SIGKILL)
    escaped.close()


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
                [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid())],
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
