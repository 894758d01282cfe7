"""The settings files the daemon has read, its own options from the config, and what each session
desires from its files.

`SettingsFiles` owns the files (path -> the last read, `LoadedFile`), the set of files watched
(the config plus every attached session's sources) and the daemon's options. It reads files and
logs what it found; it holds no session and no pool. `desired_for` does the I/O around the pure
`desired` (daemon/_desired.py): it re-reads a source that changed on disk first, and logs each
newly skipped entry after.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from mcpool.pool import PoolOptions, ServerSettings, TransportIdentity, identity_of
from mcpool.pool._environ import base_environment
from mcpool.protocol import SettingsError
from mcpool.session import Desired, Interner

from ._attached import SessionRecord
from ._core import DaemonProcess
from ._desired import desired
from ._expand import check_cwd, for_session
from ._settings import (
    DaemonOptions,
    LoadedFile,
    file_signature,
    read_settings_file,
    settings_base_dir,
)
from ._watched import WatchedFiles


class SettingsFiles:
    def __init__(self, config_path: str, process: DaemonProcess, interner: Interner) -> None:
        self.config_path = config_path
        self.interner = interner  # the daemon's: what sessions' settings share
        self._process = process
        self._log: Callable[..., None] = process.log
        self.files: dict[str, LoadedFile] = {}
        # The config plus every session's sources, counted per session (O(1) attach/detach).
        self.watched = WatchedFiles([config_path])
        self.options = DaemonOptions()
        self.notes: list[str] = []  # what `daemonctl status` should say about the options

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
            self._log(
                "error",
                f"settings file {path} not applied: {loaded.error}{kept}",
                **(loaded.error_at or {"path": path}),
            )
        elif loaded.status == "missing" and previous is not None and previous.servers:
            self._log("info", f"settings file {path} is gone: its servers are removed", path=path)
        return loaded

    def apply_daemon_options(self) -> None:
        """The config's `daemon` section in force (its log level too)."""
        loaded = self.files.get(self.config_path)
        opts = loaded.daemon if loaded and loaded.daemon else DaemonOptions()
        if os.environ.get("MCPOOL_NO_POOL") == "1":
            opts = msgspec.structs.replace(opts, pool=False)
        self.options = opts
        self.notes = [n for n in self.notes if not n.startswith("daemon.socket")]
        sock_path = self._process.sock_path
        if opts.socket and os.path.abspath(os.path.expanduser(opts.socket)) != sock_path:
            self.notes.append(
                f"daemon.socket is now {opts.socket}, but this daemon listens on "
                f"{sock_path}: restart the daemon to move it"
            )
        self._process.apply_log_level(opts.log_level, self.config_path)

    def pool_options(self) -> PoolOptions:
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

    def desired_for(self, record: SessionRecord) -> dict[str, Desired]:
        """What the session desires now: its files re-read where they changed on disk, the
        pure `desired` over them, then each newly skipped entry logged once."""
        layers = []
        for path in record.sources:
            loaded = self.files.get(path)
            if loaded is None or loaded.signature != file_signature(path):
                # New, or written since we read it (the watcher's event may still be on its
                # way): a session never starts from settings older than the file.
                loaded = self.load_file(path)
            layers.append((path, loaded.servers))
        out = desired(
            layers,
            record.overrides,
            env=record.env if record.env is not None else base_environment(),
            from_session=record.env is not None,
            pooling=self.options.pool,
            config_path=self.config_path,
            cwd=record.session.cwd,
            interner=self.interner,
        )
        for name, (source, error) in out.skipped.items():
            if record.skipped.get(name) != (source, error):
                level = "warning" if name in out.loops else "error"
                self._log(level, f"server '{name}' skipped: {error}", path=source, server=name)
        record.skipped = out.skipped
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
                identity = identity_of(name, entry, base_dir=base, tables=self.interner.pool)
                check_cwd(name, identity, self.config_path)
            except SettingsError:
                continue
            out[name] = (identity, entry)
        return out

    def watched_files(self) -> set[str]:
        return self.watched.files()

    def watch(self, sources: Iterable[str]) -> bool:
        """A session reads these; True when the watched set grew."""
        return self.watched.add(sources)

    def unwatch(self, sources: Iterable[str]) -> bool:
        """A session no longer reads these; True when the watched set shrank. A file no session
        reads any more is forgotten (read afresh if one attaches again): a daemon that lives
        for weeks must not keep every project it ever served."""
        if not self.watched.remove(sources):
            return False
        for path in [p for p in self.files if p not in self.watched]:
            del self.files[path]
        return True

    def stale_files(self) -> set[str]:
        """Watched files whose on-disk signature is not the one last read."""
        return {
            path
            for path in self.watched_files()
            if (loaded := self.files.get(path)) is not None
            and loaded.signature != file_signature(path)
        }

    def describe(self) -> list[dict[str, Any]]:
        """Each file as `daemonctl status` shows it."""
        return [
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
