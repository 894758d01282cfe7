"""Non-blocking file-descriptor I/O for the relay hot path.

Theory of operation: a relayed message costs two wake-ups at best (the reader that got it, and
nothing else), so writes never go through a task when they can complete at once. `FdWriter.write`
tries a direct non-blocking `os.write`; only what the kernel would not take is queued, and a
writer task drains the queue when the fd becomes writable. A message that may be lost (a log
message, a progress notification) goes through `write_lossy`, which drops it instead once the
queue holds more than a fraction of the limit (DESIGN X8): a flood is shed before the peer is
cut, and what must arrive (answers) still has the rest of the limit. Reads are `wait_readable`
followed by one `os.read`. Measured on this machine this halves the per-call cost of a
straightforward trio stream relay (276 us -> 119 us).

Works for pipes and for stream sockets alike (`os.write` on a socket fd is `send` with no flags;
the interpreter ignores SIGPIPE, so a closed peer shows up as EPIPE).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Awaitable, Callable, Sequence

import trio

# One read's buffer. os.read allocates this much before it shrinks the result to what arrived,
# and glibc serves allocations of 128 KiB and more with mmap/munmap: a 256 KiB chunk cost ~20 us
# per read here against ~1.3 us for 64 KiB, twice per relayed call (benchmarks: tools/bench/
# hotpath.py, latency.py). A pipe holds 64 KiB by default, so larger reads rarely gain anything.
READ_CHUNK = 64 * 1024


# The lossy bound as a fraction of a writer's limit (`FdWriter.lossy_buffer`): an 8 MiB session
# buffer sheds log and progress messages past 2 MiB queued.
LOSSY_FRACTION = 4


class WriterClosed(Exception):
    """The peer went away or the writer's buffer limit was exceeded."""


class FdWriter:
    """Writes to a non-blocking fd directly, queueing only what the kernel would not accept."""

    def __init__(
        self,
        fd: int,
        max_buffer: int,
        *,
        spawn: Callable[[Callable[[], Awaitable[None]]], None] | None = None,
        lossy_buffer: int | None = None,
    ) -> None:
        # With `spawn`, a drain task exists only while data is queued (most writes never queue,
        # and an idle session should not hold a task); without it, the owner runs `run()`.
        self._spawn = spawn
        self._draining = False
        self._fd = fd
        self._max_buffer = max_buffer
        # Past this much queued, a lossy message (`write_lossy`) is dropped: a log flood is
        # shed long before the answers behind it reach the limit that closes the writer.
        self.lossy_buffer = min(
            max_buffer, max_buffer // LOSSY_FRACTION if lossy_buffer is None else lossy_buffer
        )
        self._chunks: list[bytes] = []
        # Bytes queued, not yet written: an attribute, not a property (every session asks it
        # once per change of its lists, issue 17).
        self.buffered = 0
        self._wake = trio.Event()
        self._drained = trio.Event()
        self._drained.set()
        self.closed = False
        self.error: str | None = None
        # The reader went away (EPIPE, ECONNRESET): the peer ended things, not a failure here.
        self.peer_gone = False

    @property
    def fd(self) -> int:
        return self._fd

    def write(self, data: bytes) -> None:
        """Write now, or queue. Raises WriterClosed when the peer is gone or the buffer is full."""
        if self.closed:
            raise WriterClosed(self.error or "closed")
        if not self._chunks:
            try:
                n = os.write(self._fd, data)
            except BlockingIOError:
                n = 0
            except OSError as exc:
                raise self._write_failed(exc) from exc
            if n == len(data):
                return
            data = data[n:]
        self._queue(data)

    def write_lossy(self, data: bytes) -> bool:
        """`write` for a message that may be lost (log, progress): dropped (False) when more
        than `lossy_buffer` bytes would then be queued. Never raises: a writer that is closed
        or whose fd failed (the peer is gone, as `write` finds it) drops it too."""
        if self.closed:
            return False
        if self._chunks:
            if self.buffered + len(data) > self.lossy_buffer:
                return False
            self._queue(data)  # (within the lossy bound: below the limit, never raises)
            return True
        if len(data) > self.lossy_buffer:
            return False  # what the kernel would not take could not be queued
        try:
            n = os.write(self._fd, data)
        except BlockingIOError:
            n = 0
        except OSError as exc:
            self._write_failed(exc)
            return False
        if n < len(data):
            self._queue(data[n:])
        return True

    def write_parts(self, parts: Sequence[bytes]) -> None:
        """`write(b"".join(parts))` without the join: one `writev`, and a copy of only what
        the kernel would not take. For an answer made of a few bytes around a large cached
        body (a list page: 55 KB, served 11 times per full listing), whose join would copy
        the body twice per answer."""
        if self.closed:
            raise WriterClosed(self.error or "closed")
        n = 0
        if not self._chunks:
            try:
                n = os.writev(self._fd, parts)
            except BlockingIOError:
                pass
            except OSError as exc:
                raise self._write_failed(exc) from exc
        if n < sum(map(len, parts)):
            self._queue(b"".join(parts)[n:])

    def _queue(self, data: bytes) -> None:
        if self.buffered + len(data) > self._max_buffer:
            self._fail(f"outgoing buffer full ({self._max_buffer} bytes): the peer stopped reading")
            raise WriterClosed(self.error)
        self._chunks.append(data)
        self.buffered += len(data)
        self._drained = trio.Event() if self._drained.is_set() else self._drained
        self._wake.set()
        if self._spawn is not None and not self._draining:
            self._draining = True
            self._spawn(self._drain)

    def _write_failed(self, exc: OSError) -> WriterClosed:
        """The writer closed by a failed write, and the error its caller raises."""
        self.peer_gone = exc.errno in (errno.EPIPE, errno.ECONNRESET)
        self._fail(f"write failed: {os.strerror(exc.errno or errno.EIO)}")
        return WriterClosed(self.error)

    def _fail(self, reason: str) -> None:
        if not self.closed:
            self.closed = True
            self.error = reason
        self._chunks.clear()
        self.buffered = 0
        self._wake.set()
        self._drained.set()

    def close(self, reason: str = "closed") -> None:
        self._fail(reason)

    async def wait_drained(self) -> None:
        await self._drained.wait()

    async def _drain(self) -> None:
        try:
            while self._chunks and not self.closed:
                await trio.lowlevel.wait_writable(self._fd)
                self._flush()
            if not self._chunks:
                self._drained.set()
        except trio.ClosedResourceError:
            # The owner closed the fd (notify_closing) with data still queued: the peer stopped
            # reading and its bounded wait ran out. Nothing more can be written.
            self._fail("closed with unsent data")
        finally:
            self._draining = False

    def _flush(self) -> None:
        while self._chunks:
            chunk = self._chunks[0]
            try:
                n = os.write(self._fd, chunk)
            except BlockingIOError:
                return
            except OSError as exc:
                self._write_failed(exc)
                return
            self.buffered -= n
            if n == len(chunk):
                self._chunks.pop(0)
            else:
                self._chunks[0] = chunk[n:]

    async def run(self) -> None:
        """Drain queued data as the fd becomes writable; returns when the writer is closed."""
        while not self.closed:
            if not self._chunks:
                self._wake = trio.Event()
                await self._wake.wait()
                continue
            await trio.lowlevel.wait_writable(self._fd)
            self._flush()
            if not self._chunks:
                self._drained.set()


# Read errors that mean the peer (or the fd) is gone: end of file to the reader.
READ_GONE = frozenset({errno.ECONNRESET, errno.EPIPE, errno.EBADF})


def read_ready(fd: int) -> bytes | None:
    """Read once without waiting: None when nothing is there now, b"" at end of file."""
    try:
        return os.read(fd, READ_CHUNK)
    except BlockingIOError:
        return None
    except OSError as exc:
        if exc.errno in READ_GONE:
            return b""
        raise


async def read_some(fd: int) -> bytes:
    """Wait until fd is readable and read once; b"" means end of file.

    The two per-message read loops (a session's, an upstream's stdout) inline this."""
    while True:
        await trio.lowlevel.wait_readable(fd)
        try:
            return os.read(fd, READ_CHUNK)
        except BlockingIOError:
            continue
        except OSError as exc:
            if exc.errno in READ_GONE:
                return b""
            raise
