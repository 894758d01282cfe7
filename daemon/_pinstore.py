"""The pin book on disk: `$XDG_STATE_HOME/mcpool/pins.json`, 0600, replaced atomically.

One document for every settings file's servers (session/_pins.py has what a pin is). It is
typed at the boundary: a file another version wrote, or one that was edited by hand, is read as
far as it is valid; what is not is named in the error and the daemon starts from an empty book
for that server rather than trusting it. Versioned so that a later daemon can read it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec

from mcpool.session._pins import Added, Change, Pin, ServerPins

from ._files import read_bounded, write_private

VERSION = 1
MAX_FILE_BYTES = 64 * 1024 * 1024


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
    source: str  # the settings file
    server: str
    pins: list[_PinDoc]
    changes: list[_ChangeDoc] = []
    added: list[_AddedDoc] = []


class _BookDoc(msgspec.Struct):
    version: int
    servers: list[_ServerDoc]


BookKey = tuple[str, str]  # (settings file, server name)


def _pin_doc(kind: str, name: str, pin: Pin) -> _PinDoc:
    return _PinDoc(kind, name, pin.digest, pin.definition, pin.since)


def save(path: Path, book: dict[BookKey, ServerPins]) -> None:
    write_private(path, encode(book))


def encode(book: dict[BookKey, ServerPins]) -> bytes:
    """The file's bytes for `book` (taken in the daemon's loop; written in a thread)."""
    doc = _BookDoc(
        VERSION,
        [
            _ServerDoc(
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
            for (source, server), pins in sorted(book.items())
        ],
    )
    return msgspec.json.encode(doc)


class PinFileError(Exception):
    pass


def load(path: Path) -> dict[BookKey, ServerPins]:
    """The book in `path` (empty when there is none); PinFileError names the file and why."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise PinFileError(f"{path}: {exc.strerror}") from None
    try:
        data = read_bounded(fd, MAX_FILE_BYTES)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise PinFileError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
    try:
        doc = msgspec.json.decode(data, type=_BookDoc)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise PinFileError(f"{path}: {exc}") from None
    if doc.version != VERSION:
        raise PinFileError(f"{path}: version {doc.version}, this mcpool reads {VERSION}")
    book: dict[BookKey, ServerPins] = {}
    for server in doc.servers:
        pins = ServerPins()
        for p in server.pins:
            pins.pins[(p.kind, p.name)] = Pin(p.digest, p.definition, p.since)
        for c in server.changes:
            pinned = Pin(c.pinned.digest, c.pinned.definition, c.pinned.since)
            pins.changes.append(
                Change(c.kind, c.name, pinned, c.current, c.current_digest, c.seen, c.pending)
            )
        pins.added = [Added(a.kind, a.name, a.seen) for a in server.added]
        book[(server.source, server.server)] = pins
    return book
