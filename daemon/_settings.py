"""Settings files: loading, validation with precise errors, and the last good version of each.

A file that does not parse or does not validate leaves its previous good version in force; the
error names the file, the server and the field (line and column for JSON syntax errors).

The statuses a file can have (`daemonctl status`, config[].status):
- "ok": read and applied; `{}` is a valid file with no servers.
- "error": the file exists but cannot be used: empty (an editor's truncate-then-write, or
  `cat f > f`), cut short mid-write, not JSON, not valid settings, unreadable, or not a regular
  file. The previous good generation stays in force (`servers` in force, `applied_at` when
  they were read); an error seen at daemon start, with no previous generation, has no servers.
- "missing": the file does not exist; its servers are gone. (The watcher re-checks an empty or
  missing file once after a short settle delay before reporting it: daemon/_watch.py.)
"""

from __future__ import annotations

import os
import re
import stat
from typing import Annotated, Any

import msgspec

from mcpool.pool import PinningMode, ServerSettings, transport_kind
from mcpool.protocol import SettingsError
from mcpool.session._toolsearch import DEFAULT_MIN_BYTES, DEFAULT_MIN_TOOLS, ToolSearchMode

from ._files import read_bounded

DEFAULT_MAX_LINE = 16 * 1024 * 1024
# A settings file is a few KiB; a larger one is a mistake (a log or a dump saved over it), read
# no further than this so it cannot exhaust the daemon's memory.
MAX_SETTINGS_BYTES = 4 * 1024 * 1024


_ClientNeedle = Annotated[str, msgspec.Meta(min_length=1, max_length=100)]


class DaemonOptions(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    """The `"daemon"` object of the user config file."""

    drain_grace: float = 30.0
    max_idle: float = 300.0
    pool: bool = True
    page_size: int = 500
    log_level: str = "info"
    max_message_bytes: int = DEFAULT_MAX_LINE
    # A client that stops reading is disconnected once this much is queued for it.
    session_buffer_bytes: int = 8 * 1024 * 1024
    shutdown_timeout: float = 10.0
    # Read when the daemon starts (and by `mcpool attach`/daemonctl); a change needs a restart.
    socket: str | None = None
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    # Seconds each request to an upstream may take when its entry sets no `timeout`
    # (gemini-cli's 10 minutes for a tool call); then the caller gets an error naming the server.
    request_timeout: Annotated[float, msgspec.Meta(gt=0)] = 600.0
    # The longest exposed tool name for every session (session/_names.py); None: per client.
    max_name_length: Annotated[int, msgspec.Meta(ge=1, le=1024)] | None = None
    # L6: seconds a session's first list waits for its servers' first start before it is served
    # what is ready (late ones follow by list_changed); Codex waits about 1 s for a server.
    startup_budget: Annotated[float, msgspec.Meta(ge=0, le=600)] = 1.5
    # Issue 28: clients that list once and never again on list_changed (Codex, Qwen Code: known
    # by clientInfo; `listOnceClients` names more, by a part of their clientInfo name) have
    # their first list wait up to this for a server never seen up (under Codex's own 10 s).
    list_once_budget: Annotated[float, msgspec.Meta(ge=0, le=600)] = 8.0
    list_once_clients: Annotated[list[_ClientNeedle], msgspec.Meta(max_length=100)] = []
    # Start the user file's eager servers with the daemon (they drain as usual if unused).
    prewarm: bool = False
    # `mcpool daemon --http` (daemon/_http.py), read at each decision (a change applies to what
    # comes next). Connections open at once, in all and from one uid (a remote peer: one
    # address); connections accepted whose peer's uid is not known yet; HTTP sessions (the
    # oldest idle one is ended for a new one); bytes of request bodies being read at once.
    http_max_connections: Annotated[int, msgspec.Meta(ge=1)] = 512
    http_max_connections_per_uid: Annotated[int, msgspec.Meta(ge=1)] = 256
    http_max_pending_lookups: Annotated[int, msgspec.Meta(ge=1)] = 64
    http_max_sessions: Annotated[int, msgspec.Meta(ge=1)] = 256
    http_max_pending_body_bytes: Annotated[int, msgspec.Meta(ge=1)] = 64 * 1024 * 1024
    # Seconds a request's whole head, then its whole body, may take to arrive (slowloris).
    http_head_timeout: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0
    http_body_timeout: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 60.0
    # What a tool or prompt whose definition changed since it was first served does (issue 30,
    # session/_pins.py): "warn" serves it and says so, "hold" serves neither definition until
    # `daemonctl approve`, "off" pins nothing. A server's own "pinning" overrides it.
    pinning: PinningMode = "warn"
    # mcpool's own tool search (issue 31, session/_toolsearch.py): "auto" turns it on for a
    # session whose client has none of its own once its view holds more than toolSearchTools
    # tools or toolSearchBytes bytes of definitions; "on", "off" for every session (`mcpool
    # attach --tool-search` decides for one). Read when a session opens.
    tool_search: ToolSearchMode = "auto"
    tool_search_tools: Annotated[int, msgspec.Meta(ge=0)] = DEFAULT_MIN_TOOLS
    tool_search_bytes: Annotated[int, msgspec.Meta(ge=0)] = DEFAULT_MIN_BYTES


class SettingsDocument(msgspec.Struct, rename="camel", kw_only=True):
    mcp_servers: dict[str, ServerSettings] = msgspec.field(default_factory=dict)
    # VS Code's mcp.json spells it "servers".
    servers: dict[str, ServerSettings] = msgspec.field(default_factory=dict)
    daemon: DaemonOptions | None = None


class LoadedFile(msgspec.Struct, kw_only=True):
    path: str
    status: str  # ok | missing | error (see the module docstring)
    servers: dict[str, ServerSettings] = msgspec.field(default_factory=dict)
    daemon: DaemonOptions | None = None
    error: str | None = None
    # Where the error is, as far as known: path, line, column, server, field.
    error_at: dict[str, Any] | None = None
    loaded_at: float | None = None
    # When the servers in force were read: loaded_at for "ok"; for "error", that of the
    # previous good generation it keeps (None: nothing was ever applied).
    applied_at: float | None = None
    generation: int = 0
    # (mtime_ns, size, inode) of what was read: lets an attach see a write the watcher has
    # not delivered yet.
    signature: tuple[int, int, int] | None = None


def file_signature(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):  # ValueError: a NUL byte in a path a session sent
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


_PATH_RE = re.compile(r"at `\$\.(?P<path>[^`]*)`")
_BYTE_RE = re.compile(r"\(byte (?P<byte>\d+)\)")


def _line_col(data: bytes, offset: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, offset) + 1
    col = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
    return line, col


def _field_of(exc: msgspec.ValidationError) -> tuple[str | None, str]:
    """The field path msgspec names (`$.args[0]` -> `args[0]`), and the bare reason."""
    text = str(exc)
    m = _PATH_RE.search(text)
    reason = _PATH_RE.sub("", text).strip(" -")
    return (m.group("path") if m else None), reason


def parse_settings(data: bytes, path: str) -> SettingsDocument:
    """Decode and validate one settings file; raise SettingsError naming file, server, field.

    Entries are validated one by one (msgspec names a dict value `[...]` in its error paths,
    which would lose the server's name).
    """
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        text = str(exc)
        m = _BYTE_RE.search(text)
        line = col = None
        reason = f"not valid JSON: {_BYTE_RE.sub('', text).strip()}"
        if m:
            line, col = _line_col(data, int(m.group("byte")))
        elif "truncated" in text:
            # msgspec gives no offset here: the error is where the data stops.
            line, col = _line_col(data, len(data))
            reason = "not valid JSON: it ends early (cut short while being written?)"
        raise SettingsError(reason, path=path, line=line, column=col) from exc
    except RecursionError:
        # Hostile nesting (`[[[[...`) exhausts the decoder's stack: an error like any other.
        raise SettingsError("not valid JSON: nested too deeply", path=path) from None
    if not isinstance(raw, dict):
        raise SettingsError("the top level must be a JSON object", path=path)
    servers: dict[str, ServerSettings] = {}
    for key in ("servers", "mcpServers"):
        section = raw.get(key, {})
        if not isinstance(section, dict):
            raise SettingsError(f"{key} must be an object", path=path, field=key)
        for name, entry in section.items():
            if not name or name != name.strip():
                raise SettingsError(
                    "server names must be non-empty with no surrounding spaces",
                    path=path,
                    server=name,
                )
            try:
                settings = msgspec.convert(entry, ServerSettings)
            except msgspec.ValidationError as exc:
                field, reason = _field_of(exc)
                raise SettingsError(reason, path=path, server=name, field=field) from exc
            except RecursionError:
                raise SettingsError("nested too deeply", path=path, server=name) from None
            transport_kind(name, settings, path)
            servers[name] = settings
    daemon = None
    if raw.get("daemon") is not None:
        try:
            daemon = msgspec.convert(raw["daemon"], DaemonOptions)
        except RecursionError:
            raise SettingsError("nested too deeply", path=path, field="daemon") from None
        except msgspec.ValidationError as exc:
            field, reason = _field_of(exc)
            raise SettingsError(
                reason, path=path, field=f"daemon.{field}" if field else "daemon"
            ) from exc
    return SettingsDocument(mcp_servers=servers, daemon=daemon)


def parse_server_entry(name: str, entry: Any, source: str = "<runtime>") -> ServerSettings:
    """Validate one server entry given at runtime (`daemonctl session set-server`)."""
    data = msgspec.json.encode({"mcpServers": {name: entry}})
    return parse_settings(data, source).mcp_servers[name]


def read_settings_file(path: str, *, now: float, previous: LoadedFile | None) -> LoadedFile:
    """Read `path`; never raises. On failure the previous good servers stay in force (status
    says error); a file that does not exist is "missing" and has no servers."""
    try:
        # O_NONBLOCK: a FIFO put in place of the file must not hang the daemon's reload.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return LoadedFile(path=path, status="missing", loaded_at=now)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        return _failed(path, SettingsError(f"cannot read it: {reason}", path=path), previous, now)
    try:
        st = os.fstat(fd)
        signature = (st.st_mtime_ns, st.st_size, st.st_ino)
        if not stat.S_ISREG(st.st_mode):
            error = SettingsError("not a regular file", path=path)
            return _failed(path, error, previous, now, signature)
        data = read_bounded(fd, MAX_SETTINGS_BYTES)
    except OSError as exc:
        error = SettingsError(f"cannot read it: {exc.strerror}", path=path)
        return _failed(path, error, previous, now)
    finally:
        os.close(fd)
    try:
        if len(data) > MAX_SETTINGS_BYTES:
            raise SettingsError(f"larger than {MAX_SETTINGS_BYTES} bytes", path=path)
        if not data.strip():
            # Never "no servers": an editor truncates before it writes, and `cat f > f` leaves
            # the file empty. A file with no servers says so: `{}`.
            raise SettingsError(
                "the file is empty (cut short while being written?); a file with no servers "
                "is `{}`",
                path=path,
                line=1,
                column=1,
            )
        doc = parse_settings(data, path)
    except SettingsError as exc:
        return _failed(path, exc, previous, now, signature)
    return LoadedFile(
        path=path,
        status="ok",
        servers=doc.mcp_servers,
        daemon=doc.daemon,
        loaded_at=now,
        applied_at=now,
        signature=signature,
    )


def _failed(
    path: str,
    exc: SettingsError,
    previous: LoadedFile | None,
    now: float,
    signature: tuple[int, int, int] | None = None,
) -> LoadedFile:
    """An unusable file: the previous generation's servers and options stay in force."""
    kept = previous if previous is not None and previous.status != "missing" else None
    where = {
        key: value
        for key, value in (
            ("path", exc.path),
            ("line", exc.line),
            ("column", exc.column),
            ("server", exc.server),
            ("field", exc.field),
        )
        if value is not None
    }
    return LoadedFile(
        path=path,
        status="error",
        servers=kept.servers if kept else {},
        daemon=kept.daemon if kept else None,
        error=exc.message + ": " + exc.reason,
        error_at=where,
        loaded_at=now,
        applied_at=kept.applied_at if kept else None,
        signature=signature,
    )


def settings_base_dir(path: str, config_path: str) -> str:
    """The folder a settings file's relative paths (and cwd-less stdio servers) refer to."""
    if os.path.abspath(path) == os.path.abspath(config_path):
        return os.path.expanduser("~")
    return os.path.dirname(os.path.abspath(path))
