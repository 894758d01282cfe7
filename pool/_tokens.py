"""The OAuth token store: one record per user and server, never logged or shown (X2).

A record is what one OAuth client needs to keep between daemon runs: the token response (access
and refresh token, scope), when the access token expires (wall-clock seconds: the server's
`expires_in` is relative to the moment it answered), and the client registration (RFC 7591) or
the client ID it used. Records are keyed by `token_key`: a digest of the server URL and the
entry's OAuth settings, so every session whose entry has the same URL and OAuth settings shares
one login, whatever its other transport fields (headers, timeout) are.

Where: the OS keyring through the `keyring` package when it is installed and has a usable
backend (a Secret Service, macOS Keychain, Windows Credential Locker); otherwise one file per
record, mode 0600 in a 0700 folder under the XDG state folder, replaced atomically (write to a
temporary file in the same folder, fsync, rename), so a crash never leaves half a record.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol

import msgspec

KEYRING_SERVICE = "mcpool-oauth"
KEY_CHARS = 32  # 128 bits of sha256: distinct servers never share a record
FILE_MODE = 0o600
DIR_MODE = 0o700


class TokenRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One server's stored OAuth state. `tokens` and `client` are the SDK's JSON shapes."""

    tokens: dict[str, Any] | None = None
    expires_at: float | None = None  # wall clock; None when the server gave no expiry
    client: dict[str, Any] | None = None


_record_decoder = msgspec.json.Decoder(TokenRecord)
_encoder = msgspec.json.Encoder(order="deterministic")


def token_key(url: str, oauth: str | None) -> str:
    """The record key of a server: its URL and its canonical OAuth settings, digested (the
    key names a file and a keyring entry; the settings may hold a client secret)."""
    digest = hashlib.sha256(_encoder.encode([url, oauth]))
    return digest.hexdigest()[:KEY_CHARS]


class Backend(Protocol):
    name: str

    def load(self, key: str) -> bytes | None: ...

    def save(self, key: str, data: bytes) -> None: ...

    def delete(self, key: str) -> None: ...


class FileBackend:
    """0600 files under `folder` (the daemon passes `<XDG state>/mcpool/oauth`)."""

    name = "file"

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def load(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def save(self, key: str, data: bytes) -> None:
        self.folder.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        # mkdir's mode is masked by the umask and not applied to an existing folder.
        os.chmod(self.folder, DIR_MODE)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{key}.", suffix=".tmp")
        try:
            # mkstemp creates the file 0600 already; say so rather than rely on it.
            os.fchmod(fd, FILE_MODE)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path(key))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()


class KeyringBackend:
    """The OS keyring (one password entry per record, under KEYRING_SERVICE)."""

    name = "keyring"

    def __init__(self, keyring: Any) -> None:
        self._keyring = keyring

    def load(self, key: str) -> bytes | None:
        value = self._keyring.get_password(KEYRING_SERVICE, key)
        return value.encode() if isinstance(value, str) else None

    def save(self, key: str, data: bytes) -> None:
        self._keyring.set_password(KEYRING_SERVICE, key, data.decode())

    def delete(self, key: str) -> None:
        with contextlib.suppress(Exception):  # keyring.errors.PasswordDeleteError: not there
            self._keyring.delete_password(KEYRING_SERVICE, key)


def usable_keyring() -> Any | None:
    """The `keyring` module when it is installed and its backend can store secrets, else None.
    (Without a desktop session keyring falls back to its `fail` or `null` backend, whose
    priority is not above 0, or to a plaintext file backend, which is no better than ours.)"""
    try:
        import keyring
        from keyring.backends import fail
    except ImportError:
        return None
    try:
        backend = keyring.get_keyring()
    except Exception:  # a broken keyring configuration must not stop the daemon
        return None
    if isinstance(backend, fail.Keyring) or getattr(backend, "priority", 0) <= 0:
        return None
    module = type(backend).__module__
    if module.startswith(("keyrings.alt", "keyring.backends.null")):
        return None
    return keyring


class TokenStore:
    """Records by key, through one backend chosen when the store is made."""

    def __init__(self, folder: Path, *, backend: Backend | None = None) -> None:
        if backend is None:
            kr = usable_keyring()
            backend = KeyringBackend(kr) if kr is not None else FileBackend(folder)
        self.backend = backend

    def load(self, key: str) -> TokenRecord:
        data = self.backend.load(key)
        if not data:
            return TokenRecord()
        try:
            return _record_decoder.decode(data)
        except msgspec.DecodeError:
            # A damaged record is a logged-out server, not a daemon that cannot start it.
            return TokenRecord()

    def save(self, key: str, record: TokenRecord) -> None:
        self.backend.save(key, _encoder.encode(record))

    def delete(self, key: str) -> None:
        self.backend.delete(key)


__all__ = ["FileBackend", "KeyringBackend", "TokenRecord", "TokenStore", "token_key"]
