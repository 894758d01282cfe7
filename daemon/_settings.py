"""Settings files: loading, validation with precise errors, and the last good version of each.

A file that does not parse or does not validate leaves its previous good version in force; the
error names the file, the server and the field (line and column for JSON syntax errors).
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Any

import msgspec

from mcpool.pool import ServerSettings, transport_kind
from mcpool.protocol import SettingsError

DEFAULT_MAX_LINE = 16 * 1024 * 1024


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


class SettingsDocument(msgspec.Struct, rename="camel", kw_only=True):
    mcp_servers: dict[str, ServerSettings] = msgspec.field(default_factory=dict)
    # VS Code's mcp.json spells it "servers".
    servers: dict[str, ServerSettings] = msgspec.field(default_factory=dict)
    daemon: DaemonOptions | None = None


class LoadedFile(msgspec.Struct, kw_only=True):
    path: str
    status: str  # ok | missing | error
    servers: dict[str, ServerSettings] = msgspec.field(default_factory=dict)
    daemon: DaemonOptions | None = None
    error: str | None = None
    loaded_at: float | None = None
    generation: int = 0
    # (mtime_ns, size, inode) of what was read: lets an attach see a write the watcher has
    # not delivered yet.
    signature: tuple[int, int, int] | None = None


def file_signature(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
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
        if m:
            line, col = _line_col(data, int(m.group("byte")))
        raise SettingsError(
            f"not valid JSON: {_BYTE_RE.sub('', text).strip()}", path=path, line=line, column=col
        ) from exc
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
            transport_kind(name, settings, path)
            servers[name] = settings
    daemon = None
    if raw.get("daemon") is not None:
        try:
            daemon = msgspec.convert(raw["daemon"], DaemonOptions)
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
    """Read `path`. On failure the previous good servers stay in force (status says error)."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read()
    except FileNotFoundError:
        return LoadedFile(path=path, status="missing", loaded_at=now)
    except OSError as exc:
        return _failed(path, f"cannot read {path}: {exc.strerror}", previous, now)
    if not data.strip():
        return LoadedFile(
            path=path, status="ok", loaded_at=now, signature=(st.st_mtime_ns, st.st_size, st.st_ino)
        )
    signature = (st.st_mtime_ns, st.st_size, st.st_ino)
    try:
        doc = parse_settings(data, path)
    except SettingsError as exc:
        failed = _failed(path, exc.message + ": " + exc.reason, previous, now)
        failed.signature = signature
        return failed
    return LoadedFile(
        path=path,
        status="ok",
        servers=doc.mcp_servers,
        daemon=doc.daemon,
        loaded_at=now,
        signature=signature,
    )


def _failed(path: str, error: str, previous: LoadedFile | None, now: float) -> LoadedFile:
    return LoadedFile(
        path=path,
        status="error",
        servers=previous.servers if previous else {},
        daemon=previous.daemon if previous else None,
        error=error,
        loaded_at=now,
    )


def settings_base_dir(path: str, config_path: str) -> str:
    """The folder a settings file's relative paths (and cwd-less stdio servers) refer to."""
    if os.path.abspath(path) == os.path.abspath(config_path):
        return os.path.expanduser("~")
    return os.path.dirname(os.path.abspath(path))
