"""The daemon process: its state, its nurseries, signals, bounded shutdown and `main`.

The daemon's jobs live in rooms, one module each, chained as base classes of `Daemon` (each
uses only what the rooms below it define): `_core` (the state every room reads, the log, how it
stops, how a fenced fault is logged), `_hosting` (settings files, what each session desires,
the reload gate), `_admin_api` (daemonctl's commands), `_explain` (`daemonctl explain`) and
`_connections` (accepting, the first message, attach and the hand-off, serving a session).

Theory of operation: `Daemon.run` owns two nurseries. The pool's nursery holds one supervisor
per upstream entry; the connection nursery holds the accept loop, the signal watcher and one
task per client connection. Shutdown (L5) stops accepting, closes every session, then closes the
pool (each entry per L4), all inside `shutdownTimeout`, and removes the socket.

A connection's first message decides what it is (attach, admin, or an implicit attach for a raw
MCP client). Session connections are relayed with direct fd I/O (`mcpool.pool._fdio`).
Settings changes go through one reload gate (S7): a reload re-reads every settings file and
reconciles the affected sessions one by one; each session also has its own lock so an attach's
first reconciliation and a reload never interleave for one session.

Shared tasks and their fences (README "Shared tasks and their fences"); no peer's input may
raise in one of these:
- accept loop: each connection runs under `_serve_fenced` (its error ends it, logged with its
  traceback); a write to a peer that hung up (refusal, attach answer, admin answer) ends that
  connection only (`WriterClosed` is caught where the write is); kernel accept errors retry.
- pool supervisors and upstream readers (pool nursery): an upstream's failure is its entry's.
- settings watcher and SIGHUP: a bad file keeps its previous generation and reports the error;
  a reload's own error is logged with its traceback (`_reload_fenced`), and watching goes on.
- bridge-socket watcher (`_BridgeSockets`): a bridge's end closes its own session only.
- notifier / fan-out: a change only marks sessions; a session whose write fails (it stopped
  reading, or left) is closed, alone (`Session.send`).
- HTTP endpoint (daemon/_http.py): each request fenced (500), broken HTTP a 400, each HTTP
  session's tasks fenced.
- admin API (`_admin_request`): params typed first (daemon/_admin.py); a handler's unexpected
  error is an internal error to its caller, logged with its traceback.
What still escapes reaches `run`, which logs it with its traceback (log and stderr) and exits
EXIT_FAILED; a requested stop exits EXIT_STOPPED (README "Exit status").
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from mcpool.pool import (
    Guardian,
    Handle,
    Pool,
)
from mcpool.session._cursors import CursorBook

from . import _admin, _paths
from ._admin_api import RESTART_WAIT, _forced_failure, _tail, _tree_rss  # noqa: F401
from ._connections import (  # noqa: F401
    _ATTACH,
    CLOSE_LINGER,
    EXIT_FAILED,
    FIRST_MESSAGE_TIMEOUT,
    HANDOFF_DRAIN_BOUND,
    HANDOFF_FDS,
    ConnectionServer,
    DetachPacer,
    _at_fd_limit,
    _BridgeSockets,
    _linger_close,
    _recv_with_fds,
    _usable_stdio,
)
from ._core import EXIT_STOPPED, _SessionState
from ._detach import StatusPipe
from ._hosting import _DAEMON_LEASE, _DaemonLease  # noqa: F401
from ._listener import FdReserve, ListenSocket, take_lock
from ._log import JsonLinesLog, normalize_level
from ._login import Logins
from ._settings import (
    DaemonOptions,
    LoadedFile,
)
from ._snapshots import FileSnapshotStore
from ._watch import SettingsWatcher
from ._watched import WatchedFiles

LOG_MEMORY_LINES = 2000  # what `daemonctl logs` shows of the daemon's own log


GC_GEN0_THRESHOLD = 20_000  # allocations between young-generation collections (default 700)


KILL_REAP_BOUND = 1.0  # after the shutdown bound's SIGKILL, time to reap before exiting


# On shutdown, the error answers to every in-flight call reach clients that still read within
# this; one that stopped reading must not hold the shutdown.
SHUTDOWN_DRAIN_BOUND = 1.0


# Shutdown closes sessions in batches of this many, yielding between them: with thousands of
# sessions the shutdown timeout can still cut in, and other tasks are not starved meanwhile.
SHUTDOWN_CLOSE_BATCH = 100


# Sessions whose clients left at once are closed this many per scheduler batch: a client closing
# hundreds of sessions must not hold the loop from the sessions still calling (issue 17).
DETACH_BATCH = 4


def main(argv: list[str]) -> int:
    status = StatusPipe()
    try:
        exit_status = _main(argv, status)
    except BaseException as exc:
        # What escaped (a bug, a usage error): a starter waiting on the pipe learns it in a line.
        code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
        status.exited(code, f"{type(exc).__name__}: {exc}")
        raise
    status.exited(exit_status, "")  # a no-op once it said `serving` or why it stopped
    return exit_status


def _main(argv: list[str], status: StatusPipe) -> int:
    parser = argparse.ArgumentParser(prog="mcpool daemon", description="Run the mcpool daemon.")
    parser.add_argument("--socket", help="Unix socket path (default: $MCPOOL_SOCKET or XDG)")
    parser.add_argument("--config", help="config file (default: $MCPOOL_CONFIG or XDG)")
    parser.add_argument(
        "--log-level",
        type=normalize_level,
        default=None,
        help="debug, info, warning or error (default: the config's daemon.logLevel, else info)",
    )
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="also serve MCP over streamable HTTP at http://HOST:PORT/mcp (loopback only)",
    )
    parser.add_argument(
        "--http-allow-remote",
        action="store_true",
        help="let --http bind a non-loopback address (whoever reaches it can use your servers)",
    )
    # Given by whoever started this daemon detached (daemon/_detach.py): the pipe it waits on.
    parser.add_argument("--status-fd", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    status.open(args.status_fd)
    http_bind: tuple[str, int, bool] | None = None
    if args.http:
        import importlib.util

        from ._http import bind_is_loopback, parse_bind

        try:
            host, port = parse_bind(args.http)
        except ValueError as exc:
            parser.error(f"--http: {exc}")
        if importlib.util.find_spec("h11") is None:
            parser.error(
                "--http needs h11, a dependency of mcpool that is missing: reinstall mcpool"
            )
        if not (bind_is_loopback(host) or args.http_allow_remote):
            parser.error(f"--http {args.http}: not a loopback address (see --http-allow-remote)")
        http_bind = (host, port, args.http_allow_remote)
    sock_path = str(_paths.socket_path(args.socket))
    config = str(_paths.config_path(args.config))
    try:
        # X3: the folder is ours (created 0700 when missing) before the lock is taken in it;
        # the path fits a socket address.
        _paths.prepare_socket_dir(Path(sock_path))
    except _paths.UnsafeSocketPath as exc:
        sys.stderr.write(f"mcpool daemon: {exc}\n")
        status.exited(1, str(exc))
        return 1
    lock_fd = take_lock(sock_path)
    if lock_fd is None:
        sys.stderr.write(f"mcpool daemon: another daemon already serves {sock_path}\n")
        status.exited(EXIT_STOPPED, f"another daemon already serves {sock_path}")
        # 0: what was asked for (a daemon serving this socket) holds. `mcpool attach` relies on
        # it (racing bridges each start one; a loser's 0 says "retry the connect", anything else
        # "the daemon failed to start"), and a supervisor must not restart a loser into the same
        # lock again.
        return EXIT_STOPPED
    daemon = Daemon(sock_path, config, args.log_level)
    daemon.listen.lock_fd = lock_fd
    daemon.http_bind = http_bind
    daemon.journal.path = _paths.daemon_log_path(Path(sock_path))
    daemon.serving = status.serving
    try:
        exit_status: int = trio.run(daemon.run)
        status.exited(exit_status, daemon.failure)
        return exit_status
    except KeyboardInterrupt:
        # A ^C before the signal watcher runs: still a requested stop.
        return EXIT_STOPPED
    except BaseExceptionGroup as group:
        # The same ^C, raised inside a task of a nursery (trio groups it).
        if group.split(KeyboardInterrupt)[1] is None:
            return EXIT_STOPPED
        raise
    finally:
        daemon.journal.close()
        if daemon.listen.lock_fd is not None:
            os.close(daemon.listen.lock_fd)  # the one it holds now (a new one after re-creation)


class Daemon(ConnectionServer):
    """One per user: `run` is the process; the rooms it inherits from do the work."""

    def __init__(self, sock_path: str, config_path: str, log_level: str | None = None) -> None:
        self.sock_path = sock_path
        self.config_path = config_path
        self.pid = os.getpid()
        self.started_wall = time.time()
        self.started = 0.0
        self.files: dict[str, LoadedFile] = {}
        self.sessions: dict[str, _SessionState] = {}
        # The config plus every session's sources, counted per session (O(1) attach/detach).
        self.watched = WatchedFiles([config_path])
        self.settings_generation = 0
        self.reload_gate = trio.Lock()
        self._detach_pacer = DetachPacer(DETACH_BATCH)
        self.stop_requested = trio.Event()
        self.exit_status = EXIT_STOPPED  # set by the first reason to stop (`request_stop`)
        self._shared_nursery: trio.Nursery | None = None  # the accept loop's, for the test hook
        self.admin_commands = dict(_admin.COMMANDS)
        if os.environ.get(_admin.TEST_HOOKS_ENV) == "1":
            self.admin_commands.update(_admin.TEST_COMMANDS)
        self._admin_handlers = self.admin_handler_table()
        self.log_lines: collections.deque[str] = collections.deque(maxlen=LOG_MEMORY_LINES)
        self.notes: list[str] = []
        self._cli_log_level = log_level
        self.journal = JsonLinesLog(level=log_level or "info")
        self.options = DaemonOptions()
        self.pool: Pool | None = None
        self.guardian: Guardian | None = None
        self.watcher = SettingsWatcher(self.files_changed, self.stale_files, log=self.log)
        self.bridges = _BridgeSockets(DETACH_BATCH)
        self._linger: set[int] = set()  # connections closed for an error: half-close and drain
        # `--http HOST:PORT`: the downstream streamable HTTP endpoint (daemon/_http.py), off
        # unless given; (host, port, allow_remote).
        self.http_bind: tuple[str, int, bool] | None = None
        # main() gives it the flock it took for this socket; it may have to take a new one.
        self.listen = ListenSocket(sock_path, None, self.log)
        self.fd_reserve = FdReserve()
        self.logins = Logins(self)  # OAuth (issue 16): the token broker and logins running
        # Every list a session was served with a next page, for its cursors (issue 29 item 6):
        # one book for all sessions, since pages are cached on lists sessions share.
        self.cursors: CursorBook[tuple[dict[str, Any], ...]] = CursorBook(trio.current_time)
        # The daemon's own leases on the user file's `"start": "always"` servers (L6).
        self.kept: dict[str, Handle] = {}
        # Told the pid once the socket listens: main() gives it the starter's status pipe.
        self.serving: Callable[[int], None] = lambda pid: None
        self.failure = ""  # why `run` failed, in one line (for a starter still waiting)

    async def run(self) -> int:
        self.started = trio.current_time()
        self.load_file(self.config_path)
        self.apply_daemon_options()
        # Everything imported so far lives as long as the process: keep it out of collections,
        # and collect the young generation less often (each relayed call allocates a few
        # short-lived objects; frequent gen-0 passes showed up as latency tails).
        gc.freeze()
        gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])
        self.guardian = Guardian()
        try:
            async with trio.open_nursery() as pool_nursery:
                self.pool = Pool(
                    pool_nursery,
                    self._pool_options(),
                    guardian=self.guardian,
                    log=self.log,
                    snapshots=FileSnapshotStore(_paths.snapshots_dir(), self.log),
                )
                pool_nursery.start_soon(self.guardian.watch, self.log)
                self.keep_always()
                if self.options.prewarm:
                    self.prewarm()
                async with trio.open_nursery() as conn_nursery:
                    self._shared_nursery = conn_nursery
                    # Signals first: once the socket answers, SIGTERM or SIGINT is a stop (exit 0),
                    # never the default death or a KeyboardInterrupt in whichever task runs.
                    await conn_nursery.start(self._watch_signals)
                    self.listen.bind()
                    self.log("info", "daemon started", pid=self.pid, socket=self.sock_path)
                    self.serving(self.pid)
                    conn_nursery.start_soon(self._accept_loop)
                    conn_nursery.start_soon(self.listen.run, self._stop_for)
                    conn_nursery.start_soon(self.bridges.run)
                    conn_nursery.start_soon(self.logins.run)
                    self.watcher.watch(self.watched_files())
                    conn_nursery.start_soon(self.watcher.run)
                    if self.http_bind is not None:
                        conn_nursery.start_soon(self._serve_http)
                    await self.stop_requested.wait()
                    self.log("info", "shutting down")
                    self.watcher.close()
                    self.listen.close()
                    with trio.move_on_after(self.options.shutdown_timeout, shield=True) as scope:
                        closing = list(self.sessions.values())
                        for i, st in enumerate(closing, 1):
                            # Answers every request in flight with an error naming the reason.
                            st.session.close("the daemon is shutting down")
                            if i % SHUTDOWN_CLOSE_BATCH == 0:
                                await trio.lowlevel.checkpoint()  # the bound can cut in
                        with trio.move_on_after(SHUTDOWN_DRAIN_BOUND):
                            for st in closing:
                                await st.session.out.wait_drained()
                        conn_nursery.cancel_scope.cancel()
                        await self.pool.aclose()
                    if scope.cancelled_caught:
                        self.log("warning", "shutdown timed out; remaining upstreams are killed")
                        self.pool.kill_all()
                        # SIGKILL cannot be ignored: this only lets the supervisors reap.
                        with trio.move_on_after(KILL_REAP_BOUND, shield=True):
                            await self.pool.aclose()
                pool_nursery.cancel_scope.cancel()
        except Exception as exc:  # a bug in a task every session depends on: say it, exit 1
            self._failed(exc)
        finally:
            # Only the socket we bound: after a take-over the path is another daemon's.
            if self.listen.is_ours():
                with contextlib.suppress(OSError):
                    os.unlink(self.sock_path)
            self.fd_reserve.close()
            if self.guardian is not None:
                self.guardian.close()
            self.bridges.close()
            self.log("info", "daemon stopped", exit_status=self.exit_status)
        return self.exit_status

    def _failed(self, exc: BaseException) -> None:
        """An unexpected error ended the daemon: its traceback goes to the daemon log and to
        stderr (systemd's journal), and the exit status says it failed."""
        self.exit_status = EXIT_FAILED
        text = "".join(traceback.format_exception(exc))
        leaf = exc
        while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
            leaf = leaf.exceptions[0]
        summary = f"{type(leaf).__name__}: {leaf}"
        self.failure = summary
        self.log("error", f"daemon failed: {summary}", traceback=text)
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"mcpool daemon: failed: {summary}\n{text}")
            sys.stderr.flush()

    def _stop_for(self, reason: str) -> None:
        self.log("info", f"stopping: {reason}")
        self.request_stop()

    async def _watch_signals(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            task_status.started()
            async for signum in signals:
                if signum == signal.SIGHUP:
                    self.log("info", "SIGHUP: reloading settings")
                    await self._reload_fenced("SIGHUP")
                else:
                    self.log("info", f"received {signal.Signals(signum).name}")
                    self.request_stop()
