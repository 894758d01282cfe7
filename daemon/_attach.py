"""`mcpool attach`: a stdio MCP server that relays its client to the mcpool daemon.

Theory of operation. Every MCP client launches this once per session, so it must start fast: it
imports only the stdlib (no trio, msgspec or argparse) and does no work the relay does not need.

1. Connect to the daemon's Unix socket. Nobody there: start a daemon detached (`_detach.py`: it
   is nobody's child, in a session of its own, so a client that kills this bridge's process
   tree, group or session leaves it alone) and wait on its status pipe until it serves. Racing
   bridges may each start one; the daemon holds an flock on the lock file and a loser says so
   and exits 0 without touching the socket, so its bridge retries the connect to the winner.
2. Send one `mcpool/attach` request and read exactly one response line. Bytes that arrived behind
   that line belong to the MCP session and go to stdout first.
3. Hand-off. When stdin and stdout are pipes or sockets (what every MCP client gives a stdio
   server), the attach request carries them to the daemon (SCM_RIGHTS) and asks for
   `"handoff": true`. A daemon that agrees says so in its result and from then on reads the
   client's stdin and writes its stdout itself: the bridge is out of the message path (one
   process hop less per message: about 0.05 ms per call here), and only waits on the socket,
   which now carries control only. The session's end comes as one `mcpool/ended` notification:
   the client closed stdin (exit 0), or the daemon ended it (exit 1 with its reason). The socket
   closing without it means the daemon went away (exit 1). If the bridge dies, the daemon sees
   the socket close and ends the session, so the bridge's lifetime stays the session's. The
   waiting is done by `/bin/sh` running a few lines (`_waiter.py`): the bridge execs into it
   after the hand-off, so an attached session costs a shell's memory, not an interpreter's.
4. Relay, when there is no hand-off (a terminal or a file on stdin, a daemon that declined, or
   MCPOOL_ATTACH_RELAY=1): bytes both ways, unparsed, in one poll loop. Writes are non-blocking
   with one pending buffer per direction, and POLLOUT is asked for only while that buffer holds
   bytes: a blocking write could stop us reading the other direction and deadlock a client that
   writes before it reads. A direction whose buffer passes HIGH_WATER stops reading, so memory
   stays bounded while the other direction keeps flowing.

Endings (relay): stdin EOF half-closes the socket and the relay runs until the daemon closes
(exit 0); the daemon closing first is an error (exit 1, one stderr line); a broken stdout means
the client is gone (exit 0, quietly); SIGINT/SIGTERM exit 130/143 without a traceback.
"""

import _socket
import os
import stat
import sys
import time

# `json`'s own modules (and `contextlib`, below) are start-up time of every client launch for
# two C functions: _jsonlite calls them directly, with the same answers.
from mcpool.daemon import _jsonlite as json

# The `*_str` forms: pathlib is start-up time of every client launch too.
from mcpool.daemon._paths import (
    UnsafeSocketPath,
    check_daemon_peer,
    check_socket_path,
    config_path_str,
    daemon_log_path_str,
    socket_path_str,
)
from mcpool.daemon._waiter import exec_waiter

# `_socket`, not `socket`: the wrapper module pulls in selectors and enum tables, ~2 ms of every
# client launch, for nothing this bridge uses. `_signal`, not `signal`, for the same reason: the
# wrapper builds enum classes of every signal, about 8 ms with `enum` itself. `select` is needed
# only by the relay and the Python waiter, never by a hand-off to the shell waiter: imported
# there.
# Not `from typing import TYPE_CHECKING`: importing typing costs ~2 ms of every client launch, and
# mypy treats any constant of this name the same way. No `from __future__ import annotations`
# in the bridge's modules either (it imports `__future__`): annotations naming these are quoted.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal  # typeshed has no stub for `_signal`: the same names, typed
    from collections.abc import Callable
    from pathlib import Path
    from types import FrameType

    from mcpool.daemon._detach import DaemonStart
else:
    import _signal

# A cold daemon imports trio and msgspec and loads settings: well under a second normally, but a
# first run compiles .pyc files and a loaded machine is slower; 15 s only bounds a broken install.
DAEMON_START_TIMEOUT = 15.0
# Between connect attempts while a daemon starts: small next to its start-up, and not a spin.
CONNECT_RETRY_INTERVAL = 0.015
# The daemon may wait for upstream discovery before it answers; MCP clients give a server 30-60 s
# to start, so this catches only a wedged daemon, never a slow upstream.
ATTACH_RESPONSE_TIMEOUT = 120.0
# In every stdio upstream's environment, with the daemon's pid (mcpool/pool/_environ.py): an
# attach that sees it and reaches that same daemon was started by the daemon itself.
UPSTREAM_MARKER = "MCPOOL_UPSTREAM"
# Beside it, that process's own id (`<daemon pid>.<n>`): an entry's close ends what carries it.
SPAWN_MARKER = "MCPOOL_UPSTREAM_ID"
# The attach response is a few hundred bytes; anything this long is not a response.
MAX_RESPONSE_LINE = 1 << 20
# Unwritten bytes at which a direction stops reading (backpressure instead of unbounded memory).
HIGH_WATER = 1 << 20
READ_SIZE = 65536

USAGE = (
    "usage: mcpool attach [--socket PATH] [--settings FILE]... [--name NAME]"
    " [--max-name-length N] [--tool-search on|off]\n"
)


class AttachError(Exception):
    """A failure explained to the user in one stderr line; exit status 1."""


class _Signalled(BaseException):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class _Options:
    def __init__(self) -> None:
        self.socket: str | None = None
        self.settings: list[str] = []
        self.name: str | None = None
        # The longest exposed tool name this client takes (its own prefix counted).
        self.max_name_length: int | None = None
        # mcpool's own tool search for this session (issue 31): "on", "off" or the daemon's.
        self.tool_search: str | None = None


def _parse(args: list[str]) -> _Options | int:
    opts = _Options()
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-h", "--help"):
            sys.stdout.write(USAGE)
            return 0
        key, eq, value = arg.partition("=")
        if key not in ("--socket", "--settings", "--name", "--max-name-length", "--tool-search"):
            return _usage_error(f"unrecognized argument {arg!r}")
        if not eq:
            i += 1
            if i == len(args):
                return _usage_error(f"{key} needs a value")
            value = args[i]
        if key == "--socket":
            opts.socket = value
        elif key == "--settings":
            opts.settings.append(value)
        elif key == "--max-name-length":
            if not value.isdigit() or not 1 <= int(value) <= 1024:
                return _usage_error(f"--max-name-length takes a whole number, got {value!r}")
            opts.max_name_length = int(value)
        elif key == "--tool-search":
            if value not in ("on", "off"):
                return _usage_error(f"--tool-search takes on or off, got {value!r}")
            opts.tool_search = value
        else:
            opts.name = value
        i += 1
    return opts


def _usage_error(message: str) -> int:
    sys.stderr.write(f"{USAGE}mcpool attach: error: {message}\n")
    return 2


def _raise_signalled(signum: int, frame: "FrameType | None") -> None:
    raise _Signalled(128 + signum)


def main(args: list[str]) -> int:
    parsed = _parse(args)
    if isinstance(parsed, int):
        return parsed
    for signum in (_signal.SIGINT, _signal.SIGTERM):
        _signal.signal(signum, _raise_signalled)
    try:
        return _run(parsed)
    except AttachError as exc:
        sys.stderr.write(f"mcpool attach: {exc}\n")
        return 1
    except _Signalled as exc:
        return exc.status


def _reserve_stdio() -> None:
    """Put /dev/null on whichever of fds 0, 1 and 2 is closed.

    A client may start us with stdin (or stdout) already closed. Left closed, the socket we
    open next would take that number, and the bridge would then read its own connection as the
    client's input: it hung, and its session stayed. With /dev/null there, a closed stdin reads
    as end of input at once, which ends the session as a client closing stdin does (exit 0).
    """
    for fd, flags in ((0, os.O_RDONLY), (1, os.O_WRONLY), (2, os.O_WRONLY)):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, flags)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def _run(opts: _Options) -> int:
    _reserve_stdio()
    sock_path = socket_path_str(opts.socket)
    if opts.settings:
        sources = [os.path.abspath(p) for p in opts.settings]
    else:
        sources = [config_path_str(None)]
        local = os.path.abspath(".mcp.json")
        if os.path.exists(local):
            sources.append(local)
    try:
        cwd: str | None = os.getcwd()
    except OSError:  # the directory was deleted under us
        cwd = None
    name = opts.name or (cwd and (os.path.basename(cwd) or cwd)) or "attach"
    sock, _ = connect_or_start(sock_path)
    try:
        _refuse_own_daemon(sock)
        params: dict[str, object] = {
            "sources": sources,
            "cwd": cwd,
            "name": name,
            "clientPid": os.getppid(),
        }
        env = referenced_environment(sources)
        if env:
            params["env"] = env
        if opts.max_name_length is not None:
            params["maxNameLength"] = opts.max_name_length
        if opts.tool_search is not None:
            params["toolSearch"] = opts.tool_search
        handoff = _can_hand_off(0, 1)
        if handoff:
            params["handoff"] = True
        result, leftover = attach(sock, params, fds=(0, 1) if handoff else ())
        if result.get("handoff") is True:
            if not leftover:
                # Only waiting from here on: a shell does that in a fraction of the memory.
                exec_waiter(sock.fileno())
            return wait_handed_off(sock, leftover)
        return relay(sock, leftover)
    finally:
        sock.close()


def _refuse_own_daemon(sock: _socket.socket) -> None:
    """A bridge started by the daemon itself (an entry that launches mcpool, however spelled:
    its upstreams carry UPSTREAM_MARKER=<daemon pid>) must not attach to that daemon, which
    would then be its own upstream, again and again. Another daemon (`mcpool demo`, another
    socket) is fine. Checked before anything is sent, by the peer's pid (SO_PEERCRED)."""
    nested = os.environ.get(UPSTREAM_MARKER)
    if nested is None:
        return
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # pid, uid, gid
    peer_pid = int.from_bytes(creds[:4], sys.byteorder, signed=True)
    if str(peer_pid) == nested:
        raise AttachError(
            f"refusing to attach to the mcpool daemon (pid {nested}) from one of its own "
            "upstreams: a settings entry launches `mcpool attach` as a server, which would make "
            "the daemon its own upstream; remove that entry (see `daemonctl status`)"
        )


def referenced_environment(sources: list[str]) -> dict[str, str]:
    """This session's values of the variables its settings files reference (`${NAME}`): the
    daemon expands the files' entries with them (daemon/_expand.py). One read and one regex
    scan per file; variables that are not set are left out (the daemon then uses the default
    or refuses the entry)."""
    names: set[bytes] = set()
    for path in sources:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue  # missing or unreadable: the daemon reports it
        if b"${" in data:
            import re  # only settings that reference variables pay for it

            names.update(re.findall(rb"\$\{([A-Za-z_][A-Za-z0-9_]*)(?=\}|:-)", data))
    env = {}
    for raw in names:
        name = raw.decode()
        value = os.environ.get(name)
        if value is not None:
            env[name] = value
    return env


def connect(path: "Path | str") -> _socket.socket | None:
    """A connection to our own daemon, or None when nobody listens. The folder, the socket file
    and then the listener's uid are checked before anything is sent (X3)."""
    try:
        check_socket_path(path)
    except UnsafeSocketPath as exc:
        raise AttachError(str(exc)) from None
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
        check_daemon_peer(sock, path)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except UnsafeSocketPath as exc:
        sock.close()
        raise AttachError(str(exc)) from None
    except OSError as exc:
        sock.close()
        raise AttachError(f"cannot connect to {path}: {exc.strerror or exc}") from None
    return sock


def spawn_daemon(path: "Path | str") -> "DaemonStart":
    """Start a daemon for `path`, detached: nobody's child, in its own session (_detach.py)."""
    from mcpool.daemon._detach import start_detached  # only a cold start pays for it

    # A bridge that another daemon's upstream runs carries that daemon's marks, and what
    # carries them ends with that upstream's entry or that daemon (pool/_guardian.py); the
    # daemon this bridge starts is nobody's, so it does not inherit them.
    marks = (UPSTREAM_MARKER, SPAWN_MARKER)
    env = {name: value for name, value in os.environ.items() if name not in marks}
    return start_detached(str(path), _stderr_path(path), env)


def _stderr_path(path: "Path | str") -> str:
    """The daemon's stderr file, next to its log."""
    return os.path.join(os.path.dirname(daemon_log_path_str(path)), "daemon.stderr")


def connect_or_start(
    path: "Path | str",
    spawn: "Callable[[Path | str], DaemonStart]" = spawn_daemon,
    timeout: float = DAEMON_START_TIMEOUT,
) -> "tuple[_socket.socket, DaemonStart | None]":
    """Connect to the daemon, starting one if nobody answers. Returns the start we made."""
    sock = connect(path)
    if sock is not None:
        return sock, None
    start = spawn(path)
    try:
        return wait_for_daemon(path, start, timeout), start
    finally:
        start.close()


def wait_for_daemon(path: "Path | str", start: "DaemonStart", timeout: float) -> _socket.socket:
    """A connection to the daemon `start` began (or to the one that won the start race).

    Waits on its status pipe while it starts. Once it serves, or lost the race (exit 0: the
    winner's socket is on its way), the connect is retried until it answers; a daemon that
    ended otherwise is an error with its exit status (or reason) and its stderr file."""
    deadline = time.monotonic() + timeout
    log = _stderr_path(path)
    while True:
        left = deadline - time.monotonic()
        outcome = start.wait(max(0.0, left))
        if outcome is not None:
            sock = connect(path)
            if sock is not None:
                return sock
            if outcome.status is None and not outcome.serving:
                raise AttachError(
                    f"the daemon failed to start (it exited before serving {path}: "
                    f"{outcome.reason}); see {log}"
                )
            if outcome.status not in (None, 0):
                why = f": {outcome.reason}" if outcome.reason else ""
                raise AttachError(
                    f"the daemon failed to start (exit status {outcome.status}{why}); see {log}"
                )
        if time.monotonic() >= deadline:
            raise AttachError(f"no daemon answered at {path} within {timeout:g} s; see {log}")
        if outcome is not None:
            time.sleep(CONNECT_RETRY_INTERVAL)


def _can_hand_off(stdin_fd: int, stdout_fd: int) -> bool:
    """Whether the daemon can serve these fds itself: pipes or sockets (what MCP clients give a
    stdio server). A terminal or a file stays with the relay: the daemon's non-blocking reads
    and writes would reach a terminal the user's shell shares, and epoll refuses files."""
    if os.environ.get("MCPOOL_ATTACH_RELAY") == "1":
        return False
    try:
        modes = (os.fstat(stdin_fd).st_mode, os.fstat(stdout_fd).st_mode)
    except OSError:
        return False
    return all(stat.S_ISFIFO(m) or stat.S_ISSOCK(m) for m in modes)


def attach(
    sock: _socket.socket, params: dict[str, object], fds: tuple[int, ...] = ()
) -> tuple[dict[str, object], bytes]:
    """Send the attach request (with `fds` alongside it); return its result and the session
    bytes read behind it."""
    request = {"jsonrpc": "2.0", "id": 0, "method": "mcpool/attach", "params": params}
    sock.settimeout(ATTACH_RESPONSE_TIMEOUT)
    buf = bytearray()
    try:
        line = json.dumps(request, separators=(",", ":")).encode() + b"\n"
        if fds:
            # The fds travel with the first byte; the rest of the line follows if need be.
            rights = b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds)
            sent = sock.sendmsg([line], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
            line = line[sent:]
        if line:
            # Never an empty sendall: it still calls send() once, and a daemon that already
            # answered and closed would turn that into a broken pipe.
            sock.sendall(line)
        while (end := buf.find(b"\n")) < 0:
            if len(buf) > MAX_RESPONSE_LINE:
                raise AttachError("the daemon's attach response is too long")
            chunk = sock.recv(READ_SIZE)
            if not chunk:
                raise AttachError("the daemon closed the connection")
            buf += chunk
    except TimeoutError:
        raise AttachError(
            f"the daemon did not answer within {ATTACH_RESPONSE_TIMEOUT:g} s"
        ) from None
    except OSError as exc:
        raise AttachError(f"the daemon closed the connection ({exc.strerror or exc})") from None
    try:
        response = json.loads(buf[:end])
    except ValueError:
        response = None
    if not isinstance(response, dict):
        raise AttachError(f"unexpected answer from the daemon: {bytes(buf[:end][:200])!r}")
    error = response.get("error")
    if isinstance(error, dict):
        raise AttachError(_describe_error(error))
    result = response.get("result")
    if not isinstance(result, dict):
        raise AttachError(f"unexpected answer from the daemon: {bytes(buf[:end][:200])!r}")
    return result, bytes(buf[end + 1 :])


def _describe_error(error: dict[str, object]) -> str:
    message = str(error.get("message") or "attach refused")
    data = error.get("data")
    if isinstance(data, dict):
        data = data.get("reason", data.get("message", json.dumps(data)))
    return f"{message} ({data})" if data else message


def wait_handed_off(sock: _socket.socket, leftover: bytes = b"") -> int:
    """The daemon serves stdin and stdout: wait for its `mcpool/ended`, or for it to go away."""
    import select

    sock.settimeout(None)
    buf = bytearray(leftover)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    while True:
        while (end := buf.find(b"\n")) >= 0:
            ended = _ended(bytes(buf[:end]))
            del buf[: end + 1]
            if ended is not None:
                status, reason = ended
                if status != 0:
                    sys.stderr.write(f"mcpool attach: {reason}\n")
                return status
        if len(buf) > MAX_RESPONSE_LINE:
            buf.clear()  # not ours to understand; the control channel carries short lines
        if not poller.poll():
            continue
        try:
            data = sock.recv(READ_SIZE)
        except OSError:
            data = b""
        if not data:
            sys.stderr.write("mcpool attach: the daemon closed the connection\n")
            return 1
        buf += data


def _ended(line: bytes) -> tuple[int, str] | None:
    """(exit status, reason) from an `mcpool/ended` notification; None for any other line."""
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    if not isinstance(msg, dict) or msg.get("method") != "mcpool/ended":
        return None
    params = msg.get("params")
    params = params if isinstance(params, dict) else {}
    status = 0 if params.get("clientClosed") is True else 1
    return status, str(params.get("reason") or "the daemon ended the session")


def relay(
    sock: _socket.socket,
    leftover: bytes = b"",
    stdin_fd: int = 0,
    stdout_fd: int = 1,
) -> int:
    """Relay stdin -> socket and socket -> stdout until done; return the exit status."""
    sock.setblocking(False)
    sock_fd = sock.fileno()
    was_blocking = os.get_blocking(stdout_fd)
    os.set_blocking(stdout_fd, False)
    try:
        return _relay_loop(sock, sock_fd, bytearray(leftover), stdin_fd, stdout_fd)
    finally:
        # O_NONBLOCK lives on the open file description, which the client or a terminal shares.
        try:  # noqa: SIM105 (contextlib is import time of every client launch)
            os.set_blocking(stdout_fd, was_blocking)
        except OSError:
            pass


def _relay_loop(
    sock: _socket.socket,
    sock_fd: int,
    to_out: bytearray,
    stdin_fd: int,
    stdout_fd: int,
) -> int:
    import select

    broken = select.POLLHUP | select.POLLERR | select.POLLNVAL
    to_sock = bytearray()
    stdin_eof = sock_eof = shut_wr = False
    poller = select.poll()
    masks: dict[int, int] = {}

    def want(fd: int, mask: int) -> None:
        old = masks.get(fd, 0)
        if mask == old:
            return
        if not mask:
            poller.unregister(fd)
            del masks[fd]
        elif not old:
            poller.register(fd, mask)
            masks[fd] = mask
        else:
            poller.modify(fd, mask)
            masks[fd] = mask

    while True:
        if to_out:
            try:
                del to_out[: os.write(stdout_fd, to_out)]
            except BlockingIOError:
                pass
            except OSError:  # EPIPE and friends: the client has gone away
                return 0
        if to_sock:
            try:
                del to_sock[: sock.send(to_sock)]
            except BlockingIOError:
                pass
            except OSError:
                sock_eof = True
                to_sock.clear()
        if stdin_eof and not to_sock and not shut_wr and not sock_eof:
            shut_wr = True
            try:
                sock.shutdown(_socket.SHUT_WR)
            except OSError:
                sock_eof = True
        if sock_eof and not to_out:
            if stdin_eof:
                return 0
            sys.stderr.write("mcpool attach: the daemon closed the connection\n")
            return 1

        reading_stdin = not stdin_eof and not sock_eof and len(to_sock) < HIGH_WATER
        want(stdin_fd, select.POLLIN if reading_stdin else 0)
        sock_mask = select.POLLOUT if to_sock else 0
        if not sock_eof and len(to_out) < HIGH_WATER:
            sock_mask |= select.POLLIN
        want(sock_fd, sock_mask)
        want(stdout_fd, select.POLLOUT if to_out else 0)

        for fd, events in poller.poll():
            if fd == stdin_fd:
                try:
                    data = os.read(stdin_fd, READ_SIZE)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    to_sock += data
                else:
                    stdin_eof = True
            elif fd == sock_fd and not sock_eof and events & (select.POLLIN | broken):
                try:
                    data = sock.recv(READ_SIZE)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    to_out += data
                else:
                    sock_eof = True
            # stdout's POLLOUT (or error) is acted on by the write at the top of the loop.
