"""Settings hosting: reloads under the one gate (S7), applying settings to sessions, the watcher,
and the daemon's own leases (`"start": "always"`, prewarm).

`SettingsHost` is made by `Daemon.run` once the pool exists, from the settings files, the
attached sessions and the pool; it owns the reload gate, the settings generation and the
watcher. `DaemonLeases` owns the leases the daemon itself holds.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable
from typing import Any

import trio

from mcpool.pool import (
    EntryState,
    Handle,
    Pool,
    PoolEntry,
    ServerSettings,
    Upstream,
)
from mcpool.protocol import Message

from ._attached import AttachedSessions, SessionRecord
from ._desired import RUNTIME_SOURCE
from ._settings_files import SettingsFiles
from ._watch import SettingsWatcher


class _DaemonLease:
    """The listener of the daemon's own leases (`"start": "always"`, prewarm): no session."""

    def snapshot_changed(self, entry: PoolEntry) -> None:
        pass

    def upstream_notification(self, entry: PoolEntry, method: str, params: Any) -> None:
        pass

    def server_request(self, entry: PoolEntry, upstream: Upstream, msg: Message) -> str | None:
        return "the daemon holds this server for no session; it has no client to ask"


_DAEMON_LEASE = _DaemonLease()


class DaemonLeases:
    """The daemon's own leases on the user file's servers (L6)."""

    def __init__(self, pool: Pool, files: SettingsFiles, log: Callable[..., None]) -> None:
        self._pool = pool
        self._files = files
        self._log = log
        self.kept: dict[str, Handle] = {}

    def keep_always(self) -> None:
        """Hold one daemon lease on each `"start": "always"` server of the user file, so it
        runs before any session attaches and never drains; let go of ones no longer asked."""
        want = {n: v for n, v in self._files.own_servers().items() if v[1].start == "always"}
        for name, handle in list(self.kept.items()):
            if name not in want or want[name][0] != handle.identity:
                del self.kept[name]
                self._pool.release(handle)
        for name, (identity, entry) in want.items():
            if name not in self.kept:
                self._log("info", f"server '{name}': started with the daemon (start: always)")
                self.kept[name] = self._pool.lease(identity, entry, "daemon", _DAEMON_LEASE)

    def prewarm(self) -> None:
        """`"daemon": {"prewarm": true}`: start the user file's eager servers now; each drains
        after the drain grace unless a session takes it."""
        for name, (identity, entry) in self._files.own_servers().items():
            if entry.start == "eager":
                self._log("info", f"server '{name}': prewarmed")
                self._pool.release(self._pool.lease(identity, entry, "daemon", _DAEMON_LEASE))


class SettingsHost:
    def __init__(
        self,
        files: SettingsFiles,
        sessions: AttachedSessions,
        pool: Pool,
        leases: DaemonLeases,
        log: Callable[..., None],
    ) -> None:
        self.files = files
        self._sessions = sessions
        self._pool = pool
        self._leases = leases
        self._log = log
        self._gate = trio.Lock()
        self.generation = 0
        self.watcher = SettingsWatcher(self.files_changed, files.stale_files, log=log)

    def watch_sources(self, sources: Iterable[str]) -> None:
        """A session opened that reads these."""
        if self.files.watch(sources):
            self.watcher.watch(self.files.watched_files())

    def unwatch_sources(self, sources: Iterable[str]) -> None:
        """A session that read these closed."""
        if self.files.unwatch(sources):
            self.watcher.watch(self.files.watched_files())

    async def apply_to_session(self, record: SessionRecord) -> list[tuple[str, str]]:
        async with record.lock:
            if record.session.closed:
                return []
            return await record.session.apply_settings(
                self.files.desired_for(record), self.generation
            )

    async def set_override(
        self, record: SessionRecord, name: str, entry: ServerSettings
    ) -> list[tuple[str, str]]:
        """`daemonctl set-server`: one session's runtime entry, applied under the gate."""
        async with self._gate:
            record.overrides[name] = (entry, RUNTIME_SOURCE)
            self.generation += 1
            return await self.apply_to_session(record)

    async def reload(self, only: set[str] | None = None) -> list[dict[str, Any]]:
        """S7: re-read the files (all, or `only`), then reconcile the affected sessions, in
        that order, under the one gate. A file that fails keeps its previous servers."""
        async with self._gate:
            watched = self.files.watched_files()
            paths = watched if only is None else only & watched
            results: list[dict[str, Any]] = []
            for path in sorted(paths):
                before = self.files.files.get(path)
                loaded = self.files.load_file(path)
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
            if self.files.config_path in paths:
                self.files.apply_daemon_options()
                self._pool.options = self.files.pool_options()
                self._leases.keep_always()
            self.generation += 1
            affected = [st for st in self._sessions if only is None or paths & set(st.sources)]
            actions_by_session: dict[str, list[str]] = {}
            for st in affected:
                actions = await self.apply_to_session(st)
                changed = [f"{n}: {a}" for n, a in actions if a != "keep"]
                self._restart_crash_looped(st, paths)
                if changed:
                    self._log("info", f"session {st.session.id} reconciled", actions=changed)
                actions_by_session[st.session.id] = changed
            for r in results:
                r["sessions"] = {
                    st.session.id: actions_by_session.get(st.session.id, [])
                    for st in affected
                    if r["path"] in st.sources
                }
            return results

    def _restart_crash_looped(self, st: SessionRecord, paths: set[str]) -> None:
        """A settings change to a crash-looping server gives it a fresh start."""
        for view in st.session.views.values():
            entry = view.handle.entry if view.handle else None
            if entry is not None and entry.state is EntryState.CRASH_LOOP and view.source in paths:
                self._pool.restart_entry(entry)

    async def files_changed(self, paths: set[str]) -> None:
        """The watcher saw these files change (atomic replace or in-place write)."""
        self._log("info", "settings files changed", paths=sorted(paths))
        await self.reload_fenced("the settings watcher", paths)

    async def reload_fenced(self, trigger: str, only: set[str] | None = None) -> None:
        """A reload run by a shared task (the watcher, SIGHUP): whatever fails in it is logged
        with its traceback, and the task goes on watching."""
        try:
            await self.reload(only)
        except Exception as exc:
            self._log(
                "error",
                f"reload by {trigger} failed: {type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(),
            )
