"""Settings hosting: the files sessions read, what each session desires from them, the reload gate
(S7), the daemon's own leases (`"start": "always"`, prewarm).

A room of `Daemon` (daemon/_daemon.py): the rooms form one chain of base classes,
_core <- _hosting <- _admin_api <- _explain <- _connections <- _daemon, each using only what
the rooms below it define.
"""

from __future__ import annotations

import os
import time
import traceback
from typing import Any

import msgspec

from mcpool.pool import (
    EntryState,
    PoolEntry,
    PoolOptions,
    ServerSettings,
    TransportIdentity,
    Upstream,
    identity_of,
)
from mcpool.pool._environ import base_environment
from mcpool.protocol import (
    Message,
    SettingsError,
)
from mcpool.session import (
    Desired,
)

from ._core import EXIT_STOPPED, DaemonCore, _SessionState  # noqa: F401
from ._desired import desired
from ._expand import check_cwd, for_session
from ._settings import (
    DaemonOptions,
    LoadedFile,
    file_signature,
    read_settings_file,
    settings_base_dir,
)


class _DaemonLease:
    """The listener of the daemon's own leases (`"start": "always"`, prewarm): no session."""

    def snapshot_changed(self, entry: PoolEntry) -> None:
        pass

    def upstream_notification(self, entry: PoolEntry, method: str, params: Any) -> None:
        pass

    def server_request(self, entry: PoolEntry, upstream: Upstream, msg: Message) -> str | None:
        return "the daemon holds this server for no session; it has no client to ask"


_DAEMON_LEASE = _DaemonLease()


class SettingsHost(DaemonCore):
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
            list_once_budget=o.list_once_budget,
            list_once_clients=tuple(o.list_once_clients),
        )

    def desired_for(self, state: _SessionState) -> dict[str, Desired]:
        """What the session desires now: its files re-read where they changed on disk, the
        pure `desired` over them, then each newly skipped entry logged once."""
        layers = []
        for path in state.sources:
            loaded = self.files.get(path)
            if loaded is None or loaded.signature != file_signature(path):
                # New, or written since we read it (the watcher's event may still be on its
                # way): a session never starts from settings older than the file.
                loaded = self.load_file(path)
            layers.append((path, loaded.servers))
        out = desired(
            layers,
            state.overrides,
            env=state.env if state.env is not None else base_environment(),
            from_session=state.env is not None,
            pooling=self.options.pool,
            config_path=self.config_path,
            cwd=state.session.cwd,
        )
        for name, (source, error) in out.skipped.items():
            if state.skipped.get(name) != (source, error):
                level = "warning" if name in out.loops else "error"
                self.log(level, f"server '{name}' skipped: {error}", path=source, server=name)
        state.skipped = out.skipped
        return out.desired

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
            if entry is not None and entry.state is EntryState.CRASH_LOOP and view.source in paths:
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

    def _apply_log_level(self) -> None:
        """`--log-level` wins over the config's `daemon.logLevel`."""
        try:
            self.journal.set_level(self._cli_log_level or self.options.log_level)
        except ValueError as exc:
            self.journal.set_level("info")
            self.log("warning", f"daemon.logLevel ignored: {exc}", path=self.config_path)
