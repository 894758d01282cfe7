"""What a settings entry means for one session: `${VAR}` expanded, values checked, self-loops
refused. Pure functions of (entry, environment); `Daemon.desired_for` runs them for every entry
of every session before the transport identity is computed, so the expanded values are part of
the identity (two sessions with different values never share a process, the same values do).

Variables, as Claude Code's `.mcp.json` spells them: `${VAR}` and `${VAR:-default}` in `command`,
`args`, `env` values, `cwd`, `url`/`httpUrl` and header values. A set variable wins even when it
is empty (Claude Code's rule); the default is used only when it is unset; a reference to an unset
variable without a default skips that server with an error naming it, the file, the field and
the variable. Any other `$` text (`$VAR`, `${input:x}`) is passed as written.

The values come from the attaching session's own environment: `mcpool attach` sends the ones its
settings files reference (`referenced_names`, run by the bridge on the files' text). A session
without a bridge (a raw socket client, HTTP) expands from the daemon's base environment
(`mcpool.pool._environ`), never from whatever client started the daemon.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable, Mapping

import msgspec

from mcpool.pool import ServerSettings, TransportIdentity
from mcpool.pool._spec import printable
from mcpool.protocol import SettingsError

# `${NAME}` or `${NAME:-default}`; the default runs to the first `}` (no nesting, as Claude Code).
REFERENCE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")
# What the bridge scans a file's text for: cheap, and a superset of REFERENCE's names.
REFERENCED_NAME = re.compile(rb"\$\{([A-Za-z_][A-Za-z0-9_]*)(?=\}|:-)")


class SelfLaunch(SettingsError):
    """An entry that launches mcpool's own bridge: expected in a project's `.mcp.json` (the
    client launches mcpool from it), so logged as a warning rather than an error."""


class UnsetVariable(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def for_session(
    name: str, entry: ServerSettings, env: Mapping[str, str], source: str, *, from_session: bool
) -> ServerSettings:
    """What `entry` means for a session with `env`: expanded, its values checked, and refused
    (SelfLaunch) when it launches mcpool itself. SettingsError names server, file and field."""
    entry = expand_entry(name, entry, env, source, from_session=from_session)
    check_values(name, entry, source)
    loop = self_launch(entry)
    if loop is not None:
        raise SelfLaunch(loop, path=source, server=name, field="command")
    return entry


def check_cwd(
    name: str,
    identity: TransportIdentity,
    source: str,
    *,
    is_folder: Callable[[str], bool] = os.path.isdir,
) -> None:
    """Refuse a stdio entry whose (resolved) cwd is not a folder: a typo must not run the
    server somewhere else (a filesystem server given "." would then serve "/")."""
    if identity.cwd is not None and not is_folder(identity.cwd):
        raise SettingsError(
            f"cwd {printable(identity.cwd)} does not exist (or is not a folder): "
            "the server is not started",
            path=source,
            server=name,
            field="cwd",
        )


def skip_message(exc: SettingsError) -> str:
    """How a skipped entry is shown: where (file, server, field), then why."""
    return f"{exc.message}: {exc.reason}"


def referenced_names(data: bytes) -> set[str]:
    """The variable names a settings file's text references (a superset is fine: the bridge
    sends only the ones that are set)."""
    return {m.decode() for m in REFERENCED_NAME.findall(data)}


def expand_text(text: str, env: Mapping[str, str]) -> str:
    """`text` with its references replaced from `env`; UnsetVariable for the first unset one
    without a default."""
    if "${" not in text:
        return text

    def one(m: re.Match[str]) -> str:
        value = env.get(m.group("name"))
        if value is not None:
            return value
        default = m.group("default")
        if default is None:
            raise UnsetVariable(m.group("name"))
        return default

    return REFERENCE.sub(one, text)


def expand_entry(
    name: str,
    entry: ServerSettings,
    env: Mapping[str, str],
    source: str,
    *,
    from_session: bool = True,
) -> ServerSettings:
    """`entry` with every expandable field expanded (the same object when nothing referenced a
    variable). SettingsError naming the server, the file, the field and the variable."""
    field = "command"

    def x(value: str) -> str:
        try:
            return expand_text(value, env)
        except UnsetVariable as exc:
            where = (
                "the attaching session's environment (its bridge sends the variables the "
                "files referenced when it attached: a reference added since needs a new session)"
                if from_session
                else "the daemon's base environment (this session has no `mcpool attach`)"
            )
            raise SettingsError(
                f"${{{exc.name}}} is not set in {where} and has no default "
                f"(write ${{{exc.name}:-default}} for an optional one)",
                path=source,
                server=name,
                field=field,
            ) from None

    changes: dict[str, object] = {}
    if entry.command is not None:
        field = "command"
        changes["command"] = x(entry.command)
    args = []
    for i, arg in enumerate(entry.args):
        field = f"args[{i}]"
        args.append(x(arg))
    changes["args"] = args
    values: dict[str, str] = {}
    for key, value in entry.env.items():
        field = f"env.{key}"
        values[key] = x(value)
    changes["env"] = values
    if entry.cwd is not None:
        field = "cwd"
        changes["cwd"] = x(entry.cwd)
    if entry.url is not None:
        field = "url"
        changes["url"] = x(entry.url)
    if entry.http_url is not None:
        field = "httpUrl"
        changes["http_url"] = x(entry.http_url)
    headers: dict[str, str] = {}
    for key, value in entry.headers.items():
        field = f"headers.{key}"
        headers[key] = x(value)
    changes["headers"] = headers
    if all(getattr(entry, k) == v for k, v in changes.items()):
        return entry
    return msgspec.structs.replace(entry, **changes)


# An HTTP field name (RFC 9110 token).
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def check_values(name: str, entry: ServerSettings, source: str) -> None:
    """Refuse values that cannot be sent as they are: a header value with a newline or another
    control character (it would be a broken or smuggled HTTP header, and the HTTP library's
    error quotes it), a non-ASCII header value, a NUL in anything passed to exec, an env
    name with `=`. Run on the expanded entry. The error never quotes the value."""

    def refuse(field: str, why: str) -> SettingsError:
        return SettingsError(why, path=source, server=name, field=field)

    for key, value in entry.headers.items():
        if not _TOKEN.fullmatch(key):
            raise refuse(f"headers.{printable(key)}", "not a valid HTTP header name")
        if any(c != "\t" and (ord(c) < 0x20 or ord(c) == 0x7F) for c in value):
            raise refuse(
                f"headers.{key}",
                "the header value contains a newline or another control character "
                "(a trailing newline from a pasted token?); it is not sent",
            )
        if not value.isascii():
            # The HTTP client encodes header values as ASCII: anything else would fail every
            # request with an encoding error instead of this one.
            raise refuse(f"headers.{key}", "the header value has non-ASCII characters")
    for key, value in entry.env.items():
        if not key or "=" in key or "\0" in key:
            raise refuse(f"env.{printable(key)}", "not a valid environment variable name")
        if "\0" in value:
            raise refuse(f"env.{key}", "the value contains a NUL byte")
    exec_fields = [("command", entry.command), ("cwd", entry.cwd)]
    exec_fields += [(f"args[{i}]", a) for i, a in enumerate(entry.args)]
    for field, text in exec_fields:
        if text is not None and "\0" in text:
            raise refuse(field, "contains a NUL byte")
    for field, url in (("url", entry.url), ("httpUrl", entry.http_url)):
        if url is not None and any(c.isspace() or not c.isprintable() for c in url):
            raise refuse(field, "the URL contains whitespace or control characters")


def self_launch(entry: ServerSettings, install_script: str | None = None) -> str | None:
    """Why `entry` launches mcpool's own bridge (None when it does not): an element of its
    command line that is mcpool (`mcpool`, `-m mcpool`, `uvx mcpool`, this install's script
    under any name) followed by `attach`. What this misses (`sh -c "mcpool attach"`) the
    run-time marker catches (`mcpool.pool._environ.UPSTREAM_MARKER`)."""
    if entry.command is None:
        return None
    words = [entry.command, *entry.args]
    script = install_script if install_script is not None else _install_script()
    for i, word in enumerate(words[:-1]):
        if words[i + 1] != "attach":
            continue
        if os.path.basename(word) == "mcpool" or (
            "/" in word and script is not None and os.path.realpath(word) == script
        ):
            shown = " ".join(words[: i + 2])
            return (
                f"it launches mcpool itself ({shown}): the daemon would become its own "
                "upstream. Remove the entry from this file (the client runs `mcpool attach`; "
                "the daemon must not)"
            )
    return None


@functools.cache  # the install does not move under a running daemon
def _install_script() -> str | None:
    """This install's `mcpool` console script, resolved (a symlink to it is mcpool too)."""
    script = os.path.join(os.path.dirname(sys.executable), "mcpool")
    return os.path.realpath(script) if os.path.exists(script) else None
