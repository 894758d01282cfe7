"""Pins on disk: one file per settings file and server, `$XDG_STATE_HOME/mcpool/pins/`, each 0600
and replaced atomically.

A file per server (named by a digest of its settings file and name) rather than one document:
a change rewrites only that server's pins, and the daemon keeps in memory only the servers it
serves now (daemon/_pinkeeper.py), reading the others' when they are served again. Each file is
typed at the boundary: one another version wrote, or one edited by hand, is named in the error
and set aside, and that server is pinned again from its next discovery rather than trusted.
Versioned so that a later daemon can read it (session/_pins.py has what a pin is).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

import msgspec

from mcpool.session._pins import Added, Change, Pin, ServerPins

from ._files import read_bounded, write_private

VERSION = 1
# One server's pins: its tools' and prompts' definitions, and its recent changes.
MAX_FILE_BYTES = 16 * 1024 * 1024
SUFFIX = ".json"

BookKey = tuple[str, str]  # (settings file, server name)


class _PinDoc(msgspec.Struct):
    kind: str
    name: str
    digest: str
    definition: dict[str, Any]
    since: float


class _ChangeDoc(msgspec.Struct):
    kind: str
    name: str
    pinned: _PinDoc
    current: dict[str, Any]
    current_digest: str
    seen: float
    pending: bool


class _AddedDoc(msgspec.Struct):
    kind: str
    name: str
    seen: float


class _ServerDoc(msgspec.Struct):
    version: int
    source: str  # the settings file
    server: str
    pins: list[_PinDoc]
    changes: list[_ChangeDoc] = []
    added: list[_AddedDoc] = []


class PinFileError(Exception):
    pass


def file_name(key: BookKey) -> str:
    source, server = key
    digest = hashlib.sha256(f"{source}\0{server}".encode()).hexdigest()[:24]
    return digest + SUFFIX


def _pin_doc(kind: str, name: str, pin: Pin) -> _PinDoc:
    return _PinDoc(kind, name, pin.digest, pin.definition, pin.since)


def encode_server(key: BookKey, pins: ServerPins) -> bytes:
    """One server's file (taken in the daemon's loop; written in a thread)."""
    source, server = key
    return msgspec.json.encode(
        _ServerDoc(
            VERSION,
            source,
            server,
            [_pin_doc(k, n, p) for (k, n), p in sorted(pins.pins.items())],
            [
                _ChangeDoc(
                    c.kind,
                    c.name,
                    _pin_doc(c.kind, c.name, c.pinned),
                    c.current,
                    c.current_digest,
                    c.seen,
                    c.pending,
                )
                for c in pins.changes
            ],
            [_AddedDoc(a.kind, a.name, a.seen) for a in pins.added],
        )
    )


def write_server(folder: Path, key: BookKey, data: bytes) -> None:
    write_private(folder / file_name(key), data)


def remove_server(folder: Path, key: BookKey) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(folder / file_name(key))


def _pins_of(doc: _ServerDoc) -> ServerPins:
    pins = ServerPins()
    for p in doc.pins:
        pins.pins[(p.kind, p.name)] = Pin(p.digest, p.definition, p.since)
    for c in doc.changes:
        pinned = Pin(c.pinned.digest, c.pinned.definition, c.pinned.since)
        pins.changes.append(
            Change(c.kind, c.name, pinned, c.current, c.current_digest, c.seen, c.pending)
        )
    pins.added = [Added(a.kind, a.name, a.seen) for a in doc.added]
    return pins


_decoder = msgspec.json.Decoder(_ServerDoc)


def decode_server(data: bytes) -> ServerPins:
    """Bytes `encode_server` made, as the pins they hold."""
    return _pins_of(_decoder.decode(data))


def _read(path: Path) -> _ServerDoc:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        raise PinFileError(f"{path}: {exc.strerror}") from None
    try:
        data = read_bounded(fd, MAX_FILE_BYTES)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise PinFileError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
    try:
        doc = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise PinFileError(f"{path}: {exc}") from None
    except RecursionError:
        raise PinFileError(f"{path}: nested too deeply") from None
    if doc.version != VERSION:
        raise PinFileError(f"{path}: version {doc.version}, this mcpool reads {VERSION}")
    if path.name != file_name((doc.source, doc.server)):
        raise PinFileError(f"{path}: it holds another server's pins")
    return doc


def still_bad(path: Path) -> bool:
    """Whether `path` is still a file that is not valid pins (it may have been rewritten)."""
    try:
        _read(path)
    except PinFileError:
        return path.exists()
    return False


def read_server(folder: Path, key: BookKey) -> ServerPins | None:
    """`key`'s pins (None when it has no file); PinFileError names the file and why."""
    path = folder / file_name(key)
    if not path.exists():
        return None
    return _pins_of(_read(path))


def save(folder: Path, book: dict[BookKey, ServerPins]) -> None:
    for key, pins in book.items():
        write_server(folder, key, encode_server(key, pins))


def load(folder: Path) -> dict[BookKey, ServerPins]:
    """Every server's pins in `folder` (a file that is not valid raises PinFileError)."""
    book: dict[BookKey, ServerPins] = {}
    for path in sorted(folder.glob("*" + SUFFIX)) if folder.is_dir() else []:
        doc = _read(path)
        book[(doc.source, doc.server)] = _pins_of(doc)
    return book


def index(folder: Path) -> tuple[list[tuple[BookKey, int, float]], list[tuple[Path, str]]]:
    """What `folder` holds, oldest first: (key, pending changes, mtime) per valid file; and the
    files that are not, each with why."""
    found: list[tuple[BookKey, int, float]] = []
    bad: list[tuple[Path, str]] = []
    if not folder.is_dir():
        return found, bad
    for path in folder.glob("*" + SUFFIX):
        try:
            doc = _read(path)
            mtime = path.stat().st_mtime
        except (PinFileError, OSError) as exc:
            bad.append((path, str(exc)))
            continue
        pending = sum(1 for c in doc.changes if c.pending)
        found.append(((doc.source, doc.server), pending, mtime))
    found.sort(key=lambda row: row[2])
    return found, bad
