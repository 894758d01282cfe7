"""What every room of the daemon shares: its state (assigned by `Daemon.__init__`), its log, how it
stops and how a fenced fault is logged.

A room of `Daemon` (daemon/_daemon.py): the rooms form one chain of base classes,
_core <- _hosting <- _admin_api <- _explain <- _connections <- _daemon, each using only what
the rooms below it define.
"""

from __future__ import annotations

import collections
import contextlib
import traceback
from typing import TYPE_CHECKING, Any

import trio

from mcpool.pool import (
    FdWriter,
    Guardian,
    Handle,
    Pool,
    ServerSettings,
    WriterClosed,
)
from mcpool.protocol import (
    McpoolError,
    Message,
    decode,
    error_response,
)
from mcpool.session import (
    Session,
)
from mcpool.session._cursors import CursorBook

from . import _admin
from ._listener import FdReserve, ListenSocket
from ._log import JsonLinesLog
from ._login import Logins
from ._settings import (
    DaemonOptions,
    LoadedFile,
)
from ._watch import SettingsWatcher
from ._watched import WatchedFiles

if TYPE_CHECKING:
    from ._connections import DetachPacer, _BridgeSockets


# The daemon's exit status (README "Exit status"): systemd's `Restart=on-failure` restarts
# anything but 0.
EXIT_STOPPED = 0  # a requested stop (SIGTERM, SIGINT, `daemonctl stop`), or another daemon serves


class _SessionState:
    """Daemon-side facts about one session: its settings sources and runtime overrides."""

    def __init__(
        self, session: Session, sources: list[str], via: str, env: dict[str, str] | None = None
    ) -> None:
        self.session = session
        self.sources = sources
        # The values of the variables its settings reference, as its bridge sent them; None:
        # no bridge (raw socket, HTTP), which expands from the daemon's base environment.
        self.env = env
        # Entries desired_for refused (unset variable, self-launch, bad value, missing cwd):
        # name -> (file, error), for `daemonctl status` / `servers` and to log each once.
        self.skipped: dict[str, tuple[str, str]] = {}
        # How the client reaches the session: "attach" (its stdio handed to the daemon),
        # "attach-relay" (through the bridge's relay), "socket" (a raw client) or "http".
        self.via = via
        self.overrides: dict[str, tuple[ServerSettings, str]] = {}
        self.lock = trio.Lock()


class DaemonCore:
    # The daemon's state, assigned by `Daemon.__init__` (daemon/_daemon.py); declared here so
    # that each room is checked against it.
    sock_path: str
    config_path: str
    pid: int
    started_wall: float
    started: float
    files: dict[str, LoadedFile]
    sessions: dict[str, _SessionState]
    settings_generation: int
    reload_gate: trio.Lock
    stop_requested: trio.Event
    exit_status: int
    _shared_nursery: trio.Nursery | None
    admin_commands: dict[str, _admin.Command]
    log_lines: collections.deque[str]
    notes: list[str]
    _cli_log_level: str | None
    journal: JsonLinesLog
    options: DaemonOptions
    pool: Pool | None
    guardian: Guardian | None
    watcher: SettingsWatcher
    bridges: _BridgeSockets
    _linger: set[int]
    http_bind: tuple[str, int, bool] | None
    listen: ListenSocket
    fd_reserve: FdReserve
    logins: Logins
    cursors: CursorBook[tuple[dict[str, Any], ...]]
    kept: dict[str, Handle]
    watched: WatchedFiles
    _detach_pacer: DetachPacer

    def log(self, level: str, message: str, **fields: Any) -> None:
        line = self.journal.record(level, message, **fields)
        if line is not None:
            self.log_lines.append(line)

    def request_stop(self, status: int = EXIT_STOPPED) -> None:
        """Begin the bounded shutdown; the first reason given is the exit status."""
        if not self.stop_requested.is_set():
            self.exit_status = status
            self.stop_requested.set()

    async def _fail_and_close(self, fd: int, writer: FdWriter, exc: McpoolError) -> None:
        try:
            writer.write(self._error_line(None, exc))
        except Exception:
            return
        with trio.move_on_after(1.0):
            await writer.wait_drained()
        # Lingering waits on the peer: _serve_connection does it once the session is released.
        self._linger.add(fd)

    def _decode_or_refuse(self, line: bytes, writer: FdWriter) -> Message | list[Message] | None:
        """A line's message (or batch); None when it is not one, after answering the error (a
        peer that went away before reading it leaves `writer.closed` set: its connection ends)."""
        try:
            return decode(line)
        except McpoolError as exc:
            with contextlib.suppress(WriterClosed):
                writer.write(self._error_line(None, exc))
            return None

    @staticmethod
    def _error_line(msg_id: Any, exc: McpoolError) -> bytes:
        obj = exc.to_error_object()
        return error_response(msg_id, obj.code, obj.message, obj.data)

    def _log_fault(self, where: str, exc: BaseException, **fields: Any) -> None:
        """An unexpected exception that a fence stopped: logged with its traceback."""
        trace = "".join(traceback.format_exception(exc)).rstrip()
        leaf = exc
        while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
            leaf = leaf.exceptions[0]  # the nursery's group around the one real error
        self.log("error", f"internal error while {where}: {leaf!r}", traceback=trace, **fields)
