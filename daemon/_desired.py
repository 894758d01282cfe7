"""What one session desires from its settings: a pure function of the files' servers, its runtime
overrides and its environment.

Theory of operation: a session reads its sources in order, later files overriding earlier ones
entry by entry, and `daemonctl set-server` overrides last. Each entry left is expanded for the
session (its variables, its values checked, a self-launch refused), given an identity (what the
pool shares processes by) and checked for a cwd that is a folder. What cannot be used is
skipped, with why. The caller (`SettingsHost.desired_for`, daemon/_hosting.py) does the I/O
around it: it reads or re-reads the files first, and afterwards logs each newly skipped entry
and keeps the skipped set on the session's state.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import msgspec

from mcpool.pool import ServerSettings, identity_of
from mcpool.protocol import SettingsError
from mcpool.session import UNSHARED, Desired, Interner, PolicyKey

from ._expand import SelfLaunch, check_cwd, for_session, skip_message
from ._settings import settings_base_dir

RUNTIME_SOURCE = "<runtime>"  # the source of a `daemonctl set-server` override


class DesiredServers(NamedTuple):
    desired: dict[str, Desired]
    # Entries refused (unset variable, self-launch, bad value, missing cwd): name -> (file, why).
    skipped: dict[str, tuple[str, str]]
    # The skipped entries that launch mcpool itself (logged as a warning, not an error).
    loops: frozenset[str]


def desired(
    layers: Sequence[tuple[str, Mapping[str, ServerSettings]]],
    overrides: Mapping[str, tuple[ServerSettings, str]],
    *,
    env: Mapping[str, str],
    from_session: bool,
    pooling: bool,
    config_path: str,
    cwd: str | None,
    is_folder: Callable[[str], bool] = os.path.isdir,
    interner: Interner = UNSHARED,
) -> DesiredServers:
    """The servers a session desires. `layers`: each source file's servers, in the session's
    order; `overrides`: its runtime entries, name -> (settings, source); `env`: the values its
    settings' references expand from; `pooling`: false under the troubleshooting switch
    (`"pool": false`), where every session connects its own upstreams; `is_folder`: how a
    stdio server's cwd is checked (the one look at the disk, given so a test can answer it);
    `interner`: where its policy keys and identities are shared (the daemon's)."""
    merged: dict[str, tuple[ServerSettings, str]] = {}
    for path, servers in layers:
        for name, entry in servers.items():
            merged.pop(name, None)  # re-inserted: the later file's order wins
            merged[name] = (entry, path)
    for name, (entry, source) in overrides.items():
        merged.pop(name, None)
        merged[name] = (entry, source)
    out: dict[str, Desired] = {}
    skipped: dict[str, tuple[str, str]] = {}
    loops: set[str] = set()
    for name, (entry, source) in merged.items():
        if entry.disabled:
            continue
        key = PolicyKey.from_settings(entry, interner)
        try:
            entry = for_session(name, entry, env, source, from_session=from_session)
        except SettingsError as exc:
            skipped[name] = (source, skip_message(exc))
            if isinstance(exc, SelfLaunch):
                loops.add(name)
            continue
        if not pooling:
            # Every session connects its own upstreams, and the connected identity includes
            # the policy key, so a policy change reconnects.
            entry = msgspec.structs.replace(entry, scope="session")
        base = (
            settings_base_dir(source, config_path)
            if source != RUNTIME_SOURCE
            else (cwd or os.path.expanduser("~"))
        )
        try:
            identity = identity_of(
                name,
                entry,
                base_dir=base,
                session_roots=(cwd,) if cwd else (),
                policy=None if pooling else key.encoded(),
                tables=interner.pool,
            )
            check_cwd(name, identity, source, is_folder=is_folder)
        except SettingsError as exc:
            skipped[name] = (source, skip_message(exc))
            continue
        out[name] = Desired(name, entry, identity, key, source)
    return DesiredServers(out, skipped, frozenset(loops))
