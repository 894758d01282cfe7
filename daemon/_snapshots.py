"""The daemon's snapshot store: one file per transport fingerprint in the XDG cache folder.

A file is named by a hash of the fingerprint (the fingerprint itself is inside and checked on
load) and holds the `StoredSnapshot` record as JSON, mode 0600 (tool descriptions can quote a
server's configuration). It is a cache: a file that is missing, unreadable, corrupt, of another
format or for another fingerprint is ignored (a log line for all but a missing one), never
fatal. The folder is bounded in total size: after each write the oldest files go first.

Writes run in the store's own writer thread, in the order they were asked for, so a slow disk
never holds up the event loop, and the loop never waits for one either: a save is handed on and
forgotten (a `trio.to_thread` round trip per relist was about 230 K instructions, more than the
write's own Python). Saves of one fingerprint still waiting are one write, of the newest record;
`forget` goes the same way, so it is never undone by an earlier save written after it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import trio

from mcpool.pool import SNAPSHOT_FORMAT, EncodedList, StoredSnapshot

from ._files import read_bounded, write_private

# The whole folder's bound: dozens of servers' lists fit; past it the oldest records go.
MAX_SNAPSHOTS_BYTES = 8 * 1024 * 1024
# One server's record larger than this is not kept (and one on disk is not read): a list that
# big is a broken server's, and reading it would stall the loop.
MAX_SNAPSHOT_FILE_BYTES = 2 * 1024 * 1024
SUFFIX = ".json"
# A server not up within a first list's wait, never seen up since: an empty file of this suffix
# beside where its record would be (they are few and tiny: not counted in the folder's bound).
SLOW_SUFFIX = ".slow"

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(StoredSnapshot)


# Where an encoded list goes in the record's encoding: a raw NUL byte, which msgspec's JSON
# never holds (a string's control characters are escaped).
_SLOT = msgspec.Raw(b"\x00")


def encode_record(
    record: StoredSnapshot, encoded: Mapping[str, EncodedList] | None
) -> list[bytes | memoryview]:
    """The record's JSON as pieces, `encoded`'s lists in them as they are (views of the pages'
    bytes): joined, they are the record encoded with those lists. A 5,000-tool list copied into
    one buffer, then again into the record's, was 0.5 ms of loop time per list_changed."""
    if not encoded:
        return [_encoder.encode(record)]
    # The fields in the order the record encodes them.
    fields = [f for f in record.__struct_fields__ if f in encoded]
    slotted = msgspec.structs.replace(record, **dict.fromkeys(fields, _SLOT))
    head, *rest = _encoder.encode(slotted).split(b"\x00")
    pieces: list[bytes | memoryview] = [head]
    for field, tail in zip(fields, rest, strict=True):
        pieces.extend(encoded[field])
        pieces.append(tail)
    return pieces


@functools.lru_cache(maxsize=256)  # asked on every save of a relisted server
def snapshot_file_name(fingerprint: str) -> str:
    return hashlib.sha256(fingerprint.encode()).hexdigest()[:32] + SUFFIX


def eviction(files: list[tuple[str, float, int]], *, limit: int, keep: str) -> list[str]:
    """Which files (name, mtime, size) to delete so the total fits `limit`: oldest first,
    never `keep` (the one just written)."""
    total = sum(size for _, _, size in files)
    doomed = []
    for name, _, size in sorted(files, key=lambda f: f[1]):
        if total <= limit:
            break
        if name == keep:
            continue
        doomed.append(name)
        total -= size
    return doomed


# What the writer thread does for a fingerprint: write these pieces, or (None) remove the file.
_Work = Sequence[bytes | memoryview] | None


class FileSnapshotStore:
    def __init__(
        self,
        folder: Path,
        log: Callable[..., None],
        *,
        max_bytes: int = MAX_SNAPSHOTS_BYTES,
    ) -> None:
        self.folder = folder
        self.log = log
        self.max_bytes = max_bytes
        # file -> its newest work not yet done; the queue holds each file once (or the event
        # of a `settled` call), in order.
        self._work: dict[Path, _Work] = {}
        self._work_lock = threading.Lock()
        self._queue: queue.SimpleQueue[Path | threading.Event] = queue.SimpleQueue()
        self._slow: set[str] | None = None  # read once, on the first question
        self._writer: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None

    def path_for(self, fingerprint: str) -> Path:
        return self.folder / snapshot_file_name(fingerprint)

    def load(self, fingerprint: str) -> StoredSnapshot | None:
        path = self.path_for(fingerprint)
        try:
            with open(path, "rb", buffering=0) as f:
                data = read_bounded(f.fileno(), MAX_SNAPSHOT_FILE_BYTES)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return self._ignored(path, f"unreadable: {exc.strerror or exc}")
        if len(data) > MAX_SNAPSHOT_FILE_BYTES:
            return self._ignored(path, f"larger than {MAX_SNAPSHOT_FILE_BYTES} bytes")
        try:
            record = _decoder.decode(data)
        except msgspec.MsgspecError as exc:  # not JSON, or not a record's shape
            return self._ignored(path, f"corrupt: {exc}")
        except RecursionError:
            # Nested deeper than the decoder goes (the interpreter's recursion limit).
            return self._ignored(path, "corrupt: nested too deeply")
        if record.format != SNAPSHOT_FORMAT:
            return self._ignored(path, f"format {record.format}, not {SNAPSHOT_FORMAT}")
        if record.fingerprint != fingerprint:
            return self._ignored(path, "it is another server's")
        return record

    def _ignored(self, path: Path, why: str) -> StoredSnapshot | None:
        self.log("warning", f"snapshot cache file {path} ignored: {why}", file=str(path))
        return None

    def save(
        self, record: StoredSnapshot, encoded: Mapping[str, EncodedList] | None = None
    ) -> None:
        # `encoded` lists are the upstream's bytes of the same items: written as they are.
        data = encode_record(record, encoded)
        size = sum(len(part) for part in data)
        if size > MAX_SNAPSHOT_FILE_BYTES:
            self.log(
                "info",
                f"snapshot of {record.server_name or 'a server'} not kept: {size} bytes",
            )
            return
        self._hand_on(self.path_for(record.fingerprint), data)

    async def settled(self) -> None:
        """Once every save and forget asked for before this call is done (shutdown, tests)."""
        if self._writer is None:
            return
        done = threading.Event()
        self._queue.put(done)
        await trio.to_thread.run_sync(done.wait, abandon_on_cancel=True)

    def forget(self, fingerprint: str) -> None:
        self._hand_on(self.path_for(fingerprint), None)

    def slow(self, fingerprint: str) -> bool:
        if self._slow is None:
            self._slow = set()
            with contextlib.suppress(OSError), os.scandir(self.folder) as it:
                self._slow = {e.name for e in it if e.name.endswith(SLOW_SUFFIX)}
        return self._slow_name(fingerprint) in self._slow

    def mark_slow(self, fingerprint: str, slow: bool) -> None:
        if slow == self.slow(fingerprint):
            return
        name = self._slow_name(fingerprint)
        assert self._slow is not None
        if slow:
            self._slow.add(name)
        else:
            self._slow.discard(name)
        self._hand_on(self.folder / name, [b""] if slow else None)

    def _slow_name(self, fingerprint: str) -> str:
        return snapshot_file_name(fingerprint).removesuffix(SUFFIX) + SLOW_SUFFIX

    def _hand_on(self, path: Path, work: _Work) -> None:
        if self._writer is None:
            with contextlib.suppress(RuntimeError):  # (outside a trio run: warnings logged there)
                self._token = trio.lowlevel.current_trio_token()
            # A daemon thread: an exit never waits for it (shutdown waits, bounded: `settled`).
            self._writer = threading.Thread(
                target=self._write_handed_on, name="mcpool snapshot writer", daemon=True
            )
            self._writer.start()
        with self._work_lock:
            queued = path in self._work
            self._work[path] = work
        if not queued:
            self._queue.put(path)

    def _write_handed_on(self) -> None:
        """The writer thread: each file's newest work, in the order first asked for."""
        while True:
            item = self._queue.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            with self._work_lock:
                work = self._work.pop(item)
            path = item
            if work is None:
                with contextlib.suppress(OSError):  # (gone already, or never a file: forgotten)
                    os.unlink(path)
                continue
            try:
                self._write(path, work)
            except Exception as exc:  # (a cache: never fatal, always said)
                self._tell(f"snapshot cache file {path} not written: {exc}", str(path))

    def _tell(self, message: str, file: str) -> None:
        """A warning logged from the loop's thread (the log is the loop's)."""
        say = functools.partial(self.log, "warning", message, file=file)
        if self._token is None:
            say()
            return
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(say)

    def _write(self, path: Path, data: Sequence[bytes | memoryview]) -> None:
        write_private(path, data)
        files: list[tuple[str, float, int]] = []
        with os.scandir(self.folder) as it:
            for item in it:
                if not item.name.endswith(SUFFIX):
                    continue
                with contextlib.suppress(OSError):
                    st = item.stat(follow_symlinks=False)
                    files.append((item.name, st.st_mtime, st.st_size))
        for name in eviction(files, limit=self.max_bytes, keep=path.name):
            with contextlib.suppress(OSError):
                os.unlink(self.folder / name)


def describe_snapshot(snapshot: Any) -> str:
    """What `daemonctl servers` shows: the entry's lists are the live discovery, the stored
    one (the process is still starting), or none yet."""
    if not snapshot.available:
        return "none"
    return "cached" if snapshot.cached else "live"
