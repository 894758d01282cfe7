"""The admin API's handlers (`daemonctl`): one `_admin_<command>` per command of daemon/_admin.py,
which types their params first.

A room of `Daemon` (daemon/_daemon.py): the rooms form one chain of base classes,
_core <- _hosting <- _admin_api <- _explain <- _connections <- _daemon, each using only what
the rooms below it define.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import trio
from msgspec import UNSET

from mcpool import __version__
from mcpool.pool import (
    EntryState,
    FdWriter,
    WriterClosed,
    read_some,
)
from mcpool.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    LineFramer,
    McpoolError,
    Message,
    MessageTooLarge,
    error_response,
    response,
)

from . import _admin
from ._core import EXIT_STOPPED, _SessionState  # noqa: F401
from ._explain import explain
from ._hosting import _DAEMON_LEASE, SettingsHost, _DaemonLease  # noqa: F401
from ._settings import (
    parse_server_entry,
)
from ._snapshots import describe_snapshot

RESTART_WAIT = 60.0  # `daemonctl restart` answers by then even if a server is still starting

# States that end a restart without a new upstream: `daemonctl restart` answers with them.
_RESTART_OUTCOMES = frozenset(
    {EntryState.CRASH_LOOP, EntryState.NEEDS_LOGIN, EntryState.CLOSED, EntryState.FAILED}
)


async def _forced_failure() -> None:
    raise RuntimeError("forced by the test hook mcpool/admin/testCrash")


def _tail(lines: list[str], count: int) -> list[str]:
    """The last `count` lines (none for 0, where a slice `[-0:]` would give them all)."""
    return lines[-count:] if count else []


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


AdminHandler = Callable[[Any], Awaitable[Any]]


class AdminApi(SettingsHost):
    _admin_handlers: dict[str, AdminHandler]  # admin_handler_table(), built by Daemon.__init__

    def admin_handler_table(self) -> dict[str, AdminHandler]:
        """Each command's handler, by the handler name daemon/_admin.py gives it."""
        return {
            "status": self._admin_status,
            "servers": self._admin_servers,
            "sessions": self._admin_sessions,
            "tools": self._admin_tools,
            "explain": self._admin_explain,
            "stop": self._admin_stop,
            "reload": self._admin_reload,
            "restart": self._admin_restart,
            "logs": self._admin_logs,
            "setServer": self._admin_setServer,
            "login": self._admin_login,
            "loginWait": self._admin_loginWait,
            "logout": self._admin_logout,
            "testCrash": self._admin_testCrash,
            "testFail": self._admin_testFail,
        }

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
            result = await self._admin_handlers[command.handler](params)
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
            # What the daemon's own caches hold (issue 27 item 5).
            "caches": {"cursors": self.cursors.statistics()},
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
                    # Log and progress messages whose session had gone (X8): dropped.
                    "dropped_notifications": e.dropped_notifications,
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
                    # Bytes waiting for the client, and log and progress messages dropped while
                    # its client was behind (X8).
                    "queued_bytes": s.out.buffered,
                    "lossy_dropped": s.lossy_dropped,
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
        """What the session's client is served, each item with what a call (or get) of it
        does now: an item the current settings no longer allow is still served while a reload
        waits for new servers, and its calls are refused (S8). Such a row is kept, marked
        (`callable` false, `refused` says why), rather than left out: the client lists it
        until the reload ends, and the user comparing the two should see why it fails."""
        st = self._session_state(params.session)
        server = params.server
        session = st.session
        gen = session.registry
        rows = []
        for kind, routes in (("tool", gen.tool_routes), ("prompt", gen.prompt_routes)):
            for exposed, route in routes.items():
                if server and route.view.name != server:
                    continue
                refused = session.refusal(route)
                rows.append(
                    {
                        "exposed": exposed,
                        "kind": kind,
                        "server": route.view.name,
                        "entry": route.view.handle.lifecycle_id if route.view.handle else None,
                        "upstream": route.upstream_name,
                        "callable": refused is None,
                        "refused": refused,
                    }
                )
        return rows

    async def _admin_explain(self, params: _admin.ExplainParams) -> dict[str, Any]:
        assert self.pool is not None
        st = self._session_state(params.session)
        return explain(st, params.name, self.sessions, self.pool.entries(), self.files)

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
                    or entry.state in _RESTART_OUTCOMES
                    or (entry.state is EntryState.RESTARTING and entry.last_error)
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
