"""The environment a stdio upstream starts with (issue 12 item 4, issue 13 point 1).

A shared upstream must not depend on which client happened to start the daemon: a bridge that
autostarts the daemon hands it the whole environment of its editor (that editor's tokens, its
`AWS_PROFILE`, a project's virtualenv), and a daemon under systemd gets the user manager's. So an
upstream never inherits the daemon's environment wholesale: it gets the *base environment*, the
daemon's values of an allowlist of variables that describe the user and the machine rather than
one client (who the user is, where their files and tools are, their locale, display and proxy),
then the entry's own `env`, then the marker below. Anything else a server needs is named in its
entry (`"env": {"AWS_PROFILE": "${AWS_PROFILE}"}`), where it is expanded from the attaching
session's environment and becomes part of the transport identity.

An allowlist rather than scrubbing what a client added: the daemon cannot know which of the
variables it inherited were "only for" the client that started it, and a list of known secrets
is never complete.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# Who and where: the user, their shell and tool search path, their folders and temp space.
BASE_NAMES = frozenset(
    {
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "PATH",
        "TMPDIR",
        # Locale and time.
        "LANG",
        "LANGUAGE",
        "TZ",
        # The desktop session: servers that open a browser or a notification use these.
        "DISPLAY",
        "WAYLAND_DISPLAY",
        "DBUS_SESSION_BUS_ADDRESS",
        # Network: the machine's proxy and the CA bundles its TLS clients trust.
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "all_proxy",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
    }
)
# Locale categories (LC_ALL, LC_CTYPE...) and the XDG folders (XDG_RUNTIME_DIR, XDG_CONFIG_HOME...).
BASE_PREFIXES = ("LC_", "XDG_")

# Set in every stdio upstream's environment, to the daemon's pid: a nested `mcpool attach` (an
# entry that launches mcpool itself, however it is spelled) that reaches this same daemon sees
# it and refuses, so the daemon never becomes its own upstream. daemon/_attach.py spells the
# name itself (it imports nothing heavy); tests/daemon/test_expand.py checks that the two agree.
UPSTREAM_MARKER = "MCPOOL_UPSTREAM"
# Set beside it to `<daemon pid>.<n>`, a different n for every process the daemon starts: what
# that process starts inherits it, and so stays attributable to it after leaving its process
# group and losing its parent (pool/_guardian.py, "Escaped descendants").
SPAWN_MARKER = "MCPOOL_UPSTREAM_ID"


def base_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allowlisted variables of `environ` (the daemon's own environment by default)."""
    source = os.environ if environ is None else environ
    return {
        name: value
        for name, value in source.items()
        if name in BASE_NAMES or name.startswith(BASE_PREFIXES)
    }


def upstream_environment(
    entry_env: tuple[tuple[str, str], ...],
    *,
    environ: Mapping[str, str] | None = None,
    daemon_pid: int | None = None,
    spawn_id: str | None = None,
) -> dict[str, str]:
    """The complete environment of one stdio upstream: base, then the entry's env, then the
    markers (last, so no entry can unset them); SPAWN_MARKER only when `spawn_id` is given."""
    env = base_environment(environ)
    env.update(entry_env)
    env[UPSTREAM_MARKER] = str(os.getpid() if daemon_pid is None else daemon_pid)
    if spawn_id is not None:
        env[SPAWN_MARKER] = spawn_id
    return env
