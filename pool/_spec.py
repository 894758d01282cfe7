"""Server settings, transport identities and fingerprints (DESIGN I1-I3).

A `ServerSettings` is one `mcpServers` entry as the user wrote it. The *transport identity* is the
canonical form of the fields that decide which process (or remote endpoint) serves it; policy
fields (trust, includeTools, excludeTools, alwaysLoadTools) and cosmetic ones (description,
disabled) and the start policy (`start`) are deliberately not part of it, so sessions with
different policies share one upstream. Identities are built once and captured by whoever holds
them (I2): they are frozen tuples, never views onto the caller's mutable settings object.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
import weakref
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from mcpool.protocol import SettingsError, WeakTable

from ._oauth_settings import OAuthSettings, oauth_identity

TransportKind = Literal["stdio", "http", "sse"]
Scope = Literal["shared", "workspace", "session"]
# When the process runs (L6): a policy, never part of the transport identity (I1).
StartPolicy = Literal["eager", "lazy", "always"]
# The revisions a server may be pinned to (`protocolVersion`): mcpool speaks each.
PinnedVersion = Literal["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28"]
# What a changed tool or prompt definition does (issue 30; session/_pins.py): served with a
# warning, held until `daemonctl approve`, or not pinned at all.
PinningMode = Literal["warn", "hold", "off"]

FINGERPRINT_CHARS = 12  # 48 bits: ample for the handful of entries one user's pool holds


class ServerSettings(
    msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True, weakref=True
):
    """One `mcpServers` entry. Unknown fields (other clients' extensions) are ignored."""

    type: Literal["stdio", "http", "sse", "streamable-http", "streamableHttp"] | None = None
    command: str | None = None
    args: list[str] = msgspec.field(default_factory=list)
    env: dict[str, str] = msgspec.field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    http_url: str | None = None
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    # Milliseconds, as in gemini-cli; bounds spawn + discovery and each upstream request.
    timeout: float | None = None
    trust: bool | UnsetType = UNSET
    include_tools: list[str] | UnsetType = UNSET
    exclude_tools: list[str] | UnsetType = UNSET
    always_load_tools: bool | UnsetType = UNSET
    description: str | None = None
    disabled: bool = False
    scope: Scope = "shared"
    prefix: bool = True
    roots: list[str] = msgspec.field(default_factory=list)
    # OAuth for an HTTP/SSE server (issue 16): pre-registered client, scopes, callback port.
    oauth: OAuthSettings | None = None
    start: StartPolicy = "eager"
    # Pins the protocol revision mcpool speaks to the server (issue 29 item 1): a handshake-era
    # one skips the `server/discover` probe and asks `initialize` at it; 2026-07-28 requires it.
    protocol_version: PinnedVersion | None = None
    # Overrides the daemon's `pinning` for this server (None: the daemon's).
    pinning: PinningMode | None = None


class PoolTables:
    """The pool's interning tables (part of the daemon's `Interner`): captured settings and
    transport identities, each shared by every holder of an equal value while one holds it.
    Weak, and keyed by the encoded value rather than the object: an entry lives exactly as long
    as some holder does, so a daemon that has seen a thousand projects' settings keeps only the
    ones still attached."""

    __slots__ = ("identities", "settings")

    def __init__(self) -> None:
        self.settings: WeakTable[bytes, ServerSettings] = WeakTable()
        self.identities: WeakTable[bytes, TransportIdentity] = WeakTable()

    def statistics(self) -> dict[str, dict[str, int]]:
        return {"settings": self.settings.statistics(), "identities": self.identities.statistics()}


# For a pool or a settings read made alone (tests, tools): the daemon hands its own.
UNSHARED_TABLES = PoolTables()


def capture_settings(s: ServerSettings, tables: PoolTables = UNSHARED_TABLES) -> ServerSettings:
    """A deep copy for a holder to keep (I2): `structs.replace` alone would share the caller's
    `args`, `env`, `headers`, `roots` and filter lists, so mutating them in place would reach
    into a pool entry or handle. Equal settings share one captured copy (holders never mutate
    it), so a thousand sessions with one settings file hold one copy per server."""
    key = _capture_encoder.encode(s)
    found = tables.settings.get(key)
    if found is None:
        found = tables.settings.put(key, copy.deepcopy(s))
    return found


def intern_identity(
    identity: TransportIdentity, tables: PoolTables = UNSHARED_TABLES
) -> TransportIdentity:
    """One object per distinct identity, however many sessions hold it (memory, not meaning:
    identities compare by value either way)."""
    return tables.identities.intern(_capture_encoder.encode(identity), identity)


_capture_encoder = msgspec.json.Encoder(order="deterministic")


# Each identity's fingerprint, while the identity lives (equal identities share one).
_fingerprints: weakref.WeakKeyDictionary[TransportIdentity, str] = weakref.WeakKeyDictionary()


def transport_kind(name: str, s: ServerSettings, source: str | None = None) -> TransportKind:
    """Which transport an entry uses: `type` when present, else command / httpUrl / url."""
    if s.type is not None:
        if s.type == "stdio":
            if not s.command:
                raise SettingsError(
                    "type stdio needs a command", path=source, server=name, field="command"
                )
            return "stdio"
        kind: TransportKind = "sse" if s.type == "sse" else "http"
        if not (s.url or s.http_url):
            raise SettingsError(f"type {s.type} needs a url", path=source, server=name, field="url")
        return kind
    if s.command:
        return "stdio"
    if s.http_url:
        return "http"
    if s.url:
        return "sse"
    raise SettingsError(
        "the server has neither command nor url", path=source, server=name, field="command"
    )


class TransportIdentity(msgspec.Struct, frozen=True, order=True, weakref=True):
    """The canonical transport-defining fields of one server entry (I1). Hashable, immutable."""

    name: str
    kind: str
    command: str | None
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    cwd: str | None
    url: str | None
    headers: tuple[tuple[str, str], ...]
    timeout: float | None
    scope: str
    # Workspace-scoped entries are shared only between sessions with the same roots.
    roots: tuple[str, ...]
    # Only with pooling switched off: the policy key joins the identity (issue: pool=false).
    policy: str | None = None
    # The canonical OAuth settings: entries that differ in them hold different logins.
    oauth: str | None = None
    # The revision pinned by the `protocolVersion` setting: another connection than the unpinned.
    protocol_version: str | None = None
    # The handshake revision of the sessions a server that speaks both eras serves this
    # connection to (issue 29 item 1; `Pool.in_era`): unlike the setting, one the server refuses
    # is no failure of the server's, its sessions go back to the unpinned connection.
    era_pin: str | None = None

    @property
    def unpinned(self) -> TransportIdentity:
        """The identity without its era pin (itself when it has none)."""
        if self.era_pin is None:
            return self
        return msgspec.structs.replace(self, era_pin=None)

    @property
    def fingerprint(self) -> str:
        # Asked on every relist (the snapshot store's key): hashed once per identity.
        found = _fingerprints.get(self)
        if found is None:
            digest = hashlib.sha256(_identity_encoder.encode(self)).hexdigest()
            found = _fingerprints[self] = digest[:FINGERPRINT_CHARS]
        return found

    def describe(self) -> dict[str, Any]:
        """A display form that never shows env or header values (X2)."""
        return {
            "transport": self.kind,
            "command": self.command,
            "args": list(self.args),
            "env": sorted(printable(k) for k, _ in self.env),
            "cwd": self.cwd,
            "url": redact_url(self.url) if self.url else None,
            "headers": sorted(printable(k) for k, _ in self.headers),
            "scope": self.scope,
        }

    @property
    def secrets(self) -> tuple[str, ...]:
        """The values never to print: the entry's env and header values."""
        return tuple(v for _, v in self.env) + tuple(v for _, v in self.headers)

    def redact(self, text: str) -> str:
        """`text` (an error, a log line) with this identity's env and header values hidden."""
        return redact_values(text, self.secrets)


_identity_encoder = msgspec.json.Encoder()


def identity_of(
    name: str,
    s: ServerSettings,
    *,
    base_dir: str | None = None,
    session_roots: tuple[str, ...] = (),
    policy: str | None = None,
    tables: PoolTables = UNSHARED_TABLES,
) -> TransportIdentity:
    """Capture the transport identity of `s` (interned in `tables`).

    `base_dir` is the folder the entry's relative paths mean something in: its settings file's
    folder. A stdio server with no `cwd` runs there, as the clients that read `.mcp.json` run it
    in the project, so two projects' `npx some-server .` are two identities, not one.
    """
    kind = transport_kind(name, s)
    cwd: str | None = None
    command = s.command
    if kind == "stdio":
        cwd = s.cwd
        if cwd is not None and base_dir is not None and not os.path.isabs(cwd):
            cwd = os.path.normpath(os.path.join(base_dir, cwd))
        if cwd is None:
            cwd = base_dir
    url = s.http_url if kind == "http" and s.http_url else s.url if s.url else s.http_url
    return intern_identity(
        TransportIdentity(
            name=name,
            kind=kind,
            command=command,
            args=tuple(s.args),
            env=tuple(sorted(s.env.items())),
            cwd=cwd,
            url=url if kind != "stdio" else None,
            headers=tuple(sorted((k.lower(), v) for k, v in s.headers.items())),
            timeout=s.timeout,
            scope=s.scope,
            roots=tuple(sorted(session_roots)) if s.scope == "workspace" else (),
            policy=policy,
            oauth=oauth_identity(s.oauth) if kind != "stdio" else None,
            protocol_version=s.protocol_version,
        ),
        tables,
    )


def redact_url(url: str) -> str:
    """The URL to show: no credentials, no query string, no fragment, control characters
    escaped. Total: a URL no parser accepts (port 99999, a broken IPv6 literal) is still shown,
    cut by hand at the same places, never raised on (a display must not fail on a typo)."""
    from urllib.parse import urlsplit, urlunsplit

    # Escaped first: urlsplit silently drops newlines and tabs, and the display should show
    # what was written.
    url = printable(url)
    try:
        parts = urlsplit(url)
        shown = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))
    except ValueError:
        scheme, sep, rest = url.partition("://")
        if not sep:
            scheme, rest = "", url
        rest = rest.split("?", 1)[0].split("#", 1)[0]
        authority, slash, path = rest.partition("/")
        authority = authority.rpartition("@")[2]
        shown = f"{scheme}{sep}{authority}{slash}{path}"
    return shown


def printable(text: str) -> str:
    """`text` on one line: control characters (newlines included) shown escaped."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


REDACTED = "<redacted>"
# Shorter values are not secrets (flags, levels, "1") and hiding them would garble every line
# that happens to contain them.
MIN_REDACTED_CHARS = 4


def redact_values(text: str, secrets: tuple[str, ...]) -> str:
    """`text` with every secret value hidden, in the forms an error message quotes it: as is,
    stripped, and as a Python repr of its str or bytes (h11 says `Illegal header value
    b'Bearer x\\n'`)."""
    for secret in secrets:
        for form in _quoted_forms(secret):
            if len(form) >= MIN_REDACTED_CHARS and form in text:
                text = text.replace(form, REDACTED)
    return text


def _quoted_forms(secret: str) -> list[str]:
    forms = {secret, secret.strip(), repr(secret)[1:-1]}
    with contextlib.suppress(UnicodeEncodeError):
        forms.add(repr(secret.encode())[2:-1])
        forms.add(repr(secret.strip().encode())[2:-1])
    return sorted(forms, key=len, reverse=True)
