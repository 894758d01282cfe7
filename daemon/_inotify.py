"""Folder watching on Linux inotify, woken only by events (issue 17: an idle daemon sleeps).

Theory of operation: watchfiles' Rust loop wakes every `step` ms (to check signals and its stop
event) even when nothing changes: 50 wake-ups a second at the 20 ms step a fast reload needs.
Here the inotify fd is registered with trio's I/O manager and read only when the kernel has
events, so an idle daemon does not wake at all, and a change is read the moment it happens (the
`ChangeBatcher` in daemon/_watch.py coalesces bursts). Non-recursive, as the watcher's plans are.

Paths are reported as watchfiles reports them: `folder/name` for an entry of a watched folder,
the folder itself when the folder is deleted or moved (its watch dies with it). An overflowed
event queue reports every folder (each then counts as changed). `Inotify.open` raises OSError
when inotify is unavailable (not Linux, or the watch limit reached); the caller falls back.
Folders opened `entries_only` report only entries appearing and going (the watcher watches a
watched folder's parent that way, to see the folder itself deleted or moved), and one that may
not be read is left out rather than failing the watch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
import sys
from collections.abc import Iterable

import trio

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

WATCH_MASK = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
)
# A parent watched for its entries coming and going: no wake-up for writes to its other files.
ENTRY_MASK = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ONLYDIR
_SELF_GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)
# One read takes whatever the kernel has queued up to this many bytes (events are 16 bytes plus
# a padded name; the kernel's default queue holds 16,384 events).
READ_SIZE = 64 * 1024

_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        if not sys.platform.startswith("linux"):
            raise OSError(errno.ENOSYS, "inotify is Linux only")
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    return _libc


def parse_events(data: bytes, folders: dict[int, str]) -> set[str]:
    """The paths a buffer of inotify events concerns (pure: tested without the kernel)."""
    paths: set[str] = set()
    offset = 0
    while offset + _HEADER.size <= len(data):
        wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
        offset += _HEADER.size
        raw_name = data[offset : offset + length].split(b"\0", 1)[0]
        offset += length
        if mask & IN_Q_OVERFLOW:
            paths.update(folders.values())
            continue
        folder = folders.get(wd)
        if folder is None:
            continue
        if raw_name and not mask & _SELF_GONE:
            paths.add(os.path.join(folder, os.fsdecode(raw_name)))
        else:
            paths.add(folder)
    return paths


class Inotify:
    """One inotify instance over a fixed set of folders (a new plan opens a new one)."""

    def __init__(self, fd: int, folders: dict[int, str]) -> None:
        self.fd = fd
        self.folders = folders

    @classmethod
    def open(cls, folders: Iterable[str], entries_only: Iterable[str] = ()) -> Inotify:
        lib = _lib()
        fd = lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"inotify_init1: {os.strerror(code)}")
        watched: dict[int, str] = {}
        try:
            # The full watches last: a folder in both sets (one inode, one watch) keeps WATCH_MASK.
            plan = [(folder, ENTRY_MASK) for folder in entries_only]
            plan += [(folder, WATCH_MASK) for folder in folders]
            for folder, mask in plan:
                wd = lib.inotify_add_watch(fd, os.fsencode(folder), mask)
                if wd < 0:
                    code = ctypes.get_errno()
                    if mask == ENTRY_MASK and code in (errno.EACCES, errno.EPERM):
                        continue  # a parent we may not read: its folder is still watched
                    raise OSError(code, f"inotify_add_watch: {os.strerror(code)}", folder)
                watched[wd] = folder
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, watched)

    async def read(self) -> set[str]:
        """The paths of the next events (waits, without waking, until there are some)."""
        while True:
            try:
                data = os.read(self.fd, READ_SIZE)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.fd)
                continue
            paths = parse_events(data, self.folders)
            if paths:
                return paths

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            trio.lowlevel.notify_closing(fd)
            os.close(fd)
