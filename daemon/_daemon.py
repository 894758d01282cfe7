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
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import errno
import fcntl
import gc
import os
import select
import signal
import socket
import stat
import struct
import sys
import time
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
    Pool,
    PoolOptions,
    ServerSettings,
    WriterClosed,
    identity_of,
    read_some,
)
from mcpool.protocol import (
    ATTACH_FAILED,
    INVALID_PARAMS,
    LineFramer,
    McpoolError,
    Message,
    MessageTooLarge,
    MethodNotFound,
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
)

from . import _paths
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
from ._watch import SettingsWatcher

LISTEN_BACKLOG = 128
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
# fds an attach may hand over (stdin, stdout); room for one more so that a sender of too many
# is seen (MSG_CTRUNC) rather than silently cut.
HANDOFF_FDS = 2


class _SessionState:
    """Daemon-side facts about one session: its settings sources and runtime overrides."""

    def __init__(self, session: Session, sources: list[str], via: str) -> None:
        self.session = session
        self.sources = sources
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
        self.settings_generation = 0
        self.reload_gate = trio.Lock()
        self.stop_requested = trio.Event()
        self.log_lines: collections.deque[str] = collections.deque(maxlen=LOG_MEMORY_LINES)
        self.notes: list[str] = []
        self._cli_log_level = log_level
        self.journal = JsonLinesLog(level=log_level or "info")
        self.options = DaemonOptions()
        self.pool: Pool | None = None
        self.guardian: Guardian | None = None
        self.watcher = SettingsWatcher(self.files_changed, self.stale_files)
        self.bridges = _BridgeSockets()
        self._linger: set[int] = set()  # connections closed for an error: half-close and drain
        # `--http HOST:PORT`: the downstream streamable HTTP endpoint (daemon/_http.py), off
        # unless given; (host, port, allow_remote).
        self.http_bind: tuple[str, int, bool] | None = None
        self.logins = Logins(self)  # OAuth (issue 16): the token broker and logins running

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
            self.log("error", f"settings file {path} not applied: {loaded.error}", path=path)
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
        for name, (entry, source) in merged.items():
            if entry.disabled:
                continue
            key = PolicyKey.from_settings(entry)
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
            except SettingsError as exc:
                self.log("error", f"server '{name}' skipped: {exc.reason}", path=source)
                continue
            desired[name] = Desired(name, entry, identity, key, source)
        return desired

    async def apply_to_session(self, state: _SessionState) -> list[tuple[str, str]]:
        async with state.lock:
            if state.session.closed:
                return []
            return await state.session.apply_settings(
                self.desired_for(state), self.settings_generation
            )

    def watched_files(self) -> set[str]:
        paths = {self.config_path}
        for st in self.sessions.values():
            paths.update(st.sources)
        return paths

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
        await self.reload(paths)

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
        listener = self._listen()
        self.log("info", "daemon started", pid=self.pid, socket=self.sock_path)
        try:
            async with trio.open_nursery() as pool_nursery:
                self.pool = Pool(
                    pool_nursery, self._pool_options(), guardian=self.guardian, log=self.log
                )
                async with trio.open_nursery() as conn_nursery:
                    conn_nursery.start_soon(self._accept_loop, listener)
                    conn_nursery.start_soon(self._watch_signals)
                    conn_nursery.start_soon(self.bridges.run)
                    conn_nursery.start_soon(self.logins.run)
                    self.watcher.watch(self.watched_files())
                    conn_nursery.start_soon(self.watcher.run)
                    if self.http_bind is not None:
                        conn_nursery.start_soon(self._serve_http)
                    await self.stop_requested.wait()
                    self.log("info", "shutting down")
                    self.watcher.close()
                    listener.close()
                    with trio.move_on_after(self.options.shutdown_timeout, shield=True) as scope:
                        for st in list(self.sessions.values()):
                            st.session.close("the daemon is shutting down")
                        conn_nursery.cancel_scope.cancel()
                        await self.pool.aclose()
                    if scope.cancelled_caught:
                        self.log("warning", "shutdown timed out; remaining upstreams are killed")
                        self.pool.kill_all()
                        # SIGKILL cannot be ignored: this only lets the supervisors reap.
                        with trio.move_on_after(KILL_REAP_BOUND, shield=True):
                            await self.pool.aclose()
                pool_nursery.cancel_scope.cancel()
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self.sock_path)
            if self.guardian is not None:
                self.guardian.close()
            self.bridges.close()
            self.log("info", "daemon stopped")
        return 0

    def _listen(self) -> trio.socket.SocketType:
        sock_dir = os.path.dirname(self.sock_path)
        # We hold the lock: any socket file left here is stale.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.sock_path)
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            raw.bind(self.sock_path)
        finally:
            os.umask(old_umask)
        os.chmod(self.sock_path, 0o600)
        os.chmod(sock_dir, 0o700)
        raw.listen(LISTEN_BACKLOG)
        return trio.socket.from_stdlib_socket(raw)

    async def _watch_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    self.log("info", "SIGHUP: reloading settings")
                    await self.reload()
                else:
                    self.log("info", f"received {signal.Signals(signum).name}")
                    self.stop_requested.set()

    async def _accept_loop(self, listener: trio.socket.SocketType) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    conn, _ = await listener.accept()
                except trio.ClosedResourceError:
                    return  # shutdown closed the listener
                except OSError as exc:
                    if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        self.log("error", f"accept failed: {exc}")
                        await trio.sleep(0.1)
                        continue
                    raise
                nursery.start_soon(self._serve_connection, conn)

    async def _serve_connection(self, tsock: trio.socket.SocketType) -> None:
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
            await self._serve_peer(raw, peer_pid)
            if raw.fileno() in self._linger:
                await _linger_close(raw.fileno())
        finally:
            self._linger.discard(raw.fileno())
            raw.close()

    async def _serve_peer(self, raw: socket.socket, peer_pid: int) -> None:
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
        """A line's message (or batch); None when it is not one, after answering the error."""
        try:
            return decode(line)
        except McpoolError as exc:
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
                params = msgspec.json.decode(first.params) if first.params is not UNSET else {}
                if not isinstance(params, dict):
                    raise ValueError("params must be an object")
                # abspath is string work on absolute paths (the bridge sends them): no I/O.
                sources = [os.path.abspath(str(p)) for p in params.get("sources") or []]
                cwd = params.get("cwd")
                name = str(params.get("name") or "session")
                handoff = params.get("handoff") is True and _usable_stdio(handed)
            except (ValueError, msgspec.DecodeError) as exc:
                writer.write(
                    error_response(
                        request_id(first), INVALID_PARAMS, "Invalid attach", {"reason": str(exc)}
                    )
                )
                return None
        else:
            sources, cwd, name = [self.config_path], None, "socket"
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
            cwd=cwd if isinstance(cwd, str) else None,
            via=via,
        )
        if handoff:
            # The bridge's end is watched by the daemon's one `_BridgeSockets` task, so a
            # handed-off session holds no task beyond a socket session's.
            self.bridges.add(fd, state.session)
        if attaching:
            writer.write(response(request_id(first), self._attach_result(state, handoff)))
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
                        break
                    try:
                        lines = framer.feed(data)
                    except MessageTooLarge as exc:
                        await self._fail_and_close(in_fd, writer, exc)
                        break
                    for line in lines:
                        session.handle_line(line)
                session.close("the client disconnected")
        finally:
            self.close_session(state, "the client disconnected")
        return client_closed

    def open_session(
        self,
        out: Any,
        *,
        name: str,
        sources: list[str],
        peer: Any,
        cwd: str | None = None,
        via: str = "socket",
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
            log=lambda text: self.log("warning", text),
            attached_at=time.time(),
        )
        state = _SessionState(session, sources, via)
        self.sessions[session.id] = state
        self.watcher.watch(self.watched_files())
        self.log("info", "session attached", session=session.id, name=name, peer=peer)
        return state

    def close_session(self, state: _SessionState, reason: str) -> None:
        session = state.session
        session.close(reason)
        self.sessions.pop(session.id, None)
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
            self.stop_requested.set()

    # -- admin ---------------------------------------------------------------------------------

    async def _serve_admin(
        self, fd: int, writer: FdWriter, framer: LineFramer, first: Message, pending: list[bytes]
    ) -> None:
        await self._admin_request(writer, first)
        queue = list(pending)
        while not self.stop_requested.is_set() or queue:
            while queue:
                decoded = self._decode_or_refuse(queue.pop(0), writer)
                if decoded is None:
                    continue
                for msg in decoded if isinstance(decoded, list) else [decoded]:
                    await self._admin_request(writer, msg)
            data = await read_some(fd)
            if not data:
                return
            try:
                queue = framer.feed(data)
            except MessageTooLarge as exc:
                await self._fail_and_close(fd, writer, exc)
                return

    async def _admin_request(self, writer: FdWriter, msg: Message) -> None:
        method = msg.method if isinstance(msg.method, str) else ""
        command = method.removeprefix("mcpool/admin/")
        handler = getattr(self, f"_admin_{command.replace('-', '_')}", None)
        try:
            params = msgspec.json.decode(msg.params) if msg.params is not UNSET else {}
            if handler is None or not method.startswith("mcpool/admin/"):
                raise MethodNotFound(method, f"no admin command {command!r}")
            result = await handler(params if isinstance(params, dict) else {})
        except McpoolError as exc:
            if msg.id is not UNSET:
                writer.write(self._error_line(msg.id, exc))
            return
        if isinstance(msg.id, int | str):
            writer.write(response(msg.id, result))

    async def _admin_status(self, params: dict[str, Any]) -> dict[str, Any]:
        assert self.pool is not None
        if params.get("collect") is True:
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
                "loaded_at": f.loaded_at,
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
            "registry_errors": [
                {"session": sid, "error": st.session.last_error}
                for sid, st in self.sessions.items()
                if st.session.last_error
            ],
            "notes": self.notes,
        }

    async def _admin_servers(self, params: dict[str, Any]) -> list[dict[str, Any]]:
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
                    "era": up.era if up is not None else None,
                    "protocol_version": up.protocol_version if up is not None else None,
                    "restarts": e.restarts,
                    "last_error": e.last_error,
                    "rss": _tree_rss(up.pid if up else None),
                    "tools": len(e.snapshot.tools),
                    "in_flight": up.in_flight if up is not None else 0,
                    "transport_detail": e.identity.describe(),
                }
            )
        return out

    async def _admin_sessions(self, params: dict[str, Any]) -> list[dict[str, Any]]:
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

    def _session_state(self, params: dict[str, Any]) -> _SessionState:
        sid = params.get("session")
        st = self.sessions.get(str(sid))
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

    async def _admin_tools(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        st = self._session_state(params)
        server = params.get("server")
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

    async def _admin_stop(self, params: dict[str, Any]) -> dict[str, Any]:
        self.stop_requested.set()
        return {"pid": self.pid}

    async def _admin_reload(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"files": await self.reload()}

    async def _admin_restart(self, params: dict[str, Any]) -> dict[str, Any]:
        assert self.pool is not None
        name = str(params.get("name"))
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

    async def _admin_logs(self, params: dict[str, Any]) -> dict[str, Any]:
        assert self.pool is not None
        lines = int(params.get("lines") or 200)
        name = params.get("name")
        if not name:
            return {"lines": list(self.log_lines)[-lines:]}
        found: list[str] = []
        matched = False
        for e in self.pool.entries():
            if e.name == name:
                matched = True
                tail = list(e.upstream.stderr_tail) if e.upstream else e.stderr_history
                found.extend(tail)
        if not matched:
            raise McpoolError(
                f"no server is named {name!r}",
                message=f"Unknown server {name}",
                code=INVALID_PARAMS,
            )
        return {"lines": found[-lines:]}

    async def _admin_setServer(self, params: dict[str, Any]) -> dict[str, Any]:
        st = self._session_state(params)
        name = str(params.get("name"))
        entry = parse_server_entry(name, params.get("entry"))
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

    _admin_set_server = _admin_setServer

    # OAuth (issue 16): the handlers live in _login.py.
    async def _admin_login(self, params: dict[str, Any]) -> dict[str, Any]:
        return await self.logins.login(params)

    async def _admin_loginWait(self, params: dict[str, Any]) -> dict[str, Any]:
        return await self.logins.login_wait(params)

    async def _admin_logout(self, params: dict[str, Any]) -> dict[str, Any]:
        return await self.logins.logout(params)

    # -- log level and explain (issue 8) -------------------------------------------------------

    def _apply_log_level(self) -> None:
        """`--log-level` wins over the config's `daemon.logLevel`."""
        try:
            self.journal.set_level(self._cli_log_level or self.options.log_level)
        except ValueError as exc:
            self.journal.set_level("info")
            self.log("warning", f"daemon.logLevel ignored: {exc}", path=self.config_path)

    async def _admin_explain(self, params: dict[str, Any]) -> dict[str, Any]:
        """Why a tool or prompt is visible or hidden for one session (`daemonctl explain`).

        `name` may be an exposed name or an upstream name. Every server of the session is
        searched in its entry's snapshot, hidden items included, so a filtered-out tool is
        found; a name no server of the session offers is looked up in the rest of the pool.
        """
        assert self.pool is not None
        st = self._session_state(params)
        query = normalize_include(str(params.get("name") or ""))
        if not query:
            raise McpoolError("a tool or prompt name is required", code=INVALID_PARAMS)
        session = st.session
        matches: list[dict[str, Any]] = []
        for server, view in session.views.items():
            if view.handle is None:
                continue
            entry = view.handle.entry
            for kind, upstream in self._explain_items(entry.snapshot):
                exposed = exposed_name(server, upstream, prefix=view.prefix)
                if query not in (upstream, exposed):
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
                        o_exposed = exposed_name(server, upstream, prefix=other_view.prefix)
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
                    if query not in (upstream, exposed_name(entry.name, upstream)):
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
            return False, rule, filt
        routes = session.registry.tool_routes if kind == "tool" else session.registry.prompt_routes
        route = routes.get(exposed_name(view.name, upstream, prefix=view.prefix))
        if route is not None and route.view is view and route.upstream_name == upstream:
            return True, rule, filt
        entry = view.handle.entry if view.handle is not None else None
        if session.last_error:
            why = f"the session's latest registry was rejected: {session.last_error}"
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


def _take_lock(sock_path: str) -> int | None:
    lock_path = str(_paths.lock_path(Path(sock_path)))
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


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
    sock_dir = os.path.dirname(sock_path)
    os.makedirs(sock_dir, mode=0o700, exist_ok=True)
    os.chmod(sock_dir, 0o700)
    lock_fd = _take_lock(sock_path)
    if lock_fd is None:
        sys.stderr.write(f"mcpool daemon: another daemon already serves {sock_path}\n")
        return 0
    daemon = Daemon(sock_path, config, args.log_level)
    daemon.http_bind = http_bind
    daemon.journal.path = _paths.daemon_log_path(Path(sock_path))
    try:
        return trio.run(daemon.run)
    except KeyboardInterrupt:
        return 130
    finally:
        daemon.journal.close()
        os.close(lock_fd)
