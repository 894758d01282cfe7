"""Where mcpool keeps its socket, configuration and state.

Stdlib only: the attach bridge imports this on every client launch. XDG variables are honoured
only when set to an absolute path, as the XDG Base Directory spec requires; an empty or relative
value means "unset".
"""

from __future__ import annotations

import os
from pathlib import Path


def _explicit(value: str) -> Path:
    # The daemon does not share the caller's working directory (it is started in "/"), so a
    # relative --socket or $MCPOOL_SOCKET must be pinned down here, where it was meant.
    return Path(os.path.abspath(os.path.expanduser(value)))


def _xdg(name: str) -> Path | None:
    value = os.environ.get(name, "")
    return Path(value) if os.path.isabs(value) else None


def socket_path(cli: str | None = None) -> Path:
    if cli:
        return _explicit(cli)
    if env := os.environ.get("MCPOOL_SOCKET"):
        return _explicit(env)
    if configured := _configured_socket():
        return _explicit(configured)
    if runtime := _xdg("XDG_RUNTIME_DIR"):
        return runtime / "mcpool" / "daemon.sock"
    return Path(f"/tmp/mcpool-{os.getuid()}") / "daemon.sock"


def _configured_socket() -> str | None:
    """`"daemon": {"socket": PATH}` in the user config, read with the stdlib (bridge start-up)."""
    try:
        with open(config_path(None), "rb") as f:
            import json

            doc = json.loads(f.read() or b"{}")
    except (OSError, ValueError):
        return None
    daemon = doc.get("daemon") if isinstance(doc, dict) else None
    value = daemon.get("socket") if isinstance(daemon, dict) else None
    return value if isinstance(value, str) and value else None


def config_path(cli: str | None = None) -> Path:
    if cli:
        return _explicit(cli)
    if env := os.environ.get("MCPOOL_CONFIG"):
        return _explicit(env)
    if config_home := _xdg("XDG_CONFIG_HOME"):
        return config_home / "mcpool" / "config.json"
    return Path.home() / ".config" / "mcpool" / "config.json"


def state_dir() -> Path:
    if state_home := _xdg("XDG_STATE_HOME"):
        return state_home / "mcpool"
    return Path.home() / ".local" / "state" / "mcpool"


def lock_path(sock: Path) -> Path:
    return sock.with_name(sock.name + ".lock")


def daemon_log_path(sock: Path) -> Path:
    """The daemon's own log. One per user for now; `sock` is taken so that a per-socket log can
    come later without changing callers."""
    return state_dir() / "daemon.log"
