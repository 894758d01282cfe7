"""The daemon process: the objects it is made of, its nurseries, signals, bounded shutdown and
`main`.

`Daemon` makes its parts and owns the nurseries they run in; each part owns its state and is
given the parts it uses at construction (docs/architecture.md has the picture):
- made at once: `DaemonProcess` (_core: identity, log, stop), `SettingsFiles` (_settings_files:
  the files read, the daemon's options, what a session desires) and `AttachedSessions`
  (_attached: the records of the sessions attached);
- made in `run`, once the pool exists: `Pool`, `Logins` (_login), `DaemonLeases` and
  `SettingsHost` (_hosting: reloads, the watcher), `Sessions` (_sessions: open and close, the
  HTTP endpoint's `SessionHost`), `AdminApi` (_admin_api: daemonctl's handler table) and
  `ConnectionServer` (_connections: accepting, attach and the hand-off, serving a session).

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
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from mcpool import __version__
from mcpool.pool import Guardian, Pool
from mcpool.session import Interner
from mcpool.session._cursors import CursorBook

from . import _admin, _paths
from ._admin_api import AdminApi
from ._attached import AttachedSessions, SessionRecord
from ._connections import ConnectionServer
from ._core import EXIT_FAILED, EXIT_STOPPED, DaemonProcess
from ._detach import StatusPipe
from ._hosting import DaemonLeases, SettingsHost
from ._ledger import Ledger
from ._listener import FdReserve, ListenSocket, take_lock
from ._log import JsonLinesLog, normalize_level
from ._login import Logins
from ._pinkeeper import PinKeeper, pins_dir
from ._sessions import Sessions
from ._settings import DaemonOptions
from ._settings_files import SettingsFiles
from ._snapshots import FileSnapshotStore

GC_GEN0_THRESHOLD = 20_000  # allocations between young-generation collections (default 700)


KILL_REAP_BOUND = 1.0  # after the shutdown bound's SIGKILL, time to reap before exiting


# On shutdown, the error answers to every in-flight call reach clients that still read within
# this; one that stopped reading must not hold the shutdown.
SHUTDOWN_DRAIN_BOUND = 1.0


# Shutdown closes sessions in batches of this many, yielding between them: with thousands of
# sessions the shutdown timeout can still cut in, and other tasks are not starved meanwhile.
SHUTDOWN_CLOSE_BATCH = 100


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


class Daemon:
    """One per user: `run` is the process. It makes the daemon's parts and owns their nurseries."""

    def __init__(self, sock_path: str, config_path: str, log_level: str | None = None) -> None:
        self.process = DaemonProcess(sock_path, log_level)
        # The daemon's interning tables (session/_interner.py), handed to the pool, the settings
        # and every session; `daemonctl status --json` reports them.
        self.interner = Interner()
        self.settings = SettingsFiles(config_path, self.process, self.interner)
        self.attached = AttachedSessions()
        # `--http HOST:PORT`: the downstream streamable HTTP endpoint (daemon/_http.py), off
        # unless given; (host, port, allow_remote).
        self.http_bind: tuple[str, int, bool] | None = None
        # main() gives it the flock it took for this socket; it may have to take a new one.
        self.listen = ListenSocket(sock_path, None, self.process.log)
        self.fd_reserve = FdReserve()
        # Every list a session was served with a next page, for its cursors (issue 29 item 6):
        # one book for all sessions, since pages are cached on lists sessions share.
        self.cursors: CursorBook[tuple[dict[str, Any], ...]] = CursorBook(trio.current_time)
        self.commands = dict(_admin.COMMANDS)
        if os.environ.get(_admin.TEST_HOOKS_ENV) == "1":
            self.commands.update(_admin.TEST_COMMANDS)
        # Told the pid once the socket listens: main() gives it the starter's status pipe.
        self.serving: Callable[[int], None] = lambda pid: None
        self.failure = ""  # why `run` failed, in one line (for a starter still waiting)
        self.ready = trio.Event()  # set once the socket listens and the parts are made
        self._pool: Pool | None = None
        # The ledger of answered calls: audit log, statistics, OpenTelemetry when asked for
        # (issue 30; daemon/_ledger.py). Made in `run`, with the state folder known.
        self.ledger: Ledger | None = None
        # The pin book of tool and prompt definitions (issue 30; daemon/_pinkeeper.py).
        self.pins: PinKeeper | None = None

    # -- what tests and main() read ------------------------------------------------------------

    @property
    def sock_path(self) -> str:
        return self.process.sock_path

    @property
    def config_path(self) -> str:
        return self.settings.config_path

    @property
    def journal(self) -> JsonLinesLog:
        return self.process.journal

    @property
    def log_lines(self) -> collections.deque[str]:
        return self.process.log_lines

    @property
    def options(self) -> DaemonOptions:
        return self.settings.options

    @property
    def sessions(self) -> dict[str, SessionRecord]:
        return self.attached.by_id

    @property
    def pool(self) -> Pool:
        """The running daemon's pool (`ready` is set once there is one)."""
        if self._pool is None:
            raise RuntimeError("the daemon is not running")
        return self._pool

    def request_stop(self, status: int = EXIT_STOPPED) -> None:
        self.process.request_stop(status)

    # -- the process ---------------------------------------------------------------------------

    async def run(self) -> int:
        process = self.process
        process.started = trio.current_time()
        self.settings.load_file(self.config_path)
        self.settings.apply_daemon_options()
        # Everything imported so far lives as long as the process: keep it out of collections,
        # and collect the young generation less often (each relayed call allocates a few
        # short-lived objects; frequent gen-0 passes showed up as latency tails).
        gc.freeze()
        gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])
        guardian = Guardian()
        ledger = self.ledger = Ledger.for_daemon(__version__)
        pins = self.pins = PinKeeper(
            pins_dir(), lambda: self.settings.options.pinning, self.process.log
        )
        async with trio.open_nursery() as ledger_nursery:
            # Outlive the sessions and the pool: what they told them is written at the end.
            ledger_nursery.start_soon(self._run_fenced, ledger.run, "the audit log")
            ledger_nursery.start_soon(self._run_fenced, pins.run, "the pin file's writer")
            status = await self._run_parts(guardian, ledger, pins)
            ledger_nursery.cancel_scope.cancel()
        return status

    async def _run_fenced(self, run: Callable[[], Awaitable[None]], what: str) -> None:
        """An owner task of what the daemon writes, fenced: a file that cannot be written
        loses what it keeps (said in the log), never the daemon."""
        try:
            await run()
        except Exception as exc:
            self.process.log(
                "error",
                f"{what} stopped: {type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(),
            )

    async def _run_parts(self, guardian: Guardian, ledger: Ledger, pins: PinKeeper) -> int:
        process = self.process
        log = process.log
        try:
            async with trio.open_nursery() as pool_nursery:
                pool = self._pool = Pool(
                    pool_nursery,
                    self.settings.pool_options(),
                    guardian=guardian,
                    log=log,
                    snapshots=FileSnapshotStore(_paths.snapshots_dir(), log),
                    tables=self.interner.pool,
                )
                pool_nursery.start_soon(guardian.watch, log)
                # OAuth (issue 16): the token broker and logins running; made before any server
                # starts, since every HTTP upstream's OAuth goes through its broker.
                logins = Logins(pool, self.settings, log)
                leases = DaemonLeases(pool, self.settings, log)
                host = SettingsHost(self.settings, self.attached, pool, leases, log)
                sessions = Sessions(
                    self.attached,
                    host,
                    pool,
                    process,
                    logins=logins,
                    cursors=self.cursors,
                    interner=self.interner,
                    observer=ledger,
                    pins=pins,
                )
                leases.keep_always()
                if self.options.prewarm:
                    leases.prewarm()
                async with trio.open_nursery() as conn_nursery:
                    admin = AdminApi(
                        process,
                        host,
                        self.attached,
                        pool,
                        logins,
                        cursors=self.cursors,
                        interner=self.interner,
                        spawn_shared=conn_nursery.start_soon,
                        commands=self.commands,
                        ledger=ledger,
                        pins=pins,
                    )
                    connections = ConnectionServer(
                        process,
                        sessions,
                        admin,
                        self.listen,
                        self.fd_reserve,
                        options=lambda: self.settings.options,
                    )
                    # Signals first: once the socket answers, SIGTERM or SIGINT is a stop (exit 0),
                    # never the default death or a KeyboardInterrupt in whichever task runs.
                    await conn_nursery.start(self._watch_signals, host)
                    self.listen.bind()
                    log("info", "daemon started", pid=process.pid, socket=self.sock_path)
                    self.serving(process.pid)
                    conn_nursery.start_soon(connections.run)
                    conn_nursery.start_soon(self.listen.run, self._stop_for)
                    conn_nursery.start_soon(logins.run)
                    host.watcher.watch(self.settings.watched_files())
                    conn_nursery.start_soon(host.watcher.run)
                    if self.http_bind is not None:
                        conn_nursery.start_soon(self._serve_http, sessions)
                    self.ready.set()
                    await process.stop_requested.wait()
                    log("info", "shutting down")
                    host.watcher.close()
                    self.listen.close()
                    with trio.move_on_after(self.options.shutdown_timeout, shield=True) as scope:
                        closing = list(self.attached)
                        for i, st in enumerate(closing, 1):
                            # Answers every request in flight with an error naming the reason.
                            st.session.close("the daemon is shutting down")
                            if i % SHUTDOWN_CLOSE_BATCH == 0:
                                await trio.lowlevel.checkpoint()  # the bound can cut in
                        with trio.move_on_after(SHUTDOWN_DRAIN_BOUND):
                            for st in closing:
                                await st.session.out.wait_drained()
                        conn_nursery.cancel_scope.cancel()
                        await pool.aclose()
                    if scope.cancelled_caught:
                        log("warning", "shutdown timed out; remaining upstreams are killed")
                        pool.kill_all()
                        # SIGKILL cannot be ignored: this only lets the supervisors reap.
                        with trio.move_on_after(KILL_REAP_BOUND, shield=True):
                            await pool.aclose()
                pool_nursery.cancel_scope.cancel()
        except Exception as exc:  # a bug in a task every session depends on: say it, exit 1
            self._failed(exc)
        finally:
            # Only the socket we bound: after a take-over the path is another daemon's.
            if self.listen.is_ours():
                with contextlib.suppress(OSError):
                    os.unlink(self.sock_path)
            self.fd_reserve.close()
            guardian.close()
            log("info", "daemon stopped", exit_status=process.exit_status)
        return process.exit_status

    def _failed(self, exc: BaseException) -> None:
        """An unexpected error ended the daemon: its traceback goes to the daemon log and to
        stderr (systemd's journal), and the exit status says it failed."""
        self.process.exit_status = EXIT_FAILED
        text = "".join(traceback.format_exception(exc))
        leaf = exc
        while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
            leaf = leaf.exceptions[0]
        summary = f"{type(leaf).__name__}: {leaf}"
        self.failure = summary
        self.process.log("error", f"daemon failed: {summary}", traceback=text)
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"mcpool daemon: failed: {summary}\n{text}")
            sys.stderr.flush()

    def _stop_for(self, reason: str) -> None:
        self.process.log("info", f"stopping: {reason}")
        self.process.request_stop()

    async def _watch_signals(
        self, host: SettingsHost, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        log = self.process.log
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            task_status.started()
            async for signum in signals:
                if signum == signal.SIGHUP:
                    log("info", "SIGHUP: reloading settings")
                    await host.reload_fenced("SIGHUP")
                else:
                    log("info", f"received {signal.Signals(signum).name}")
                    self.process.request_stop()

    async def _serve_http(self, sessions: Sessions) -> None:
        """`--http`: the streamable HTTP endpoint; a bind failure stops the daemon (it was asked
        for explicitly, and a daemon silently without it would look like a client bug)."""
        from ._http import HttpEndpoint

        assert self.http_bind is not None
        host, port, allow_remote = self.http_bind
        endpoint = HttpEndpoint(
            sessions,
            (host, port),
            allow_remote=allow_remote,
            options=lambda: self.settings.options,
        )
        try:
            await endpoint.serve()
        except OSError as exc:
            self.process.log("error", f"HTTP endpoint not started on {host}:{port}: {exc}")
            sys.stderr.write(f"mcpool daemon: cannot serve HTTP on {host}:{port}: {exc}\n")
            self.process.request_stop(EXIT_FAILED)  # asked for and not served: a failure
