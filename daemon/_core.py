"""The daemon process itself: its identity, its log, how it stops, and how a fenced fault is logged.

`DaemonProcess` is made first (by `Daemon.__init__`) and given to every other object of the
daemon that logs or may ask it to stop; it knows none of them.
"""

from __future__ import annotations

import collections
import os
import time
import traceback
from typing import Any

import trio

from mcpool.protocol import McpoolError, error_response

from ._log import JsonLinesLog

# The daemon's exit status (README "Exit status"): systemd's `Restart=on-failure` restarts
# anything but 0.
EXIT_STOPPED = 0  # a requested stop (SIGTERM, SIGINT, `daemonctl stop`), or another daemon serves
EXIT_FAILED = 1  # an unexpected error (logged with its traceback), or a failure that stopped it

LOG_MEMORY_LINES = 2000  # what `daemonctl logs` shows of the daemon's own log


def error_line(msg_id: Any, exc: McpoolError) -> bytes:
    """The JSON-RPC error answer an McpoolError stands for."""
    obj = exc.to_error_object()
    return error_response(msg_id, obj.code, obj.message, obj.data)


class DaemonProcess:
    """Who the daemon is (pid, socket, start times), its log, and its stop."""

    def __init__(self, sock_path: str, log_level: str | None = None) -> None:
        self.sock_path = sock_path
        self.pid = os.getpid()
        self.started_wall = time.time()
        self.started = 0.0  # trio's clock at `Daemon.run`'s start
        self.journal = JsonLinesLog(level=log_level or "info")
        self.log_lines: collections.deque[str] = collections.deque(maxlen=LOG_MEMORY_LINES)
        # `--log-level` wins over the config's `daemon.logLevel` (`apply_log_level`).
        self._cli_log_level = log_level
        self.stop_requested = trio.Event()
        self.exit_status = EXIT_STOPPED  # set by the first reason to stop (`request_stop`)

    def log(self, level: str, message: str, **fields: Any) -> None:
        line = self.journal.record(level, message, **fields)
        if line is not None:
            self.log_lines.append(line)

    def wall_time(self, monotonic: float) -> float:
        """A time of trio's clock as wall-clock seconds."""
        return self.started_wall + (monotonic - self.started)

    def apply_log_level(self, configured: str, config_path: str) -> None:
        """The config's `daemon.logLevel`, unless `--log-level` was given."""
        try:
            self.journal.set_level(self._cli_log_level or configured)
        except ValueError as exc:
            self.journal.set_level("info")
            self.log("warning", f"daemon.logLevel ignored: {exc}", path=config_path)

    def request_stop(self, status: int = EXIT_STOPPED) -> None:
        """Begin the bounded shutdown; the first reason given is the exit status."""
        if not self.stop_requested.is_set():
            self.exit_status = status
            self.stop_requested.set()

    def log_fault(self, where: str, exc: BaseException, **fields: Any) -> None:
        """An unexpected exception that a fence stopped: logged with its traceback."""
        trace = "".join(traceback.format_exception(exc)).rstrip()
        leaf = exc
        while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
            leaf = leaf.exceptions[0]  # the nursery's group around the one real error
        self.log("error", f"internal error while {where}: {leaf!r}", traceback=trace, **fields)
