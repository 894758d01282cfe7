"""The admin API (`daemonctl`): a table of handlers, one per command of daemon/_admin.py, which
types their params first.

`AdminApi` is made by `Daemon.run` from the objects it reports on and acts through (the process,
the settings files and host, the attached sessions, the pool, the logins, the cursor book); it
answers one request at a time (`answer`), and the connection side writes the answer.
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
from mcpool.pool import EntryState, Pool
from mcpool.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    McpoolError,
    Message,
    error_response,
    response,
)
from mcpool.session import Interner
from mcpool.session._cursors import CursorBook

from . import _admin
from ._attached import AttachedSessions
from ._audit import AuditLog
from ._core import DaemonProcess, error_line
from ._explain import explain
from ._hosting import SettingsHost
from ._ledger import Ledger
from ._login import Logins
from ._pinkeeper import PinKeeper
from ._settings import parse_server_entry
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


class AdminApi:
    def __init__(
        self,
        process: DaemonProcess,
        host: SettingsHost,
        sessions: AttachedSessions,
        pool: Pool,
        logins: Logins,
        *,
        cursors: CursorBook[tuple[dict[str, Any], ...]],
        interner: Interner,
        spawn_shared: Callable[[Callable[[], Awaitable[None]]], None],
        commands: dict[str, _admin.Command],
        ledger: Ledger | None = None,
        pins: PinKeeper | None = None,
    ) -> None:
        self._process = process
        # What `changes` and `approve` read and write (an admin made alone pins nothing).
        self._pins = pins if pins is not None else PinKeeper(None, lambda: "off", process.log)
        # What `stats` reads: the daemon's (an admin made alone counts nothing).
        self._ledger = ledger if ledger is not None else Ledger(AuditLog(None))
        self._host = host
        self._files = host.files
        self._sessions = sessions
        self._pool = pool
        self._logins = logins
        self._cursors = cursors
        self._interner = interner
        # The daemon's shared nursery (the accept loop's), for the test hook testCrash.
        self._spawn_shared = spawn_shared
        self._commands = commands
        self._handlers: dict[str, AdminHandler] = {
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
            "stats": self._admin_stats,
            "changes": self._admin_changes,
            "approve": self._admin_approve,
            "testCrash": self._admin_testCrash,
            "testFail": self._admin_testFail,
        }

    async def answer(self, msg: Message) -> bytes | None:
        """Run one admin command; its answer line (None for a notification).

        The fence of the admin API: params are typed before the handler runs (daemon/_admin.py);
        an error a handler raises on purpose is its JSON-RPC error, and anything else is an
        internal error to this caller, logged with its traceback, never an exception in the
        connection's task.
        """
        method = msg.method if isinstance(msg.method, str) else ""
        try:
            command = _admin.lookup(method, self._commands)
            params = _admin.decode_params(command, msg.params)
            result = await self._handlers[command.handler](params)
            return response(msg.id, result) if isinstance(msg.id, int | str) else None
        except McpoolError as exc:
            return error_line(msg.id, exc) if msg.id is not UNSET else None
        except Exception as exc:
            self._process.log(
                "error",
                f"admin {method} failed: {type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(),
            )
            reason = f"{method} failed: {type(exc).__name__}: {exc} (the daemon log has more)"
            return (
                error_response(msg.id, INTERNAL_ERROR, "Internal error", {"reason": reason})
                if msg.id is not UNSET
                else None
            )

    async def _admin_status(self, params: _admin.StatusParams) -> dict[str, Any]:
        if params.collect:
            # A leak hunt wants live objects only: garbage waiting for a (rarer, see run) gen-0
            # pass would read as growth.
            gc.collect()
        entries = self._pool.entries()
        rss_total = 0
        for e in entries:
            rss_total += _tree_rss(e.upstream.pid if e.upstream else None) or 0
        return {
            "pid": self._process.pid,
            "version": __version__,
            "socket": self._process.sock_path,
            "started_at": self._process.started_wall,
            "uptime": round(trio.current_time() - self._process.started, 3),
            "config": self._files.describe(),
            "sessions": len(self._sessions),
            "entries": len(entries),
            "processes": sum(1 for e in entries if e.upstream is not None),
            "rss": rss_total,
            "daemon_rss": _tree_rss(self._process.pid, children=False),
            # The interpreter's own count of live blocks and tracked objects: unlike RSS, it does
            # not move with allocator arenas, so it shows a leak that RSS would hide in noise.
            "heap": {"blocks": sys.getallocatedblocks(), "objects": len(gc.get_objects())},
            "pooling": self._files.options.pool,
            # What the daemon's own caches hold (issue 27 item 5).
            "caches": {
                "cursors": self._cursors.statistics(),
                "interner": self._interner.statistics(),
            },
            "options": msgspec.to_builtins(self._files.options),
            # Pinning (issue 30): the mode, pending changes and the latest warnings.
            "pins": self._pins.status_json(),
            # One row per rejected server part (S3, S8), gone once a candidate no longer has it.
            "registry_errors": [
                {"session": sid, "server": server, "error": error}
                for sid, st in self._sessions.by_id.items()
                for server, error in st.session.registry_errors.items()
            ],
            "notes": [
                *self._files.notes,
                *(f"server '{e.name}': {n}" for e in entries for n in e.snapshot.notes),
            ],
            "skipped": self._sessions.skipped_entries(),
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

    async def _admin_servers(self, params: _admin.NoParams) -> list[dict[str, Any]]:
        out = []
        now = trio.current_time()
        for e in self._pool.entries():
            up = e.upstream
            started_at = (
                self._process.wall_time(up.started_at)
                if up is not None and up.started_at is not None
                else None
            )
            out.append(
                {
                    "name": e.name,
                    "id": e.lifecycle_id,
                    "fingerprint": e.identity.fingerprint,
                    "state": self._logins.shown_state(e),
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
                        self._process.wall_time(e.retry_at) if e.retry_at is not None else None
                    ),
                    "rss": _tree_rss(up.pid if up else None),
                    "tools": len(e.snapshot.tools),
                    "snapshot": describe_snapshot(e.snapshot),
                    "in_flight": up.in_flight if up is not None else 0,
                    # Calls from different sessions taken in turn (pool/_turns.py)
                    "turns": e.turns.statistics(),
                    # Log and progress messages whose session had gone (X8): dropped.
                    "dropped_notifications": e.dropped_notifications,
                    "transport_detail": e.identity.describe(),
                }
            )
        for item in self._sessions.skipped_entries():
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
        for sid, st in self._sessions.by_id.items():
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
                    # mcpool's own tool search (issue 31): mode, on now, bytes spared.
                    "tool_search": s.tool_search(),
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
                            "policy": v.policy.canonical(),
                            "prefix": v.prefix,
                            "source": v.source,
                        }
                        for name, v in s.views.items()
                    ],
                }
            )
        return out

    async def _admin_tools(self, params: _admin.ToolsParams) -> list[dict[str, Any]]:
        """What the session's client is served, each item with what a call (or get) of it
        does now: an item the current settings no longer allow is still served while a reload
        waits for new servers, and its calls are refused (S8). Such a row is kept, marked
        (`callable` false, `refused` says why), rather than left out: the client lists it
        until the reload ends, and the user comparing the two should see why it fails."""
        st = self._sessions.find(params.session)
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
        st = self._sessions.find(params.session)
        return explain(
            st, params.name, self._sessions.by_id, self._pool.entries(), self._files.files
        )

    async def _admin_stop(self, params: _admin.NoParams) -> dict[str, Any]:
        self._process.request_stop()
        return {"pid": self._process.pid}

    async def _admin_testCrash(self, params: _admin.NoParams) -> dict[str, Any]:
        """MCPOOL_TEST_HOOKS=1 only: an unexpected error in the daemon's own nursery (where the
        accept loop runs), as a bug in a shared task would raise one; answered first."""
        self._spawn_shared(_forced_failure)
        return {"pid": self._process.pid}

    async def _admin_testFail(self, params: _admin.NoParams) -> dict[str, Any]:
        """MCPOOL_TEST_HOOKS=1 only: a handler's unexpected error (a bug behind one command)."""
        raise RuntimeError("forced by the test hook mcpool/admin/testFail")

    async def _admin_reload(self, params: _admin.NoParams) -> dict[str, Any]:
        return {"files": await self._host.reload()}

    async def _admin_restart(self, params: _admin.RestartParams) -> dict[str, Any]:
        name = params.name
        before = {id(e): e.upstream for e in self._pool.entries() if e.name == name}
        waits = {id(e): e.state_changed for e in self._pool.entries() if e.name == name}
        entries = self._pool.restart(name)
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

    async def _admin_stats(self, params: _admin.NoParams) -> dict[str, Any]:
        in_flight: dict[str, int] = {}
        for e in self._pool.entries():
            up = e.upstream
            if up is not None:
                in_flight[e.name] = in_flight.get(e.name, 0) + up.in_flight
        stats = self._ledger.stats_json(in_flight)
        stats["audit"] = {
            "path": str(self._ledger.audit.path) if self._ledger.audit.path else None,
            "dropped": self._ledger.dropped_total,
        }
        stats["otel"] = self._ledger.otel is not None
        return stats

    async def _admin_changes(self, params: _admin.ChangesParams) -> list[dict[str, Any]]:
        return self._pins.changes_json(params.server)

    async def _admin_approve(self, params: _admin.ApproveParams) -> dict[str, Any]:
        approved = self._pins.approve(params.server, params.tools, params.file)
        # Each session with a view of the server projects it again: what was held is served,
        # and those whose view changed get list_changed.
        told = 0
        for st in list(self._sessions.by_id.values()):
            if params.server in st.session.views and not st.session.closed:
                st.session.views_changed("pins")
                told += 1
        return {
            "approved": [{"kind": c.kind, "name": c.name} for c in approved],
            "sessions": told,
        }

    async def _admin_logs(self, params: _admin.LogsParams) -> dict[str, Any]:
        lines, name = params.lines, params.name
        if not name:
            return {"lines": _tail(list(self._process.log_lines), lines)}
        found: list[str] = []
        matched = False
        for e in self._pool.entries():
            if e.name == name:
                matched = True
                tail = list(e.upstream.stderr_tail) if e.upstream else e.stderr_history
                # A server may echo its env or headers: never shown (X2).
                found.extend(e.identity.redact(line) for line in tail)
        for item in self._sessions.skipped_entries():
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
        st = self._sessions.find(params.session)
        name = params.name
        entry = parse_server_entry(name, params.entry)
        before = dict(st.session.views)
        actions = await self._host.set_override(st, name, entry)
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
        return await self._logins.login(params.name)

    async def _admin_loginWait(self, params: _admin.RestartParams) -> dict[str, Any]:
        return await self._logins.login_wait(params.name)

    async def _admin_logout(self, params: _admin.RestartParams) -> dict[str, Any]:
        return await self._logins.logout(params.name)
