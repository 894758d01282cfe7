"""`daemonctl`: inspect and control the mcpool daemon over its admin socket.

Each command is one `mcpool/admin/<command>` request on one connection (COMMON.md). `--json`
prints the daemon's result unchanged (its shapes are documented in the README); otherwise rich
renders a table, imported only then. Long operations (start, stop, restart, reload) show a
spinner on a terminal's stderr and end with one result line.
Exit status: 0 ok, 1 the daemon answered with an error or the command failed (also: `explain`
found nothing of that name), 2 usage, 3 no daemon running.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcpool.daemon import _ledger, _login, _pinkeeper
from mcpool.daemon._paths import (
    UnsafeSocketPath,
    check_daemon_peer,
    check_socket_path,
    socket_path,
)

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NO_DAEMON = 3

# Status-like commands answer from memory; reload and restart wait for upstreams to start and
# answer discovery, which can take seconds. This catches only a wedged daemon.
REQUEST_TIMEOUT = 60.0
# The daemon drains sessions and closes upstreams within its own bounded graces (stdin close,
# SIGTERM, SIGKILL); 20 s is longer than their sum, so a miss means it is stuck.
STOP_TIMEOUT = 20.0
STOP_POLL_INTERVAL = 0.05
FOLLOW_INTERVAL = 1.0
# `logs -f` asks for this many lines per poll so a burst between two polls is not lost.
FOLLOW_WINDOW = 1000
# An admin answer is at most a few hundred KiB (tools of every session); more is a broken peer.
MAX_LINE = 64 << 20
# The most lines `logs -n` may ask for: the daemon's own bound (daemon/_admin.py LOG_LINES_MAX),
# repeated so that daemonctl does not import the daemon's modules; a test keeps them equal.
MAX_LOG_LINES = 100_000


class NoDaemonError(Exception):
    pass


class CommandError(Exception):
    """Printed as `daemonctl: <message>`; exit status 1."""


class AdminClient:
    """One admin connection: newline-delimited JSON-RPC requests, each answered in turn."""

    def __init__(self, path: os.PathLike[str] | str, timeout: float = REQUEST_TIMEOUT) -> None:
        self.path = str(path)
        try:
            # X3: the folder and socket are ours, and so is the listener, before we send a byte.
            check_socket_path(Path(self.path))
        except UnsafeSocketPath as exc:
            raise CommandError(str(exc)) from None
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(self.path)
            check_daemon_peer(self._sock, Path(self.path))
        except (FileNotFoundError, ConnectionRefusedError):
            self._sock.close()
            raise NoDaemonError(self.path) from None
        except UnsafeSocketPath as exc:
            self._sock.close()
            raise CommandError(str(exc)) from None
        except OSError as exc:
            self._sock.close()
            raise CommandError(f"cannot connect to {self.path}: {exc.strerror or exc}") from None
        self._reader = self._sock.makefile("rb")
        self._next_id = 1

    def call(self, command: str, params: dict[str, Any]) -> Any:
        request_id = self._next_id
        self._next_id += 1
        request = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": f"mcpool/admin/{command}",
            "params": params,
        }
        try:
            self._sock.sendall(json.dumps(request).encode() + b"\n")
            while True:
                line = self._reader.readline(MAX_LINE)
                if not line.endswith(b"\n"):
                    raise CommandError("the daemon closed the connection")
                response = json.loads(line)
                # Anything without our id (a stray notification) is not our answer.
                if isinstance(response, dict) and response.get("id") == request_id:
                    break
        except TimeoutError:
            raise CommandError(
                f"the daemon did not answer {command} within {REQUEST_TIMEOUT:g} s"
            ) from None
        except ValueError as exc:
            raise CommandError(f"unreadable answer from the daemon: {exc}") from None
        except OSError as exc:
            raise CommandError(f"the daemon closed the connection ({exc})") from None
        error = response.get("error")
        if error is not None:
            raise CommandError(_describe_error(error))
        return response.get("result")

    def close(self) -> None:
        self._reader.close()
        self._sock.close()


def _describe_error(error: Any) -> str:
    if not isinstance(error, dict):
        return f"the daemon answered with an error: {error!r}"
    message = str(error.get("message") or "error")
    data = error.get("data")
    if isinstance(data, dict):
        data = data.get("reason", data.get("message", json.dumps(data)))
    return f"{message} ({data})" if data else message


# --- arguments ---------------------------------------------------------------------------------


def _line_count(text: str) -> int:
    value = int(text)
    if not 1 <= value <= MAX_LOG_LINES:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_LOG_LINES}")
    return value


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object (a server's settings)")
    return value


def _parser() -> argparse.ArgumentParser:
    # --socket and --json are accepted before or after the command; SUPPRESS keeps a
    # subcommand's parser from resetting a value given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--socket", metavar="PATH", default=argparse.SUPPRESS)
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the raw result"
    )
    parser = argparse.ArgumentParser(
        prog="daemonctl", description="Inspect and control the mcpool daemon.", parents=[common]
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help, description=help, parents=[common])

    add("status", "the daemon's state, configuration files and problems")
    add("servers", "pooled upstream servers")
    add("sessions", "attached sessions")
    add("start", "start a daemon in the background unless one is running, and wait for it")
    tools = add("tools", "the tools and prompts one session sees")
    tools.add_argument("session", metavar="SESSION")
    tools.add_argument("--server", metavar="NAME")
    explain = add("explain", "why a tool or prompt is visible or hidden for one session")
    explain.add_argument("session", metavar="SESSION", help="session id or name")
    explain.add_argument("name", metavar="NAME", help="exposed or upstream tool or prompt name")
    restart = add("restart", "restart every running entry of a server")
    restart.add_argument("name", metavar="NAME")
    add("reload", "re-read the settings files now")
    logs = add("logs", "the daemon's log, or one server's stderr")
    logs.add_argument("name", metavar="NAME", nargs="?")
    logs.add_argument("-n", "--lines", type=_line_count, default=50, metavar="N")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    add("stop", "stop the daemon and wait until it is gone")
    session = add("session", "change one session")
    session_commands = session.add_subparsers(dest="session_command", required=True)
    set_server = session_commands.add_parser(
        "set-server", help="add or replace one server in a session", parents=[common]
    )
    set_server.add_argument("session", metavar="SESSION")
    set_server.add_argument("name", metavar="NAME")
    set_server.add_argument("entry", metavar="JSON", type=_json_object)
    _login.add_commands(add)
    _ledger.add_commands(add)
    _pinkeeper.add_commands(add)
    return parser


# --- main --------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    path = socket_path(getattr(args, "socket", None))
    as_json: bool = getattr(args, "json", False)
    if args.command == "start":
        try:
            return _cmd_start(path, as_json)
        except CommandError as exc:
            sys.stderr.write(f"daemonctl: {exc}\n")
            return EXIT_FAILED
        except KeyboardInterrupt:
            return 130
    if args.command == "audit":  # the user's own files: read with or without a daemon
        return _ledger.cmd_audit(args, as_json)
    try:
        client = AdminClient(path)
    except NoDaemonError:
        sys.stderr.write(f"no mcpool daemon is running at {path}\n")
        return EXIT_NO_DAEMON
    except CommandError as exc:
        sys.stderr.write(f"daemonctl: {exc}\n")
        return EXIT_FAILED
    try:
        return _COMMANDS[args.command](client, args, as_json)
    except CommandError as exc:
        sys.stderr.write(f"daemonctl: {exc}\n")
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `daemonctl logs | head`
        # Keep the interpreter's final flush from complaining about the same pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    finally:
        client.close()


Command = Callable[[AdminClient, argparse.Namespace, bool], int]


def _print_json(result: Any) -> None:
    sys.stdout.write(json.dumps(result, indent=2) + "\n")


def _cmd_status(client: AdminClient, args: argparse.Namespace, as_json: bool) -> int:
    result = client.call("status", {})
    if as_json:
        _print_json(result)
    else:
        _render_status(result)
    return EXIT_OK


def _cmd_servers(client: AdminClient, args: argparse.Namespace, as_json: bool) -> int:
    result = client.call("servers", {})
    if as_json:
        _print_json(result)
    else:
        _render_servers(result)
    return EXIT_OK


def _cmd_sessions(client: AdminClient, args: argparse.Namespace, as_json: bool) -> int:
    result = client.call("sessions", {})
    if as_json:
        _print_json(result)
    else:
        _render_sessions(result)
    return EXIT_OK


def _cmd_tools(client: AdminClient, args: argparse.Namespace, as_json: bool) -> int:
    result = client.call("tools", {"session": args.session, "server": args.server})
    if as_json:
        _print_json(result)
    else:
        _render_tools(result)
    return EXIT_OK


def _cmd_restart(client: AdminClient, args: argparse.Namespace, as_json: bool) -> int:
    began = time.monotonic()
    with progress(f"restarting {args.name}", as_json):
        result = client.call("restart", {"name": args.name})
    took = time.monotonic() - began
    entries = result.get("entries") or []
    # An entry that did not come back (crash-loop, failed) is a failed restart.
    failed = [e for e in entries if e.get("result") not in ("active", "restarted")]
    if as_json:
        _print_json(result)
        return EXIT_FAILED if failed else EXIT_OK
    if not entries:
        _print(f"no running entry of {_text(args.name)}")
        return EXIT_OK
    table = _table("ENTRY", "RESULT", "PID", "ERROR")
    for entry in entries:
        table.add_row(
            _text(entry.get("id")),
            _text(entry.get("result")),
            _text(entry.get("pid")),
            _text(entry.get("error")),
        )
    _print(table)
    up = len(entries) - len(failed)
    noun = "entry" if len(entries) == 1 else "entries"
    verdict = "restarted" if not failed else "restart incomplete"
    sys.stdout.write(f"{verdict}: {args.name}, {up} of {len(entries)} {noun} up ({took:.2f} s)\n")
    return EXIT_FAILED if failed else EXIT_OK


def _cmd_reload(client: AdminClient, args: argparse.Namespace, as_json: bool) -> int:
    began = time.monotonic()
    with progress("reloading settings and applying them to every session", as_json):
        result = client.call("reload", {})
    took = time.monotonic() - began
    files = result.get("files") or []
    # A file the daemon could not use is a failed reload, even though the daemon answered.
    failed = [item for item in files if item.get("status") == "error"]
    if as_json:
        _print_json(result)
    else:
        table = _table("FILE", "STATUS", "ERROR")
        for item in files:
            table.add_row(
                _text(item.get("path")), _text(item.get("status")), _text(item.get("error"))
            )
        _print(table)
        counts: dict[str, int] = {}
        for item in files:
            counts[str(item.get("status"))] = counts.get(str(item.get("status")), 0) + 1
        summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        verdict = "reload applied" if not failed else "reload applied with errors"
        sys.stdout.write(f"{verdict}: {len(files)} files ({summary or 'none'}) in {took:.2f} s\n")
    return EXIT_FAILED if failed else EXIT_OK


def _cmd_explain(client: AdminClient, args: argparse.Namespace, as_json: bool) -> int:
    result = client.call("explain", {"session": args.session, "name": args.name})
    if as_json:
        _print_json(result)
    else:
        _render_explain(result)
    return EXIT_OK if result.get("matches") else EXIT_FAILED


def _cmd_start(path: os.PathLike[str] | str, as_json: bool) -> int:
    """Start a detached daemon (as `mcpool attach` would) unless one answers, and wait for it."""
    from mcpool.daemon._attach import (
        DAEMON_START_TIMEOUT,
        AttachError,
        connect,
        spawn_daemon,
        wait_for_daemon,
    )

    began = time.monotonic()
    started = None
    try:
        sock = connect(Path(path))
        if sock is None:
            # Forked before the spinner's thread exists: a fork copies only the calling thread.
            started = spawn_daemon(Path(path))
        with progress(f"starting mcpool daemon at {path}", as_json):
            if started is not None:
                try:
                    sock = wait_for_daemon(Path(path), started, DAEMON_START_TIMEOUT)
                finally:
                    started.close()
            assert sock is not None
            sock.close()
            client = AdminClient(path)
            try:
                status = client.call("status", {})
            finally:
                client.close()
    except AttachError as exc:
        raise CommandError(str(exc)) from None
    except NoDaemonError:
        raise CommandError(f"the daemon at {path} went away while starting") from None
    took = time.monotonic() - began
    result = {
        "pid": status.get("pid"),
        "socket": str(path),
        "started": started is not None and started.pid == status.get("pid"),
        "seconds": round(took, 3),
    }
    if as_json:
        _print_json(result)
    elif result["started"]:
        sys.stdout.write(f"mcpool daemon started (pid {result['pid']}) at {path} in {took:.2f} s\n")
    else:
        sys.stdout.write(f"mcpool daemon already running (pid {result['pid']}) at {path}\n")
    return EXIT_OK


@contextlib.contextmanager
def progress(message: str, as_json: bool) -> Iterator[None]:
    """A spinner on stderr while a long operation runs, only when a person is watching."""
    if as_json or not sys.stderr.isatty():
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(message):
        yield


def _cmd_logs(client: AdminClient, args: argparse.Namespace, as_json: bool) -> int:
    result = client.call("logs", {"name": args.name, "lines": args.lines})
    if as_json and not args.follow:
        _print_json(result)
        return EXIT_OK
    previous: list[str] = result.get("lines") or []
    _write_lines(previous, as_json)
    while args.follow:
        time.sleep(FOLLOW_INTERVAL)
        current: list[str] = (
            client.call("logs", {"name": args.name, "lines": FOLLOW_WINDOW}).get("lines") or []
        )
        _write_lines(new_lines(previous, current), as_json)
        previous = current
    return EXIT_OK


def _write_lines(lines: list[str], as_json: bool) -> None:
    # Following with --json prints one JSON string per line, so a consumer can parse as it reads.
    for line in lines:
        sys.stdout.write((json.dumps(line) if as_json else line.rstrip("\n")) + "\n")
    sys.stdout.flush()


def new_lines(previous: list[str], current: list[str]) -> list[str]:
    """The lines of `current` after where `previous` ends.

    Both are tails of the same log; the newest place where `current` contains the end of
    `previous` is taken as the seam. No seam (rotated log, or more new lines than the window)
    means everything is new. Identical consecutive lines make the seam ambiguous; log lines carry
    timestamps, so in practice they are not.
    """
    if not previous:
        return current
    last = previous[-1]
    for end in range(len(current), 0, -1):
        if current[end - 1] != last:
            continue
        overlap = min(len(previous), end)
        if current[end - overlap : end] == previous[len(previous) - overlap :]:
            return current[end:]
    return current


def _cmd_stop(client: AdminClient, args: argparse.Namespace, as_json: bool) -> int:
    result = client.call("stop", {})
    pid = int(result["pid"])
    with progress(f"stopping mcpool daemon (pid {pid})", as_json):
        stopped = _wait_stopped(client.path, pid)
    if not stopped:
        raise CommandError(f"the daemon (pid {pid}) did not stop within {STOP_TIMEOUT:g} s")
    if as_json:
        _print_json(result)
    else:
        sys.stdout.write(f"mcpool daemon (pid {pid}) stopped\n")
    return EXIT_OK


def _wait_stopped(path: str, pid: int) -> bool:
    deadline = time.monotonic() + STOP_TIMEOUT
    while os.path.lexists(path) or _alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(STOP_POLL_INTERVAL)
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has stopped all the same: a daemon under systemd, or the child of an init that
    # reaps late (a container's), may stay one for a moment.
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _cmd_session(client: AdminClient, args: argparse.Namespace, as_json: bool) -> int:
    # The only session subcommand so far is set-server.
    params = {"session": args.session, "name": args.name, "entry": args.entry}
    result = client.call("setServer", params)
    if as_json:
        _print_json(result)
    else:
        sys.stdout.write(f"{args.name}: {result.get('action')}\n")
    return EXIT_OK


_COMMANDS: dict[str, Command] = {
    "status": _cmd_status,
    "servers": _cmd_servers,
    "sessions": _cmd_sessions,
    "tools": _cmd_tools,
    "explain": _cmd_explain,
    "restart": _cmd_restart,
    "reload": _cmd_reload,
    "logs": _cmd_logs,
    "stop": _cmd_stop,
    "session": _cmd_session,
    "login": _login.cmd_login,
    "logout": _login.cmd_logout,
    "stats": _ledger.cmd_stats,
    "changes": _pinkeeper.cmd_changes,
    "approve": _pinkeeper.cmd_approve,
}


# --- human output ------------------------------------------------------------------------------


def _console() -> Console:
    from rich.console import Console

    tty = sys.stdout.isatty()
    # Piped output is for grep and scripts: no colours, and no wrapping or truncating ids to fit
    # an imaginary 80-column terminal.
    return Console(highlight=False, no_color=not tty, width=None if tty else 1000)


def _print(renderable: object) -> None:
    console = _console()
    if console.is_terminal:
        console.print(renderable)
        return
    # Cells are padded to their column's width; a pipe gets the lines without trailing blanks.
    with console.capture() as capture:
        console.print(renderable)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in capture.get().splitlines()))


# Enough of the 12-character fingerprint to tell entries apart at a glance (I1: a prefix is safe).
FINGERPRINT_SHOWN = 8
_IDENTIFIERS = frozenset({"NAME", "ID", "ENTRY", "SESSION", "EXPOSED"})


def _table(*columns: str) -> Table:
    from rich.table import Table

    table = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold")
    for column in columns:
        # On a narrow terminal ids stay whole (they are what one copies into the next command);
        # everything else folds rather than losing characters to an ellipsis.
        if column in _IDENTIFIERS:
            table.add_column(column, no_wrap=True)
        else:
            table.add_column(column, overflow="fold")
    return table


def _print_rows(
    items: Any, headers: tuple[str, ...], row: Callable[[dict[str, Any]], tuple[str, ...]]
) -> None:
    """A status table of its own (after a blank line), only when there is something in it."""
    if not items:
        return
    sys.stdout.write("\n")
    table = _table(*headers)
    for item in items:
        table.add_row(*row(item))
    _print(table)


def _text(value: Any) -> str:
    # Cells are plain text: a server's error message must not be parsed as rich markup.
    from rich.markup import escape

    return "-" if value is None else escape(str(value))


def age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def _when(timestamp: float | None, now: float | None = None) -> str:
    if timestamp is None:
        return "-"
    now = time.time() if now is None else now
    local = time.localtime(timestamp)
    same_day = local[:3] == time.localtime(now)[:3]
    shown = time.strftime("%H:%M:%S" if same_day else "%Y-%m-%d %H:%M:%S", local)
    return f"{shown} ({age(now - timestamp)})"


def _mib(rss: int | None) -> str:
    return "-" if rss is None else f"{rss / (1 << 20):.1f} MiB"


def _render_status(status: dict[str, Any]) -> None:
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("pid", _text(status.get("pid")))
    grid.add_row("version", _text(status.get("version")))
    grid.add_row("socket", _text(status.get("socket")))
    grid.add_row("started", _text(_when(status.get("started_at"))))
    grid.add_row("uptime", age(status.get("uptime") or 0))
    grid.add_row("sessions", _text(status.get("sessions")))
    grid.add_row("entries", _text(status.get("entries")))
    grid.add_row("processes", _text(status.get("processes")))
    grid.add_row("upstream rss", _mib(status.get("rss")))
    if "daemon_rss" in status:
        grid.add_row("daemon rss", _mib(status.get("daemon_rss")))
    _print(grid)
    config = status.get("config") or []
    if config:
        sys.stdout.write("\n")
        table = _table("CONFIG", "KIND", "STATUS", "SERVERS", "LOADED", "ERROR")
        for item in config:
            error = item.get("error")
            if error and item.get("applied_at") is not None:
                # The file is unusable, but what it said before still applies: say since when.
                error = f"{error} (previous servers kept, read {_when(item.get('applied_at'))})"
            table.add_row(
                _text(item.get("path")),
                _text(item.get("kind")),
                _text(item.get("status")),
                _text(item.get("servers")),
                _text(_when(item.get("loaded_at"))),
                _text(error),
            )
        _print(table)
    _print_rows(
        status.get("registry_errors"),
        ("SESSION", "REGISTRY ERROR"),
        lambda item: (_text(item.get("session")), _text(item.get("error"))),
    )
    _print_rows(
        status.get("skipped"),
        ("SKIPPED SERVER", "FILE", "WHY", "SESSIONS"),
        lambda item: (
            _text(item.get("server")),
            _text(item.get("file")),
            _text(item.get("error")),
            str(len(item.get("sessions") or [])),
        ),
    )
    _print_rows(
        status.get("not_up"),
        ("SERVER NOT UP", "STATE", "LAST ERROR", "SESSIONS"),
        lambda item: (
            _text(item.get("server")),
            _text(item.get("state")),
            _text(item.get("last_error")),
            str(len(item.get("sessions") or [])),
        ),
    )
    for note in status.get("notes") or []:
        _print(f"note: {_text(note)}")


def _transport_shown(server: dict[str, Any]) -> Any:
    """`http http://host:port/mcp` for a remote server: the URL as the daemon redacted it
    (no credentials, no query string; X2)."""
    url = (server.get("transport_detail") or {}).get("url")
    return f"{server.get('transport')} {url}" if url else server.get("transport")


def _state_shown(server: dict[str, Any], now: float) -> Any:
    """`crash-loop (retry in 4m12s)`: when a crash-looped server is tried again on its own."""
    retry_at = server.get("retry_at")
    if isinstance(retry_at, int | float) and not isinstance(retry_at, bool):
        return f"{server.get('state')} (retry in {age(retry_at - now)})"
    return server.get("state")


def _render_servers(servers: list[dict[str, Any]]) -> None:
    if not servers:
        _print("no servers")
        return
    # Only these fields, by name: whatever else an entry carries (env, headers) is never shown.
    table = _table(
        "NAME",
        "ID",
        "STATE",
        "TRANSPORT",
        "ERA",
        "PID",
        "RSS",
        "REFS",
        "UP SINCE",
        "RESTARTS",
        "SNAPSHOT",
        "FINGERPRINT",
        "LAST ERROR",
    )
    now = time.time()
    for server in servers:
        table.add_row(
            _text(server.get("name")),
            _text(server.get("id")),
            _text(_state_shown(server, now)),
            _text(_transport_shown(server)),
            _text(server.get("era")),
            _text(server.get("pid")),
            _mib(server.get("rss")),
            str(len(server.get("refs") or [])),
            _text(_when(server.get("started_at"), now)),
            _text(server.get("restarts")),
            _text(server.get("snapshot")),
            _text((server.get("fingerprint") or "")[:FINGERPRINT_SHOWN] or None),
            _text(server.get("last_error")),
        )
    _print(table)


def _render_sessions(sessions: list[dict[str, Any]]) -> None:
    if not sessions:
        _print("no sessions")
        return
    table = _table(
        "ID", "NAME", "ERA", "VIA", "CWD", "ATTACHED", "SERVERS", "GENERATION", "PENDING",
        "DROPPED", "SEARCH",
    )  # fmt: skip
    for session in sessions:
        table.add_row(
            _text(session.get("id")),
            _text(session.get("name")),
            _text(session.get("protocol_version") or session.get("era")),
            _text(session.get("via")),
            _text(session.get("cwd")),
            _text(_when(session.get("attached_at"))),
            _text(", ".join(session.get("servers") or []) or None),
            _text(session.get("generation")),
            _text(session.get("pending_notifications")),
            # log/progress messages shed while the client was behind (X8)
            _text(session.get("lossy_dropped")),
            _text(_search_cell(session.get("tool_search"))),
        )
    _print(table)


def _search_cell(search: Any) -> str | None:
    """mcpool's tool search for a session: on (with the bytes it spared) or off, and how
    decided."""
    if not isinstance(search, dict):
        return None
    mode = search.get("mode")
    if search.get("on"):
        return f"on ({mode}), {search.get('spared_bytes', 0)} B spared"
    return f"off ({mode})"


def _render_explain(result: dict[str, Any]) -> None:
    session = f"{result.get('session')} ({result.get('session_name')})"
    matches = result.get("matches") or []
    if not matches:
        _print(f"{_text(result.get('name'))}: no server of session {_text(session)} offers it")
        for item in result.get("elsewhere") or []:
            _print(
                f"  {_text(item.get('kind'))} {_text(item.get('upstream'))} of server "
                f"{_text(item.get('server'))} ({_text(item.get('entry'))}): "
                f"{_text(item.get('reason'))}"
            )
        return
    for n, match in enumerate(matches):
        if n:
            sys.stdout.write("\n")
        verdict = "VISIBLE" if match.get("visible") else "HIDDEN"
        _print(f"{_text(match.get('exposed'))}: {verdict} in session {_text(session)}")
        policy = match.get("policy") or {}
        grid = _grid()
        grid.add_row(
            "what",
            _text(
                f"{match.get('kind')} '{match.get('upstream')}' of server "
                f"'{match.get('server')}' (entry {match.get('entry')}, "
                f"{match.get('entry_state')})"
            ),
        )
        grid.add_row("why", _text(match.get("rule")))
        filt = match.get("filter")
        if filt:
            grid.add_row("filter", _text(f"{filt} = {json.dumps(policy.get(filt))}"))
        source = match.get("source")
        grid.add_row(
            "set by",
            _text(f"server '{match.get('server')}' in {source}" if source else "-"),
        )
        grid.add_row("policy", _text(_policy_text(policy)))
        seen = [
            f"{o.get('session')} ({o.get('name')}) as {o.get('exposed')}"
            for o in match.get("seen_by") or []
        ]
        hidden = [
            f"{o.get('session')} ({o.get('name')}): {o.get('rule')}"
            for o in match.get("hidden_from") or []
        ]
        grid.add_row("seen by", _text("; ".join(seen) or "no other session"))
        if hidden:
            grid.add_row("hidden in", _text("; ".join(hidden)))
        _print(grid)


def _policy_text(policy: dict[str, Any]) -> str:
    parts = []
    for field in ("trust", "includeTools", "excludeTools", "alwaysLoadTools"):
        value = policy.get(field)
        parts.append(f"{field} {'-' if value is None else json.dumps(value)}")
    return ", ".join(parts)


def _grid() -> Table:
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    return grid


def _render_tools(tools: list[dict[str, Any]]) -> None:
    if not tools:
        _print("no tools or prompts")
        return
    # A column for calls refused by the current settings, only while some are (a reload
    # waiting for new servers): the usual table stays as it was.
    refused = any(tool.get("refused") for tool in tools)
    columns = ("EXPOSED", "KIND", "SERVER", "ENTRY", "UPSTREAM")
    table = _table(*columns, "CALLS") if refused else _table(*columns)
    for tool in tools:
        cells = [_text(tool.get(key)) for key in ("exposed", "kind", "server", "entry", "upstream")]
        if refused:
            why = tool.get("refused")
            cells.append(_text(f"refused: {why}" if why else "ok"))
        table.add_row(*cells)
    _print(table)
