"""Starting the daemon detached (X6): it belongs to nobody's process tree.

Theory of operation. GitHub Copilot CLI and opencode end their MCP server by signalling its whole
process tree (every descendant by parent pid, and its process group): a daemon that a bridge
started as its child would die with that one client, and every other client's sessions with it.
So whoever starts a daemon (`mcpool attach` on a cold start, `daemonctl start`) does it here:

1. The starter forks. The child calls setsid(): a new session and process group, no controlling
   terminal. It forks again and exits at once; the starter reaps it. The grandchild, the daemon
   to be, is now an orphan: its parent is init (or the nearest subreaper), not the starter, from
   its first microseconds. It is the only member of that session and group, and not their
   leader, so it can never acquire a controlling terminal either.
2. The grandchild moves to "/" (a daemon outlives the folder it was started from, and `-m` puts
   the working directory first on sys.path), puts /dev/null on stdin and stdout and the 0600
   stderr file on stderr, closes every other descriptor it inherited (the client's), resets
   the signals a client may have ignored or blocked, and execs
   `python -m mcpool daemon --socket PATH --status-fd 3`.
3. The status pipe, fd 3 in the daemon: it writes one line and closes it, `serving PID` once its
   socket listens, or `exit STATUS REASON` when it ends before that (status 0: it lost the start
   race to another daemon, whose socket is on its way). End of file without a line: it died
   before it could say (a crash before `main`, a signal); the starter then quotes the last line
   it wrote to its stderr file. The exit status is not the starter's to collect any more (the
   daemon is not its child), so the daemon reports it itself.

The starter waits on that pipe (poll, no spin) instead of retrying the connect, and a starter
that dies meanwhile only closes the pipe's read end: the daemon's write then fails, ignored.

Stdlib only, no `subprocess`: the bridge imports this on a cold start, and one fork of a small
process is all it needs. The daemon's side is `StatusPipe`.
"""

import fcntl
import os
import stat
import sys

# `_signal`, not `signal`: the bridge's start-up (see _attach.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal
    from typing import NoReturn
else:
    import _signal

# The fd the daemon finds its status pipe on (its stdio is 0-2).
STATUS_FD = 3
# One status line is a few dozen bytes; the reason is cut to this.
MAX_REASON = 1000
MAX_STATUS_LINE = 4096
# Exit status of a grandchild whose exec failed (the shell's "command not found" convention).
EXEC_FAILED = 127
# How much of the stderr file's new end is read for its last line.
STDERR_TAIL = 4096


class StartOutcome:
    """What a starting daemon said on its status pipe."""

    __slots__ = ("pid", "reason", "status")

    def __init__(self, pid: int | None, status: int | None, reason: str) -> None:
        self.pid = pid  # set when it serves
        self.status = status  # its exit status when it ended before serving (None: unknown)
        self.reason = reason

    @property
    def serving(self) -> bool:
        return self.pid is not None


def parse_status(line: bytes) -> StartOutcome | None:
    """A status line's outcome; None for anything else (an empty pipe end is the caller's)."""
    kind, _, rest = line.decode("utf-8", "replace").partition(" ")
    if kind == "serving" and rest.isdigit():
        return StartOutcome(int(rest), None, "")
    if kind == "exit":
        status, _, reason = rest.partition(" ")
        if status.lstrip("-").isdigit():
            return StartOutcome(None, int(status), reason.strip())
    return None


class DaemonStart:
    """A daemon this process started: read its status pipe (`wait`), then `close`."""

    def __init__(self, status_fd: int, stderr_path: str, stderr_offset: int) -> None:
        self._fd = status_fd
        self._buf = b""
        self.stderr_path = stderr_path
        self._stderr_offset = stderr_offset
        self.outcome: StartOutcome | None = None

    @property
    def pid(self) -> int | None:
        """The daemon's pid once it said it serves."""
        return self.outcome.pid if self.outcome is not None else None

    def wait(self, timeout: float) -> StartOutcome | None:
        """The outcome, waiting at most `timeout` seconds for it; None while it still starts."""
        if self.outcome is not None or self._fd < 0:
            return self.outcome
        import select  # a cold start only

        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        if not poller.poll(max(0, int(timeout * 1000))):
            return None
        try:
            data = os.read(self._fd, MAX_STATUS_LINE)
        except OSError:
            data = b""
        self._buf += data
        end = self._buf.find(b"\n")
        if end < 0 and data and len(self._buf) < MAX_STATUS_LINE:
            return None  # the rest of the line is on its way
        line = self._buf[:end] if end >= 0 else self._buf
        outcome = parse_status(line)
        if outcome is None:
            outcome = StartOutcome(None, None, self._last_stderr_line())
        self.outcome = outcome
        self.close()
        return outcome

    def _last_stderr_line(self) -> str:
        """The last line the daemon wrote to its stderr since we started it (a traceback's last
        line names the error), or a fixed reason when it wrote none."""
        try:
            with open(self.stderr_path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(max(self._stderr_offset, size - STDERR_TAIL))
                text = f.read(STDERR_TAIL).decode("utf-8", "replace")
        except OSError:
            text = ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if not lines:
            return "it exited or was killed before it could say why"
        return lines[-1][:MAX_REASON]

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def start_detached(sock_path: str, stderr_path: str, env: dict[str, str]) -> DaemonStart:
    """Start `mcpool daemon --socket sock_path` detached, in environment `env` (see the
    module docstring)."""
    from mcpool.daemon._files import open_private  # a cold start only

    argv = [sys.executable, "-m", "mcpool", "daemon", "--socket", sock_path]
    argv += ["--status-fd", str(STATUS_FD)]
    os.makedirs(os.path.dirname(stderr_path), mode=0o700, exist_ok=True)
    # The daemon's stderr can hold a traceback quoting settings: 0600, as its log.
    stderr_fd = open_private(stderr_path, os.O_WRONLY | os.O_APPEND)
    null_fd = read_fd = write_fd = -1
    try:
        offset = os.fstat(stderr_fd).st_size
        null_fd = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        read_fd, write_fd = os.pipe()  # both close-on-exec: only the daemon's dup is not
        child = os.fork()
        if child == 0:
            _become_daemon(argv, env, null_fd, stderr_fd, read_fd, write_fd)
    except BaseException:
        if read_fd >= 0:
            os.close(read_fd)
        raise
    finally:
        for fd in (stderr_fd, null_fd, write_fd):
            if fd >= 0:
                os.close(fd)
    # The intermediate child exits as soon as it has forked the daemon.
    try:  # noqa: SIM105 (contextlib: start-up time of the bridge)
        os.waitpid(child, 0)
    except ChildProcessError:
        pass  # SIGCHLD ignored (a client's choice, inherited): the kernel reaped it
    return DaemonStart(read_fd, stderr_path, offset)


def _become_daemon(
    argv: list[str],
    env: dict[str, str],
    null_fd: int,
    stderr_fd: int,
    read_fd: int,
    write_fd: int,
) -> "NoReturn":
    """In the forked child: setsid, fork again, and exec the daemon in the grandchild. Never
    returns: every way out is `os._exit` (the starter's own code must not run twice)."""
    status_fd = write_fd
    try:
        os.close(read_fd)
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        os.chdir("/")
        # Above the numbers they go to first: a starter whose stdio was closed may hold them there.
        null_fd, stderr_fd, status_fd = (
            fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, STATUS_FD + 1)
            for fd in (null_fd, stderr_fd, write_fd)
        )
        os.dup2(null_fd, 0)
        os.dup2(null_fd, 1)
        os.dup2(stderr_fd, 2)
        os.dup2(status_fd, STATUS_FD)  # dup2 makes the copy inheritable
        status_fd = STATUS_FD
        # Everything else the starter held (a client's descriptors without close-on-exec too).
        _close_from(STATUS_FD + 1)
        # What a client ignored or blocked for its server passes through exec: SIGCHLD ignored
        # would leave the daemon unable to wait for its upstreams, SIGTERM ignored unstoppable.
        for signum in range(1, _signal.NSIG):
            try:  # noqa: SIM105 (as above)
                _signal.signal(signum, _signal.SIG_DFL)
            except (OSError, ValueError):
                pass  # SIGKILL, SIGSTOP and the C library's own: not ours to set
        _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
        os.execve(argv[0], argv, env)
    except BaseException as exc:
        try:
            reason = f"cannot run {argv[0]}: {getattr(exc, 'strerror', None) or exc}"
            os.write(status_fd, _exit_line(EXEC_FAILED, reason))
        finally:
            os._exit(EXEC_FAILED)


def _close_from(lowest: int) -> None:
    """Close every descriptor from `lowest` up: those /proc lists (a loop to the fd limit can
    be a million closes where the C library has no close_range), else that loop."""
    try:
        open_fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        os.closerange(lowest, os.sysconf("SC_OPEN_MAX"))
        return
    for fd in open_fds:
        if fd >= lowest:
            try:  # noqa: SIM105 (as above)
                os.close(fd)
            except OSError:
                pass  # the listing's own descriptor, closed already


def _exit_line(status: int, reason: str) -> bytes:
    reason = " ".join(reason.split())[:MAX_REASON]  # one line, whatever the message held
    return f"exit {status} {reason}\n".encode("utf-8", "replace")


class StatusPipe:
    """The daemon's side: tell the starter once, `serving` or `exited`, then close."""

    def __init__(self) -> None:
        self._fd = -1

    def open(self, fd: int | None) -> None:
        """Take the pipe given as `--status-fd` (None: nobody waits)."""
        if fd is None:
            return
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                return  # not a starter's pipe (run by hand with a stale number): leave it be
            os.set_inheritable(fd, False)  # never an upstream's
        except OSError:
            return
        self._fd = fd

    def serving(self, pid: int) -> None:
        self._say(f"serving {pid}\n".encode())

    def exited(self, status: int, reason: str) -> None:
        self._say(_exit_line(status, reason))

    def _say(self, line: bytes) -> None:
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        try:
            os.write(fd, line)
        except OSError:
            pass  # the starter went away: nobody to tell, and nothing to do about it
        finally:
            os.close(fd)
