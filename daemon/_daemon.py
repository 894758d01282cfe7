"""The daemon process: socket listener, sessions, settings, admin API and bounded shutdown.

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
import errno
import gc
import os
import select
import signal
import socket
import stat
import struct
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import msgspec
import trio
from msgspec import UNSET

from mcpool import __version__
from mcpool.pool import (
    READ_CHUNK,
    FdWriter,
    Guardian,
    Handle,
    Pool,
    PoolEntry,
    PoolOptions,
    ServerSettings,
    TransportIdentity,
    Upstream,
    WriterClosed,
    identity_of,
    read_some,
)
from mcpool.pool._environ import base_environment
from mcpool.protocol import (
    ATTACH_FAILED,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    LineFramer,
    McpoolError,
    Message,
    MessageTooLarge,
    SettingsError,
    decode,
    error_response,
    notification,
    response,
)
from mcpool.session import (
    Desired,
    PolicyKey,
    Session,
    exposed_name,
    new_session_id,
    normalize_include,
    request_id,
    seen_as,
    user_name_forms,
)

from . import _admin, _paths
from ._expand import SelfLaunch, check_cwd, for_session, skip_message
from ._listener import FdReserve, ListenSocket, take_lock
from ._log import JsonLinesLog, normalize_level
from ._login import Logins
from ._settings import (
    DaemonOptions,
    LoadedFile,
    file_signature,
    parse_server_entry,
    read_settings_file,
    settings_base_dir,
)
from ._snapshots import FileSnapshotStore, describe_snapshot
from ._watch import SettingsWatcher
from ._watched import WatchedFiles

# The attach request decodes through the admin boundary's typed decoder (no handler: the
# connection code opens the session itself).
_ATTACH = _admin.Command(_admin.AttachParams, "attach")
LOG_MEMORY_LINES = 2000  # what `daemonctl logs` shows of the daemon's own log
GC_GEN0_THRESHOLD = 20_000  # allocations between young-generation collections (default 700)
KILL_REAP_BOUND = 1.0  # after the shutdown bound's SIGKILL, time to reap before exiting
RESTART_WAIT = 60.0  # `daemonctl restart` answers by then even if a server is still starting
FIRST_MESSAGE_TIMEOUT = 30.0  # a connection that says nothing is dropped after this
# After a refusal or an oversized message: time for the peer to read the error and close first.
CLOSE_LINGER = 1.0
# A handed-off session's last replies reach a client that is still reading within this; one that
# stopped reading must not hold the bridge (and the client waiting on it) open.
HANDOFF_DRAIN_BOUND = 1.0
# On shutdown, the error answers to every in-flight call reach clients that still read within
# this; one that stopped reading must not hold the shutdown.
SHUTDOWN_DRAIN_BOUND = 1.0
# Shutdown closes sessions in batches of this many, yielding between them: with thousands of
# sessions the shutdown timeout can still cut in, and other tasks are not starved meanwhile.
SHUTDOWN_CLOSE_BATCH = 100
# Sessions whose clients left at once are closed this many per scheduler batch: a client closing
# hundreds of sessions must not hold the loop from the sessions still calling (issue 17).
DETACH_BATCH = 8
# fds an attach may hand over (stdin, stdout); room for one more so that a sender of too many
# is seen (MSG_CTRUNC) rather than silently cut.
HANDOFF_FDS = 2

# The daemon's exit status (README "Exit status"): systemd's `Restart=on-failure` restarts
# anything but 0.
EXIT_STOPPED = 0  # a requested stop (SIGTERM, SIGINT, `daemonctl stop`), or another daemon serves
EXIT_FAILED = 1  # an unexpected error (logged with its traceback), or a failure that stopped it


class _DaemonLease:
    """The listener of the daemon's own leases (`"start": "always"`, prewarm): no session."""

    def snapshot_changed(self, entry: PoolEntry) -> None:
        pass

    def upstream_notification(self, entry: PoolEntry, method: str, params: Any) -> None:
        pass

    def server_request(self, entry: PoolEntry, upstream: Upstream, msg: Message) -> str | None:
        return "the daemon holds this server for no session; it has no client to ask"


_DAEMON_LEASE = _DaemonLease()


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


class Daemon:
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
        self._detach_pacer = trio.CapacityLimiter(DETACH_BATCH)
        self.stop_requested = trio.Event()
        self.exit_status = EXIT_STOPPED  # set by the first reason to stop (`request_stop`)
        self._shared_nursery: trio.Nursery | None = None  # the accept loop's, for the test hook
        self.admin_commands = dict(_admin.COMMANDS)
        if os.environ.get(_admin.TEST_HOOKS_ENV) == "1":
            self.admin_commands.update(_admin.TEST_COMMANDS)
        self.log_lines: collections.deque[str] = collections.deque(maxlen=LOG_MEMORY_LINES)
        self.notes: list[str] = []
        self._cli_log_level = log_level
        self.journal = JsonLinesLog(level=log_level or "info")
        self.options = DaemonOptions()
        self.pool: Pool | None = None
        self.guardian: Guardian | None = None
        self.watcher = SettingsWatcher(self.files_changed, self.stale_files, log=self.log)
        self.bridges = _BridgeSockets()
        self._linger: set[int] = set()  # connections closed for an error: half-close and drain
        # `--http HOST:PORT`: the downstream streamable HTTP endpoint (daemon/_http.py), off
        # unless given; (host, port, allow_remote).
        self.http_bind: tuple[str, int, bool] | None = None
        # main() gives it the flock it took for this socket; it may have to take a new one.
        self.listen = ListenSocket(sock_path, None, self.log)
        self.fd_reserve = FdReserve()
        self.logins = Logins(self)  # OAuth (issue 16): the token broker and logins running
        # The daemon's own leases on the user file's `"start": "always"` servers (L6).
        self.kept: dict[str, Handle] = {}

    # -- logging -------------------------------------------------------------------------------

    def log(self, level: str, message: str, **fields: Any) -> None:
        line = self.journal.record(level, message, **fields)
        if line is not None:
            self.log_lines.append(line)

    # -- settings ------------------------------------------------------------------------------

    def load_file(self, path: str) -> LoadedFile:
        previous = self.files.get(path)
        loaded = read_settings_file(path, now=time.time(), previous=previous)
        loaded.generation = (previous.generation + 1) if previous else 1
        self.files[path] = loaded
        if loaded.status == "error":
            kept = (
                f"; its previous {len(loaded.servers)} servers stay in force"
                if loaded.applied_at is not None
                else "; no servers from it"
            )
            self.log(
                "error",
                f"settings file {path} not applied: {loaded.error}{kept}",
                **(loaded.error_at or {"path": path}),
            )
        elif loaded.status == "missing" and previous is not None and previous.servers:
            self.log("info", f"settings file {path} is gone: its servers are removed", path=path)
        return loaded

    def apply_daemon_options(self) -> None:
        loaded = self.files.get(self.config_path)
        opts = loaded.daemon if loaded and loaded.daemon else DaemonOptions()
        if os.environ.get("MCPOOL_NO_POOL") == "1":
            opts = msgspec.structs.replace(opts, pool=False)
        self.options = opts
        self.notes = [n for n in self.notes if not n.startswith("daemon.socket")]
        if opts.socket and os.path.abspath(os.path.expanduser(opts.socket)) != self.sock_path:
            self.notes.append(
                f"daemon.socket is now {opts.socket}, but this daemon listens on "
                f"{self.sock_path}: restart the daemon to move it"
            )
        self._apply_log_level()
        if self.pool is not None:
            self.pool.options = self._pool_options()

    def _pool_options(self) -> PoolOptions:
        o = self.options
        return PoolOptions(
            drain_grace=o.drain_grace,
            max_idle=o.max_idle,
            max_line=o.max_message_bytes,
            backoff_initial=o.backoff_initial,
            backoff_max=o.backoff_max,
            request_timeout=o.request_timeout,
            startup_budget=o.startup_budget,
        )

    def desired_for(self, state: _SessionState) -> dict[str, Desired]:
        merged: dict[str, tuple[ServerSettings, str]] = {}
        for path in state.sources:
            loaded = self.files.get(path)
            if loaded is None or loaded.signature != file_signature(path):
                # New, or written since we read it (the watcher's event may still be on its
                # way): a session never starts from settings older than the file.
                loaded = self.load_file(path)
            for name, entry in loaded.servers.items():
                merged.pop(name, None)
                merged[name] = (entry, path)
        for name, (entry, source) in state.overrides.items():
            merged.pop(name, None)
            merged[name] = (entry, source)
        desired: dict[str, Desired] = {}
        session = state.session
        env = state.env if state.env is not None else base_environment()
        skipped: dict[str, tuple[str, str]] = {}
        loops: set[str] = set()
        for name, (entry, source) in merged.items():
            if entry.disabled:
                continue
            key = PolicyKey.from_settings(entry)
            try:
                entry = for_session(name, entry, env, source, from_session=state.env is not None)
            except SettingsError as exc:
                skipped[name] = (source, skip_message(exc))
                if isinstance(exc, SelfLaunch):
                    loops.add(name)
                continue
            if not self.options.pool:
                # Troubleshooting switch: every session connects its own upstreams, and the
                # connected identity includes the policy key, so a policy change reconnects.
                entry = msgspec.structs.replace(entry, scope="session")
            base = (
                settings_base_dir(source, self.config_path)
                if source != "<runtime>"
                else (session.cwd or os.path.expanduser("~"))
            )
            try:
                identity = identity_of(
                    name,
                    entry,
                    base_dir=base,
                    session_roots=(session.cwd,) if session.cwd else (),
                    policy=None if self.options.pool else key.encoded(),
                )
                check_cwd(name, identity, source)
            except SettingsError as exc:
                skipped[name] = (source, skip_message(exc))
                continue
            desired[name] = Desired(name, entry, identity, key, source)
        for name, (source, error) in skipped.items():
            if state.skipped.get(name) != (source, error):
                level = "warning" if name in loops else "error"
                self.log(level, f"server '{name}' skipped: {error}", path=source, server=name)
        state.skipped = skipped
        return desired

    def own_servers(self) -> dict[str, tuple[TransportIdentity, ServerSettings]]:
        """The user file's shared servers as the daemon itself starts them (`"start":
        "always"`, prewarm): expanded from the daemon's base environment. One a session could
        not use either is left out here; `desired_for` names it for the sessions that hold it."""
        loaded = self.files.get(self.config_path)
        if loaded is None or not self.options.pool:
            return {}
        out: dict[str, tuple[TransportIdentity, ServerSettings]] = {}
        base = settings_base_dir(self.config_path, self.config_path)
        for name, entry in loaded.servers.items():
            if entry.disabled or entry.scope != "shared":
                continue
            try:
                entry = for_session(
                    name, entry, base_environment(), self.config_path, from_session=False
                )
                identity = identity_of(name, entry, base_dir=base)
                check_cwd(name, identity, self.config_path)
            except SettingsError:
                continue
            out[name] = (identity, entry)
        return out

    def keep_always(self) -> None:
        """Hold one daemon lease on each `"start": "always"` server of the user file, so it
        runs before any session attaches and never drains; let go of ones no longer asked."""
        assert self.pool is not None
        want = {n: v for n, v in self.own_servers().items() if v[1].start == "always"}
        for name, handle in list(self.kept.items()):
            if name not in want or want[name][0] != handle.identity:
                del self.kept[name]
                self.pool.release(handle)
        for name, (identity, entry) in want.items():
            if name not in self.kept:
                self.log("info", f"server '{name}': started with the daemon (start: always)")
                self.kept[name] = self.pool.lease(identity, entry, "daemon", _DAEMON_LEASE)

    def prewarm(self) -> None:
        """`"daemon": {"prewarm": true}`: start the user file's eager servers now; each drains
        after the drain grace unless a session takes it."""
        assert self.pool is not None
        for name, (identity, entry) in self.own_servers().items():
            if entry.start == "eager":
                self.log("info", f"server '{name}': prewarmed")
                self.pool.release(self.pool.lease(identity, entry, "daemon", _DAEMON_LEASE))

    async def apply_to_session(self, state: _SessionState) -> list[tuple[str, str]]:
        async with state.lock:
            if state.session.closed:
                return []
            return await state.session.apply_settings(
                self.desired_for(state), self.settings_generation
            )

    def watched_files(self) -> set[str]:
        return self.watched.files()

    async def reload(self, only: set[str] | None = None) -> list[dict[str, Any]]:
        """S7: re-read the files (all, or `only`), then reconcile the affected sessions, in
        that order, under the one gate. A file that fails keeps its previous servers."""
        async with self.reload_gate:
            paths = self.watched_files() if only is None else only & self.watched_files()
            results: list[dict[str, Any]] = []
            for path in sorted(paths):
                before = self.files.get(path)
                loaded = self.load_file(path)
                same = before is not None and before.servers == loaded.servers
                results.append(
                    {
                        "path": path,
                        "status": loaded.status,
                        "error": loaded.error,
                        "servers": len(loaded.servers),
                        "changed": not same,
                    }
                )
            if self.config_path in paths:
                self.apply_daemon_options()
                self.keep_always()
            self.settings_generation += 1
            affected = [
                st for st in self.sessions.values() if only is None or paths & set(st.sources)
            ]
            actions_by_session: dict[str, list[str]] = {}
            for st in affected:
                actions = await self.apply_to_session(st)
                changed = [f"{n}: {a}" for n, a in actions if a != "keep"]
                self._restart_crash_looped(st, paths)
                if changed:
                    self.log("info", f"session {st.session.id} reconciled", actions=changed)
                actions_by_session[st.session.id] = changed
            for r in results:
                r["sessions"] = {
                    st.session.id: actions_by_session.get(st.session.id, [])
                    for st in affected
                    if r["path"] in st.sources
                }
            return results

    def _restart_crash_looped(self, st: _SessionState, paths: set[str]) -> None:
        """A settings change to a crash-looping server gives it a fresh start."""
        assert self.pool is not None
        for view in st.session.views.values():
            entry = view.handle.entry if view.handle else None
            if entry is not None and entry.state.value == "crash-loop" and view.source in paths:
                self.pool.restart_entry(entry)

    def stale_files(self) -> set[str]:
        """Watched files whose on-disk signature is not the one last read."""
        return {
            path
            for path in self.watched_files()
            if (loaded := self.files.get(path)) is not None
            and loaded.signature != file_signature(path)
        }

    async def files_changed(self, paths: set[str]) -> None:
        """The watcher saw these files change (atomic replace or in-place write)."""
        self.log("info", "settings files changed", paths=sorted(paths))
        await self._reload_fenced("the settings watcher", paths)

    async def _reload_fenced(self, trigger: str, only: set[str] | None = None) -> None:
        """A reload run by a shared task (the watcher, SIGHUP): whatever fails in it is logged
        with its traceback, and the task goes on watching."""
        try:
            await self.reload(only)
        except Exception as exc:
            self.log(
                "error",
                f"reload by {trigger} failed: {type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(),
            )

    # -- the process ---------------------------------------------------------------------------

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

    def request_stop(self, status: int = EXIT_STOPPED) -> None:
        """Begin the bounded shutdown; the first reason given is the exit status."""
        if not self.stop_requested.is_set():
            self.exit_status = status
            self.stop_requested.set()

    def _failed(self, exc: BaseException) -> None:
        """An unexpected error ended the daemon: its traceback goes to the daemon log and to
        stderr (systemd's journal), and the exit status says it failed."""
        self.exit_status = EXIT_FAILED
        text = "".join(traceback.format_exception(exc))
        leaf = exc
        while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
            leaf = leaf.exceptions[0]
        summary = f"{type(leaf).__name__}: {leaf}"
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

    async def _accept_loop(self) -> None:
        reserved = False  # the next connection is accepted with the fd reserve's room
        failing = False
        async with trio.open_nursery() as nursery:
            while True:
                listener = self.listen.listener
                assert listener is not None
                try:
                    conn, _ = await listener.accept()
                except trio.ClosedResourceError:
                    if self.listen.closed:
                        return  # shutdown closed the listener
                    continue  # re-created: accept on the new one
                except OSError as exc:
                    if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                        continue  # that peer left while it was being accepted
                    if exc.errno in (errno.EMFILE, errno.ENFILE) and self.fd_reserve.release():
                        self.log(
                            "warning",
                            f"accept failed at the open-file limit ({exc.strerror}): the fd "
                            "reserve lets one admin connection in",
                        )
                        reserved = True
                        continue
                    if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        if not failing:  # once per run of failures, not ten lines a second
                            self.log("error", f"accept failed: {exc}")
                        failing = True
                        await trio.sleep(0.1)
                        continue
                    raise
                failing = False
                nursery.start_soon(self._serve_fenced, conn, reserved)
                reserved = False

    async def _serve_fenced(self, tsock: trio.socket.SocketType, reserved: bool) -> None:
        """One connection's task: whatever goes wrong in it ends that connection only (logged
        with its traceback), never the accept loop every later connection needs."""
        try:
            await self._serve_connection(tsock, reserved)
        except Exception as exc:
            self._log_fault("opening a connection", exc)

    async def _serve_connection(
        self, tsock: trio.socket.SocketType, reserved: bool = False
    ) -> None:
        """`reserved`: accepted with the fd reserve's room, for an admin request only."""
        fd = tsock.detach()
        raw = socket.socket(fileno=fd)
        try:
            creds = raw.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            peer_pid, peer_uid, _ = struct.unpack("3i", creds)
            raw.setblocking(False)
            if peer_uid != os.getuid():
                self.log("warning", "refused a connection from another user", uid=peer_uid)
                with contextlib.suppress(OSError):
                    raw.send(
                        error_response(
                            None,
                            ATTACH_FAILED,
                            "Connection refused",
                            {"reason": f"uid {peer_uid} is not the daemon's uid {os.getuid()}"},
                        )
                    )
                await _linger_close(raw.fileno())
                return
            faulted = False
            try:
                await self._serve_peer(raw, peer_pid, reserved)
            except* Exception as exc:
                # The per-connection fence: a bug while serving one connection ends that
                # connection only, never the accept loop (and every other session with it).
                # `except*`: a cancellation travelling in the same group still propagates.
                self._log_fault("serving a connection", exc, peer=peer_pid)
                faulted = True
            if raw.fileno() in self._linger and not faulted:
                await _linger_close(raw.fileno())
        finally:
            self._linger.discard(raw.fileno())
            raw.close()
            if reserved:
                self.fd_reserve.refill()

    async def _serve_peer(self, raw: socket.socket, peer_pid: int, reserved: bool = False) -> None:
        """One connection: its first message says what it is (admin, attach, a raw client).

        Flat on purpose: a session's connection lives as long as the session, and each await
        level it sits under is a coroutine frame kept for that long (about 0.5 KB a level).
        """
        fd = raw.fileno()
        framer = LineFramer(self.options.max_message_bytes)
        # fds that came with the first message (an attach bridge handing over its stdio); a
        # session that takes them owns them, and whatever is not taken is closed on the way out.
        handed: list[int] = []
        try:
            async with trio.open_nursery() as nursery:
                # No writer task while nothing is queued: an idle session costs no task for it.
                writer = FdWriter(fd, self.options.session_buffer_bytes, spawn=nursery.start_soon)
                first, pending = await self._read_first(raw, framer, writer, handed)
                if first is not None and str(first.method).startswith("mcpool/admin/"):
                    await self._serve_admin(fd, writer, framer, first, pending)
                elif first is not None and reserved:
                    writer.write(_at_fd_limit(first))
                elif first is not None:
                    opened = self._open_connection_session(
                        fd, writer, first, peer_pid, handed, nursery.start_soon
                    )
                    if opened is not None:
                        state, in_fd, out = opened
                        client_closed = False
                        try:
                            if in_fd == fd:
                                await self._run_session(state, fd, writer, framer, pending)
                            else:
                                fresh = LineFramer(self.options.max_message_bytes)
                                client_closed = await self._run_session(
                                    state, in_fd, out, fresh, []
                                )
                                with trio.move_on_after(HANDOFF_DRAIN_BOUND):
                                    await out.wait_drained()
                        finally:
                            if in_fd != fd:
                                self._end_handoff(fd, writer, state, in_fd, out, client_closed)
                if first is not None:
                    with trio.move_on_after(1.0):
                        await writer.wait_drained()
                nursery.cancel_scope.cancel()
        finally:
            for received in handed:
                os.close(received)

    async def _read_first(
        self, raw: socket.socket, framer: LineFramer, writer: FdWriter, handed: list[int]
    ) -> tuple[Message | None, list[bytes]]:
        """The connection's first message and the lines read behind it (None: it said nothing
        usable in time, or closed)."""
        fd = raw.fileno()
        pending: list[bytes] = []
        first: Message | None = None
        with trio.move_on_after(FIRST_MESSAGE_TIMEOUT):
            while first is None:
                data = await _recv_with_fds(raw, handed)
                if not data:
                    return None, []
                try:
                    lines = framer.feed(data)
                except MessageTooLarge as exc:
                    await self._fail_and_close(fd, writer, exc)
                    return None, []
                while lines and first is None:
                    line = lines.pop(0)
                    decoded = self._decode_or_refuse(line, writer)
                    if writer.closed:
                        return None, []  # refused, and the peer did not stay to read why
                    if decoded is None:
                        continue
                    if isinstance(decoded, list):
                        first = decoded[0]
                        pending.append(line)
                        break
                    first = decoded
                    if not (isinstance(first.method, str) and first.method.startswith("mcpool/")):
                        pending.append(line)
                pending.extend(lines)
        return first, pending

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

    # -- sessions ------------------------------------------------------------------------------

    def _open_connection_session(
        self,
        fd: int,
        writer: FdWriter,
        first: Message,
        peer_pid: int,
        handed: list[int],
        spawn: Any,
    ) -> tuple[_SessionState, int, FdWriter] | None:
        """Open the session a connection's first message asks for and answer the attach: the
        state, the fd its client's messages arrive on and the writer its answers go to (the
        connection's own, or the handed-off stdin and stdout). None: refused (answered)."""
        assert self.pool is not None
        handoff = False
        if first.method == "mcpool/attach":
            try:
                params = _admin.decode_params(_ATTACH, first.params)
            except McpoolError as exc:
                with contextlib.suppress(WriterClosed):  # a caller that left needs no answer
                    writer.write(self._error_line(request_id(first), exc))
                return None
            # abspath is string work on absolute paths (the bridge sends them): no I/O.
            sources = [os.path.abspath(p) for p in params.sources]
            cwd, name, env = params.cwd, params.name or "session", params.env
            handoff = params.handoff and _usable_stdio(handed)
            explicit_budget = params.max_name_length
        else:
            sources, cwd, name, env = [self.config_path], None, "socket", None
            explicit_budget = None
        in_fd, out = fd, writer
        if handoff:
            in_fd, out_fd = handed
            os.set_blocking(in_fd, False)
            os.set_blocking(out_fd, False)
            # The connection's nursery runs its drain task, so it can still drain once the
            # session's own nursery is gone.
            out = FdWriter(out_fd, self.options.session_buffer_bytes, spawn=spawn)
            handed.clear()  # the session's now: _end_handoff closes them
        attaching = first.method == "mcpool/attach"
        via = "attach" if handoff else "attach-relay" if attaching else "socket"
        state = self.open_session(
            out,
            name=name,
            sources=sources,
            peer=peer_pid,
            cwd=cwd,
            via=via,
            env=env,
            max_name_length=explicit_budget,
        )
        if handoff:
            # The bridge's end is watched by the daemon's one `_BridgeSockets` task, so a
            # handed-off session holds no task beyond a socket session's.
            self.bridges.add(fd, state.session)
        if attaching:
            try:
                writer.write(response(request_id(first), self._attach_result(state, handoff)))
            except WriterClosed:
                # The bridge went away before its answer: the session ends through the usual
                # path (its run sees it closed), releasing whatever it took.
                state.session.close("the attach bridge went away before its attach answer")
        return state, in_fd, out

    def _end_handoff(
        self,
        control_fd: int,
        control: FdWriter,
        state: _SessionState,
        in_fd: int,
        out: FdWriter,
        client_closed: bool,
    ) -> None:
        """Release a handed-off session's fds and tell its bridge how it ended. Synchronous, so
        it runs in full even while the daemon is cancelling the connection (shutdown)."""
        self.bridges.remove(control_fd)
        self._linger.discard(in_fd)  # an oversized message's linger is the bridge socket's
        out_fd = out.fd
        out.close()
        for handed_fd in (in_fd, out_fd):
            trio.lowlevel.notify_closing(handed_fd)
            os.close(handed_fd)
        reason = state.session.close_reason or "the session ended"
        # A client that stopped reading its server's output (closed the pipe) has gone too.
        client_closed = client_closed or out.peer_gone
        with contextlib.suppress(WriterClosed):
            control.write(
                notification("mcpool/ended", {"reason": reason, "clientClosed": client_closed})
            )

    def _attach_result(self, state: _SessionState, handoff: bool = False) -> dict[str, Any]:
        result = {"session": state.session.id, "daemonPid": self.pid, "version": __version__}
        if handoff:
            result["handoff"] = True
        return result

    async def _run_session(
        self,
        state: _SessionState,
        in_fd: int,
        writer: FdWriter,
        framer: LineFramer,
        pending: list[bytes],
    ) -> bool:
        """Serve one session until it ends; True when the client ended it (end of input)."""
        session = state.session
        client_closed = False
        try:
            # One fence around the whole read loop (not one per line): whatever escapes the
            # session's own handling, its notifier or its first reconciliation closes this
            # session with an answer to every request in flight, and the connection ends.
            try:
                async with trio.open_nursery() as nursery:
                    session.on_close = lambda _s: nursery.cancel_scope.cancel()
                    session.spawn = nursery.start_soon  # a notifier task only while one is due
                    nursery.start_soon(self.apply_to_session, state)
                    for line in pending:
                        session.handle_line(line)
                    while not session.closed:
                        data = await read_some(in_fd)
                        if not data:
                            client_closed = True
                            await self._paced_detach()
                            break
                        try:
                            lines = framer.feed(data)
                        except MessageTooLarge as exc:
                            await self._fail_and_close(in_fd, writer, exc)
                            break
                        for line in lines:
                            session.handle_line(line)
                    session.close("the client disconnected")
            except* Exception as exc:
                self._log_fault("serving a session", exc, session=session.id)
                session.close("internal error in mcpool (see the daemon log)")
        finally:
            self.close_session(state, "the client disconnected")
        return client_closed

    async def _paced_detach(self) -> None:
        """Wait for a turn to close: at most DETACH_BATCH closes run between two passes of the
        loop over the other tasks (the turn is held across one checkpoint)."""
        async with self._detach_pacer:
            await trio.lowlevel.checkpoint()

    def _log_fault(self, where: str, exc: BaseException, **fields: Any) -> None:
        """An unexpected exception that a fence stopped: logged with its traceback."""
        trace = "".join(traceback.format_exception(exc)).rstrip()
        leaf = exc
        while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
            leaf = leaf.exceptions[0]  # the nursery's group around the one real error
        self.log("error", f"internal error while {where}: {leaf!r}", traceback=trace, **fields)

    def open_session(
        self,
        out: Any,
        *,
        name: str,
        sources: list[str],
        peer: Any,
        cwd: str | None = None,
        via: str = "socket",
        env: dict[str, str] | None = None,
        max_name_length: int | None = None,
    ) -> _SessionState:
        """A new session writing to `out`, registered with the daemon (socket and HTTP alike)."""
        assert self.pool is not None
        session = Session(
            new_session_id(),
            name=name,
            cwd=cwd,
            pool=self.pool,
            out=out,
            page_size=self.options.page_size,
            log=lambda text, level="warning": self.log(level, text),
            attached_at=time.time(),
        )
        session.set_name_budget(explicit=max_name_length, configured=self.options.max_name_length)
        state = _SessionState(session, sources, via, env)
        self.sessions[session.id] = state
        if self.watched.add(sources):
            self.watcher.watch(self.watched_files())
        self.log("info", "session attached", session=session.id, name=name, peer=peer)
        return state

    def close_session(self, state: _SessionState, reason: str) -> None:
        session = state.session
        session.close(reason)
        if self.sessions.pop(session.id, None) is state and self.watched.remove(state.sources):
            watched = self.watched_files()
            # A file no session reads any more is forgotten (it is read afresh if one attaches
            # again): a daemon that lives for weeks must not keep every project it ever served.
            for path in [p for p in self.files if p not in watched]:
                del self.files[path]
            self.watcher.watch(watched)
        self.log("info", "session detached", session=session.id, reason=session.close_reason)

    async def _serve_http(self) -> None:
        """`--http`: the streamable HTTP endpoint; a bind failure stops the daemon (it was asked
        for explicitly, and a daemon silently without it would look like a client bug)."""
        from ._http import HttpEndpoint

        assert self.http_bind is not None
        host, port, allow_remote = self.http_bind
        endpoint = HttpEndpoint(
            self,
            (host, port),
            allow_remote=allow_remote,
            max_body=self.options.max_message_bytes,
            session_buffer=self.options.session_buffer_bytes,
        )
        try:
            await endpoint.serve()
        except OSError as exc:
            self.log("error", f"HTTP endpoint not started on {host}:{port}: {exc}")
            sys.stderr.write(f"mcpool daemon: cannot serve HTTP on {host}:{port}: {exc}\n")
            self.request_stop(EXIT_FAILED)  # asked for and not served: a failure, not a stop

    # -- admin ---------------------------------------------------------------------------------

    async def _serve_admin(
        self, fd: int, writer: FdWriter, framer: LineFramer, first: Message, pending: list[bytes]
    ) -> None:
        """Answer admin requests in order until the caller closes, or goes away before it reads
        an answer: either ends this connection only."""
        if not await self._admin_request(writer, first):
            return
        queue = list(pending)
        while not self.stop_requested.is_set() or queue:
            while queue:
                decoded = self._decode_or_refuse(queue.pop(0), writer)
                if writer.closed:
                    return
                if decoded is None:
                    continue
                for msg in decoded if isinstance(decoded, list) else [decoded]:
                    if not await self._admin_request(writer, msg):
                        return
            data = await read_some(fd)
            if not data:
                return
            try:
                queue = framer.feed(data)
            except MessageTooLarge as exc:
                await self._fail_and_close(fd, writer, exc)
                return

    async def _admin_request(self, writer: FdWriter, msg: Message) -> bool:
        """Run one admin command and answer it; False when its caller has gone.

        The fence of the admin API: params are typed before the handler runs (daemon/_admin.py);
        an error a handler raises on purpose is its JSON-RPC error, and anything else is an
        internal error to this caller, logged with its traceback, never an exception in the
        connection's task.
        """
        method = msg.method if isinstance(msg.method, str) else ""
        try:
            command = _admin.lookup(method, self.admin_commands)
            params = _admin.decode_params(command, msg.params)
            result = await getattr(self, f"_admin_{command.handler}")(params)
            answer = response(msg.id, result) if isinstance(msg.id, int | str) else None
        except McpoolError as exc:
            answer = self._error_line(msg.id, exc) if msg.id is not UNSET else None
        except Exception as exc:
            self.log(
                "error",
                f"admin {method} failed: {type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(),
            )
            reason = f"{method} failed: {type(exc).__name__}: {exc} (the daemon log has more)"
            answer = (
                error_response(msg.id, INTERNAL_ERROR, "Internal error", {"reason": reason})
                if msg.id is not UNSET
                else None
            )
        if answer is None:
            return True
        try:
            writer.write(answer)
        except WriterClosed as exc:
            self.log("info", f"admin caller of {method} went away before its answer: {exc}")
            return False
        return True

    async def _admin_status(self, params: _admin.StatusParams) -> dict[str, Any]:
        assert self.pool is not None
        if params.collect:
            # A leak hunt wants live objects only: garbage waiting for a (rarer, see run) gen-0
            # pass would read as growth.
            gc.collect()
        entries = self.pool.entries()
        rss_total = 0
        for e in entries:
            rss_total += _tree_rss(e.upstream.pid if e.upstream else None) or 0
        files = [
            {
                "path": f.path,
                "kind": "daemon" if f.path == self.config_path else "settings",
                "status": f.status,
                "error": f.error,
                "error_at": f.error_at,
                "loaded_at": f.loaded_at,
                # The servers in force from this file, and when they were read: for "error",
                # the previous good generation's.
                "servers": len(f.servers),
                "applied_at": f.applied_at,
            }
            for f in self.files.values()
        ]
        return {
            "pid": self.pid,
            "version": __version__,
            "socket": self.sock_path,
            "started_at": self.started_wall,
            "uptime": round(trio.current_time() - self.started, 3),
            "config": files,
            "sessions": len(self.sessions),
            "entries": len(entries),
            "processes": sum(1 for e in entries if e.upstream is not None),
            "rss": rss_total,
            "daemon_rss": _tree_rss(self.pid, children=False),
            # The interpreter's own count of live blocks and tracked objects: unlike RSS, it does
            # not move with allocator arenas, so it shows a leak that RSS would hide in noise.
            "heap": {"blocks": sys.getallocatedblocks(), "objects": len(gc.get_objects())},
            "pooling": self.options.pool,
            "options": msgspec.to_builtins(self.options),
            # One row per rejected server part (S3, S8), gone once a candidate no longer has it.
            "registry_errors": [
                {"session": sid, "server": server, "error": error}
                for sid, st in self.sessions.items()
                for server, error in st.session.registry_errors.items()
            ],
            "notes": [
                *self.notes,
                *(f"server '{e.name}': {n}" for e in entries for n in e.snapshot.notes),
            ],
            "skipped": self._skipped_entries(),
            # L6: servers sessions hold that are not up (never silently absent from a list).
            "not_up": [
                {
                    "server": e.name,
                    "state": e.state.value,
                    "last_error": e.last_error,
                    "sessions": sorted({h.session_id for h in e.handles.values()}),
                }
                for e in entries
                if e.upstream is None and e.handles
            ],
        }

    def _skipped_entries(self) -> list[dict[str, Any]]:
        """Entries some session's settings hold but desired_for refused, with why."""
        by_error: dict[tuple[str, str, str], list[str]] = {}
        for sid, st in self.sessions.items():
            for name, (source, error) in st.skipped.items():
                by_error.setdefault((name, source, error), []).append(sid)
        return [
            {"server": name, "file": source, "error": error, "sessions": sids}
            for (name, source, error), sids in sorted(by_error.items())
        ]

    async def _admin_servers(self, params: _admin.NoParams) -> list[dict[str, Any]]:
        assert self.pool is not None
        out = []
        now = trio.current_time()
        for e in self.pool.entries():
            up = e.upstream
            started_at = (
                self.started_wall + (up.started_at - self.started)
                if up is not None and up.started_at is not None
                else None
            )
            out.append(
                {
                    "name": e.name,
                    "id": e.lifecycle_id,
                    "fingerprint": e.identity.fingerprint,
                    "state": self.logins.shown_state(e),
                    "refs": sorted({h.session_id for h in e.handles.values()}),
                    "pid": up.pid if up is not None else None,
                    "started_at": started_at,
                    "uptime": round(now - up.started_at, 3) if up and up.started_at else None,
                    "transport": e.identity.kind,
                    "start": e.settings.start,
                    "era": up.era if up is not None else None,
                    "protocol_version": up.protocol_version if up is not None else None,
                    "restarts": e.restarts,
                    "last_error": e.last_error,
                    # what its lists held that could not be used (left out, with why)
                    "notes": list(e.snapshot.notes),
                    # crash-loop only: when it is tried again on its own (wall clock)
                    "retry_at": (
                        self.started_wall + (e.retry_at - self.started)
                        if e.retry_at is not None
                        else None
                    ),
                    "rss": _tree_rss(up.pid if up else None),
                    "tools": len(e.snapshot.tools),
                    "snapshot": describe_snapshot(e.snapshot),
                    "in_flight": up.in_flight if up is not None else 0,
                    "transport_detail": e.identity.describe(),
                }
            )
        for item in self._skipped_entries():
            # Refused before a process existed: listed so `daemonctl servers` says why a
            # server a session asked for is not running.
            out.append(
                {
                    "name": item["server"],
                    "state": "refused",
                    "refs": item["sessions"],
                    "last_error": item["error"],
                    "source": item["file"],
                }
            )
        return out

    async def _admin_sessions(self, params: _admin.NoParams) -> list[dict[str, Any]]:
        out = []
        for sid, st in self.sessions.items():
            s = st.session
            out.append(
                {
                    "id": sid,
                    "name": s.name,
                    "cwd": s.cwd,
                    "attached_at": s.attached_at,
                    "servers": list(s.views),
                    "generation": s.registry.number,
                    "era": s.era,
                    "protocol_version": s.protocol_version,
                    "settings_generation": s.settings_generation,
                    "pending_notifications": len(s.pending_kinds),
                    "notifications_sent": s.notifications_sent,
                    "sources": st.sources,
                    "via": st.via,
                    "last_error": s.last_error,
                    "handles": [
                        {
                            "server": name,
                            "id": v.handle.lifecycle_id if v.handle else None,
                            "policy": v.key.canonical(),
                            "prefix": v.prefix,
                            "source": v.source,
                        }
                        for name, v in s.views.items()
                    ],
                }
            )
        return out

    def _session_state(self, sid: str) -> _SessionState:
        """A session by id, else by name."""
        st = self.sessions.get(sid)
        if st is None:
            for cand in self.sessions.values():
                if cand.session.name == sid:
                    return cand
            raise McpoolError(
                f"no session {sid!r} is attached",
                message=f"Unknown session {sid}",
                code=INVALID_PARAMS,
            )
        return st

    async def _admin_tools(self, params: _admin.ToolsParams) -> list[dict[str, Any]]:
        st = self._session_state(params.session)
        server = params.server
        gen = st.session.registry
        return [
            {
                "exposed": exposed,
                "kind": kind,
                "server": route.view.name,
                "entry": route.view.handle.lifecycle_id if route.view.handle else None,
                "upstream": route.upstream_name,
            }
            for kind, routes in (("tool", gen.tool_routes), ("prompt", gen.prompt_routes))
            for exposed, route in routes.items()
            if not server or route.view.name == server
        ]

    async def _admin_stop(self, params: _admin.NoParams) -> dict[str, Any]:
        self.request_stop()
        return {"pid": self.pid}

    async def _admin_testCrash(self, params: _admin.NoParams) -> dict[str, Any]:
        """MCPOOL_TEST_HOOKS=1 only: an unexpected error in the daemon's own nursery (where the
        accept loop runs), as a bug in a shared task would raise one; answered first."""
        assert self._shared_nursery is not None
        self._shared_nursery.start_soon(_forced_failure)
        return {"pid": self.pid}

    async def _admin_testFail(self, params: _admin.NoParams) -> dict[str, Any]:
        """MCPOOL_TEST_HOOKS=1 only: a handler's unexpected error (a bug behind one command)."""
        raise RuntimeError("forced by the test hook mcpool/admin/testFail")

    async def _admin_reload(self, params: _admin.NoParams) -> dict[str, Any]:
        return {"files": await self.reload()}

    async def _admin_restart(self, params: _admin.RestartParams) -> dict[str, Any]:
        assert self.pool is not None
        name = params.name
        before = {id(e): e.upstream for e in self.pool.entries() if e.name == name}
        waits = {id(e): e.state_changed for e in self.pool.entries() if e.name == name}
        entries = self.pool.restart(name)
        if not entries:
            raise McpoolError(
                f"no running server is named {name!r}",
                message=f"Unknown server {name}",
                code=INVALID_PARAMS,
            )
        results = []
        for entry in entries:
            old = before.get(id(entry))
            # Answer once this entry's restart has an outcome: a new upstream, or a failure.
            with trio.move_on_after(RESTART_WAIT):
                await waits[id(entry)].wait()  # the restart itself is a transition
                while not (
                    (entry.upstream is not None and entry.upstream is not old)
                    or entry.state.value in ("crash-loop", "needs-login", "closed", "failed")
                    or (entry.state.value == "restarting" and entry.last_error)
                ):
                    await entry.state_changed.wait()
            results.append(
                {
                    "id": entry.lifecycle_id,
                    "result": entry.state.value,
                    "pid": entry.upstream.pid if entry.upstream else None,
                    "error": entry.last_error,
                }
            )
        return {"entries": results}

    async def _admin_logs(self, params: _admin.LogsParams) -> dict[str, Any]:
        assert self.pool is not None
        lines, name = params.lines, params.name
        if not name:
            return {"lines": _tail(list(self.log_lines), lines)}
        found: list[str] = []
        matched = False
        for e in self.pool.entries():
            if e.name == name:
                matched = True
                tail = list(e.upstream.stderr_tail) if e.upstream else e.stderr_history
                # A server may echo its env or headers: never shown (X2).
                found.extend(e.identity.redact(line) for line in tail)
        for item in self._skipped_entries():
            if item["server"] == name:  # refused before it had a process: say why
                matched = True
                found.append(f"[mcpool] {item['error']}")
        if not matched:
            raise McpoolError(
                f"no server is named {name!r}",
                message=f"Unknown server {name}",
                code=INVALID_PARAMS,
            )
        return {"lines": _tail(found, lines)}

    async def _admin_setServer(self, params: _admin.SetServerParams) -> dict[str, Any]:
        st = self._session_state(params.session)
        name = params.name
        entry = parse_server_entry(name, params.entry)
        async with self.reload_gate:
            before = dict(st.session.views)
            st.overrides[name] = (entry, "<runtime>")
            self.settings_generation += 1
            actions = await self.apply_to_session(st)
        action = dict(actions).get(name, "none")
        view = st.session.views.get(name)
        return {
            "action": action,
            "id": view.handle.lifecycle_id if view and view.handle else None,
            "replaced": name in before and before.get(name) is not view,
            "generation": st.session.registry.number,
        }

    # OAuth (issue 16): the handlers live in _login.py.
    async def _admin_login(self, params: _admin.RestartParams) -> dict[str, Any]:
        return await self.logins.login(params.name)

    async def _admin_loginWait(self, params: _admin.RestartParams) -> dict[str, Any]:
        return await self.logins.login_wait(params.name)

    async def _admin_logout(self, params: _admin.RestartParams) -> dict[str, Any]:
        return await self.logins.logout(params.name)

    # -- log level and explain (issue 8) -------------------------------------------------------

    def _apply_log_level(self) -> None:
        """`--log-level` wins over the config's `daemon.logLevel`."""
        try:
            self.journal.set_level(self._cli_log_level or self.options.log_level)
        except ValueError as exc:
            self.journal.set_level("info")
            self.log("warning", f"daemon.logLevel ignored: {exc}", path=self.config_path)

    async def _admin_explain(self, params: _admin.ExplainParams) -> dict[str, Any]:
        """Why a tool or prompt is visible or hidden for one session (`daemonctl explain`).

        `name` may be an exposed name or an upstream name. Every server of the session is
        searched in its entry's snapshot, hidden items included, so a filtered-out tool is
        found; a name no server of the session offers is looked up in the rest of the pool.
        """
        assert self.pool is not None
        st = self._session_state(params.session)
        query = normalize_include(params.name)
        if not query:
            raise McpoolError("a tool or prompt name is required", code=INVALID_PARAMS)
        session = st.session
        # The name as the user saw it in a client may carry that client's prefix
        # (mcp__mcpool__..., mcp_mcpool_..., Codex's dashes folded): every form is tried.
        forms = user_name_forms(query)
        matches: list[dict[str, Any]] = []
        for server, view in session.views.items():
            if view.handle is None:
                continue
            entry = view.handle.entry
            for kind, upstream in self._explain_items(entry.snapshot):
                exposed = exposed_name(
                    server, upstream, prefix=view.prefix, budget=session.name_budget
                )
                if not (seen_as(forms, upstream) or seen_as(forms, exposed)):
                    continue
                visible, rule, filt = self._explain_visibility(session, view, kind, upstream)
                seen_by: list[dict[str, Any]] = []
                hidden_from: list[dict[str, Any]] = []
                for other_id, other in self.sessions.items():
                    other_view = other.session.views.get(server)
                    if other_id == session.id or other_view is None:
                        continue
                    o_visible, o_rule, _ = self._explain_visibility(
                        other.session, other_view, kind, upstream
                    )
                    who = {
                        "session": other_id,
                        "name": other.session.name,
                        "entry": other_view.handle.lifecycle_id if other_view.handle else None,
                    }
                    if o_visible:
                        o_exposed = exposed_name(
                            server,
                            upstream,
                            prefix=other_view.prefix,
                            budget=other.session.name_budget,
                        )
                        seen_by.append({**who, "exposed": o_exposed})
                    else:
                        hidden_from.append({**who, "rule": o_rule})
                matches.append(
                    {
                        "kind": kind,
                        "server": server,
                        "entry": view.handle.lifecycle_id,
                        "entry_state": entry.state.value,
                        "upstream": upstream,
                        "exposed": exposed,
                        "visible": visible,
                        "rule": rule,
                        "filter": filt,
                        "policy": view.key.canonical(),
                        "source": view.source,
                        "seen_by": seen_by,
                        "hidden_from": hidden_from,
                    }
                )
        elsewhere: list[dict[str, Any]] = []
        if not matches:
            for entry in self.pool.entries():
                for kind, upstream in self._explain_items(entry.snapshot):
                    if not (
                        seen_as(forms, upstream)
                        or seen_as(forms, exposed_name(entry.name, upstream))
                    ):
                        continue
                    elsewhere.append(
                        {
                            "kind": kind,
                            "server": entry.name,
                            "entry": entry.lifecycle_id,
                            "upstream": upstream,
                            "reason": self._explain_absent_server(st, entry.name),
                        }
                    )
        return {
            "session": session.id,
            "session_name": session.name,
            "name": query,
            "matches": matches,
            "elsewhere": elsewhere,
        }

    def _explain_visibility(
        self, session: Session, view: Any, kind: str, upstream: str
    ) -> tuple[bool, str, str | None]:
        """(visible, rule, deciding filter) for one upstream item in one session's view."""
        allowed, rule = view.key.explain(upstream)
        filt = (
            "excludeTools"
            if "excludeTools" in rule
            else "includeTools"
            if view.key.include is not None
            else None
        )
        if not allowed:
            # Calls check the current policy whatever generation is served (S8): hidden is
            # also not callable.
            return False, rule, filt
        routes = session.registry.tool_routes if kind == "tool" else session.registry.prompt_routes
        route = routes.get(
            exposed_name(view.name, upstream, prefix=view.prefix, budget=session.name_budget)
        )
        if (
            route is not None
            and route.view is view
            and route.upstream_name == upstream
            and session.holds(view)
        ):
            return True, rule, filt
        entry = view.handle.entry if view.handle is not None else None
        rejected = session.registry_errors.get(view.name)
        if rejected:
            why = f"the server's latest lists were rejected: {rejected}"
        elif entry is not None and entry.state.value != "active":
            why = f"the server's entry is {entry.state.value}"
        else:
            why = "not in the session's current registry generation yet"
        return False, f"allowed ({rule}), but not served: {why}", filt

    @staticmethod
    def _explain_items(snapshot: Any) -> list[tuple[str, str]]:
        items = [("tool", t.get("name")) for t in snapshot.tools]
        items += [("prompt", p.get("name")) for p in snapshot.prompts]
        return [(kind, name) for kind, name in items if isinstance(name, str)]

    def _explain_absent_server(self, st: _SessionState, server: str) -> str:
        for path in reversed(st.sources):
            loaded = self.files.get(path)
            entry = loaded.servers.get(server) if loaded is not None else None
            if entry is not None:
                if entry.disabled:
                    return f"server '{server}' is disabled in {path}"
                return f"server '{server}' in {path} is not connected to this session"
        return f"this session's settings do not list a server named '{server}'"


async def _forced_failure() -> None:
    raise RuntimeError("forced by the test hook mcpool/admin/testCrash")


def _tail(lines: list[str], count: int) -> list[str]:
    """The last `count` lines (none for 0, where a slice `[-0:]` would give them all)."""
    return lines[-count:] if count else []


async def _recv_with_fds(raw: socket.socket, fds: list[int]) -> bytes:
    """`read_some` for a connection's first message, which may carry fds (SCM_RIGHTS); they are
    appended to `fds`, close-on-exec so that no upstream we spawn inherits a client's pipe."""
    space = socket.CMSG_SPACE((HANDOFF_FDS + 1) * 4)
    while True:
        await trio.lowlevel.wait_readable(raw.fileno())
        try:
            data, ancdata, _flags, _addr = raw.recvmsg(READ_CHUNK, space, socket.MSG_CMSG_CLOEXEC)
        except BlockingIOError:
            continue
        except OSError:
            return b""
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(payload) - len(payload) % 4
                fds.extend(
                    int.from_bytes(payload[i : i + 4], sys.byteorder) for i in range(0, usable, 4)
                )
        return data


def _usable_stdio(fds: list[int]) -> bool:
    """Exactly a readable and a writable end of pipes or sockets: what a bridge hands over."""
    if len(fds) != HANDOFF_FDS:
        return False
    try:
        modes = [os.fstat(fd).st_mode for fd in fds]
    except OSError:
        return False
    return all(stat.S_ISFIFO(m) or stat.S_ISSOCK(m) for m in modes)


class _BridgeSockets:
    """The sockets of handed-off sessions' bridges, all watched by one task through one epoll
    set: a bridge that exits (or is killed) closes its socket, and that ends its session, so a
    client's server process and its session live and die together. A task per session would
    cost ~3 KB each; this costs a dict entry."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._sessions: dict[int, Session] = {}

    def add(self, fd: int, session: Session) -> None:
        self._epoll.register(fd, select.EPOLLIN | select.EPOLLRDHUP)
        self._sessions[fd] = session

    def remove(self, fd: int) -> None:
        if self._sessions.pop(fd, None) is not None:
            with contextlib.suppress(OSError):
                self._epoll.unregister(fd)

    async def run(self) -> None:
        while True:
            await trio.lowlevel.wait_readable(self._epoll.fileno())
            for fd, _events in self._epoll.poll(0):
                session = self._sessions.get(fd)
                if session is None:
                    continue
                try:
                    data = os.read(fd, READ_CHUNK)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:  # a bridge sends nothing after its attach request but its end
                    self.remove(fd)
                    session.close("the attach bridge exited")

    def close(self) -> None:
        self._epoll.close()


async def _linger_close(fd: int) -> None:
    """Half-close, then discard what the peer still sends until it closes (bounded).

    Closing a socket with unread input makes the kernel reset the connection: the peer's send
    fails with EPIPE and its read with ECONNRESET instead of the error line followed by EOF.
    """
    try:
        with socket.fromfd(fd, socket.AF_UNIX, socket.SOCK_STREAM) as dup:
            dup.shutdown(socket.SHUT_WR)
    except OSError:
        return
    with trio.move_on_after(CLOSE_LINGER):
        while await read_some(fd):
            pass


def _tree_rss(pid: int | None, children: bool = True) -> int | None:
    if pid is None:
        return None
    try:
        import psutil

        proc = psutil.Process(pid)
        total = proc.memory_info().rss
        if children:
            for child in proc.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    total += child.memory_info().rss
        return int(total)
    except Exception:
        return None


def _at_fd_limit(first: Message) -> bytes:
    """The answer to a session that came in on the fd reserve, which is kept for admin calls."""
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return error_response(
        request_id(first),
        ATTACH_FAILED,
        "The daemon is at its open-file limit",
        {"reason": f"RLIMIT_NOFILE is {soft}; see `daemonctl status` and `daemonctl sessions`"},
    )


def main(argv: list[str]) -> int:
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
    args = parser.parse_args(argv)
    http_bind: tuple[str, int, bool] | None = None
    if args.http:
        import importlib.util

        from ._http import bind_is_loopback, parse_bind

        try:
            host, port = parse_bind(args.http)
        except ValueError as exc:
            parser.error(f"--http: {exc}")
        if importlib.util.find_spec("h11") is None:
            parser.error("--http needs h11: pip install 'mcpool[http]'")
        if not (bind_is_loopback(host) or args.http_allow_remote):
            parser.error(f"--http {args.http}: not a loopback address (see --http-allow-remote)")
        http_bind = (host, port, args.http_allow_remote)
    sock_path = str(_paths.socket_path(args.socket))
    config = str(_paths.config_path(args.config))
    try:
        # X3: the folder is ours (created 0700 when missing) before the lock is taken in it.
        _paths.prepare_socket_dir(Path(sock_path))
    except _paths.UnsafeSocketPath as exc:
        sys.stderr.write(f"mcpool daemon: {exc}\n")
        return 1
    lock_fd = take_lock(sock_path)
    if lock_fd is None:
        sys.stderr.write(f"mcpool daemon: another daemon already serves {sock_path}\n")
        # 0: what was asked for (a daemon serving this socket) holds. `mcpool attach` relies on
        # it (racing bridges each start one; a loser's 0 says "retry the connect", anything else
        # "the daemon failed to start"), and a supervisor must not restart a loser into the same
        # lock again.
        return EXIT_STOPPED
    daemon = Daemon(sock_path, config, args.log_level)
    daemon.listen.lock_fd = lock_fd
    daemon.http_bind = http_bind
    daemon.journal.path = _paths.daemon_log_path(Path(sock_path))
    try:
        return trio.run(daemon.run)
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
