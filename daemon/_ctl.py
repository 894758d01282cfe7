"""`daemonctl`: inspect and control the mcpool daemon over its admin socket.

Each command is one `mcpool/admin/<command>` request on one connection (COMMON.md). `--json`
prints the daemon's result unchanged; otherwise rich renders a table, imported only then.
Exit status: 0 ok, 1 the daemon answered with an error or the command failed, 2 usage, 3 no
daemon running.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mcpool.daemon._paths import socket_path

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


class NoDaemonError(Exception):
    pass


class CommandError(Exception):
    """Printed as `daemonctl: <message>`; exit status 1."""


class AdminClient:
    """One admin connection: newline-delimited JSON-RPC requests, each answered in turn."""

    def __init__(self, path: os.PathLike[str] | str, timeout: float = REQUEST_TIMEOUT) -> None:
        self.path = str(path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(self.path)
        except (FileNotFoundError, ConnectionRefusedError):
            self._sock.close()
            raise NoDaemonError(self.path) from None
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


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
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
    tools = add("tools", "the tools and prompts one session sees")
    tools.add_argument("session", metavar="SESSION")
    tools.add_argument("--server", metavar="NAME")
    restart = add("restart", "restart every running entry of a server")
    restart.add_argument("name", metavar="NAME")
    add("reload", "re-read the settings files now")
    logs = add("logs", "the daemon's log, or one server's stderr")
    logs.add_argument("name", metavar="NAME", nargs="?")
    logs.add_argument("-n", "--lines", type=_positive_int, default=50, metavar="N")
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
    return parser


# --- main --------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    path = socket_path(getattr(args, "socket", None))
    as_json: bool = getattr(args, "json", False)
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
    result = client.call("restart", {"name": args.name})
    if as_json:
        _print_json(result)
        return EXIT_OK
    entries = result.get("entries") or []
    if not entries:
        _print(f"no running entry of {_text(args.name)}")
        return EXIT_OK
    table = _table("ENTRY", "RESULT")
    for entry in entries:
        table.add_row(_text(entry.get("id")), _text(entry.get("result")))
    _print(table)
    return EXIT_OK


def _cmd_reload(client: AdminClient, args: argparse.Namespace, as_json: bool) -> int:
    result = client.call("reload", {})
    files = result.get("files") or []
    if as_json:
        _print_json(result)
    else:
        table = _table("FILE", "STATUS", "ERROR")
        for item in files:
            table.add_row(
                _text(item.get("path")), _text(item.get("status")), _text(item.get("error"))
            )
        _print(table)
    # A file the daemon could not use is a failed reload, even though the daemon answered.
    failed = any(item.get("status") == "error" for item in files)
    return EXIT_FAILED if failed else EXIT_OK


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
    tty = sys.stdout.isatty() and not as_json
    if tty:
        with _console().status(f"stopping mcpool daemon (pid {pid})"):
            stopped = _wait_stopped(client.path, pid)
    else:
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
    # A daemon started by `mcpool attach` stays that bridge's child until the bridge notices the
    # closed socket and exits; a zombie has stopped all the same.
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
    "restart": _cmd_restart,
    "reload": _cmd_reload,
    "logs": _cmd_logs,
    "stop": _cmd_stop,
    "session": _cmd_session,
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
    grid.add_row("rss", _mib(status.get("rss")))
    _print(grid)
    config = status.get("config") or []
    if config:
        sys.stdout.write("\n")
        table = _table("CONFIG", "KIND", "STATUS", "LOADED", "ERROR")
        for item in config:
            table.add_row(
                _text(item.get("path")),
                _text(item.get("kind")),
                _text(item.get("status")),
                _text(_when(item.get("loaded_at"))),
                _text(item.get("error")),
            )
        _print(table)
    errors = status.get("registry_errors") or []
    if errors:
        sys.stdout.write("\n")
        table = _table("SESSION", "REGISTRY ERROR")
        for item in errors:
            table.add_row(_text(item.get("session")), _text(item.get("error")))
        _print(table)
    for note in status.get("notes") or []:
        _print(f"note: {_text(note)}")


def _render_servers(servers: list[dict[str, Any]]) -> None:
    if not servers:
        _print("no servers")
        return
    # Only these fields, by name: whatever else an entry carries (env, headers) is never shown.
    table = _table(
        "NAME", "ID", "STATE", "REFS", "PID", "STARTED", "ERA", "RESTARTS", "RSS", "LAST ERROR"
    )
    for server in servers:
        table.add_row(
            _text(server.get("name")),
            _text(server.get("id")),
            _text(server.get("state")),
            str(len(server.get("refs") or [])),
            _text(server.get("pid")),
            _text(_when(server.get("started_at"))),
            _text(server.get("era")),
            _text(server.get("restarts")),
            _mib(server.get("rss")),
            _text(server.get("last_error")),
        )
    _print(table)


def _render_sessions(sessions: list[dict[str, Any]]) -> None:
    if not sessions:
        _print("no sessions")
        return
    table = _table("ID", "NAME", "CWD", "ATTACHED", "SERVERS", "GENERATION", "PENDING")
    for session in sessions:
        table.add_row(
            _text(session.get("id")),
            _text(session.get("name")),
            _text(session.get("cwd")),
            _text(_when(session.get("attached_at"))),
            _text(", ".join(session.get("servers") or []) or None),
            _text(session.get("generation")),
            _text(session.get("pending_notifications")),
        )
    _print(table)


def _render_tools(tools: list[dict[str, Any]]) -> None:
    if not tools:
        _print("no tools or prompts")
        return
    table = _table("EXPOSED", "KIND", "SERVER", "ENTRY", "UPSTREAM")
    for tool in tools:
        table.add_row(
            _text(tool.get("exposed")),
            _text(tool.get("kind")),
            _text(tool.get("server")),
            _text(tool.get("entry")),
            _text(tool.get("upstream")),
        )
    _print(table)
