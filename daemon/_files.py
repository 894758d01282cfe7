"""Files mcpool writes that may hold secrets: created 0600 from the start, replaced atomically.

Settings (and the client configs `setup-client` edits) carry tokens in `env` and `headers`; the
daemon log and its stderr can quote them. Each is created with mode 0600 by `os.open` and then
`fchmod`ed on the open descriptor, so neither the umask nor a pre-existing looser file leaves a
window where another user can read it (a chmod after writing would). A file that is replaced is
written to a temporary file in the same folder and renamed over it, so a reader (the daemon's
watcher, an editor) sees the old content or the new, never a truncated file. A symlinked target
is written where the link points: the link stays a link.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

PRIVATE_MODE = 0o600
# Random suffixes make a clash of temporary names unlikely; O_EXCL makes one harmless.
_TEMP_ATTEMPTS = 8
# A bounded read past the size fstat gave (the file grew, or has no size) asks for this much at
# a time: under glibc's initial mmap threshold (128 KiB), so no read buffer is a mapping.
READ_CHUNK = 64 * 1024


def open_private(path: Path | str, flags: int) -> int:
    """os.open(path, flags | O_CREAT | O_CLOEXEC) with mode 0600, enforced on the descriptor
    (also for a file that already existed with a looser mode)."""
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, PRIVATE_MODE)
    try:
        os.fchmod(fd, PRIVATE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: Path | str, data: bytes | Sequence[bytes | memoryview]) -> Path:
    """Replace `path` (or create it) with `data` (or the pieces that, joined, make it), mode
    0600, atomically; the path written (a symlink's target)."""
    target = Path(os.path.realpath(path))
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    for _ in range(_TEMP_ATTEMPTS):
        tmp = target.with_name(f".{target.name}.{os.urandom(4).hex()}.tmp")
        try:
            fd = open_private(tmp, os.O_WRONLY | os.O_EXCL)
        except FileExistsError:
            continue
        break
    else:
        raise FileExistsError(f"no free temporary name next to {target}")
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, bytes):
                f.write(data)
            else:
                f.writelines(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target


def read_bounded(fd: int, limit: int) -> bytes:
    """Up to `limit` + 1 bytes from `fd` (one more than `limit` says "too large"), each read
    sized to what the file holds (fstat's size + 1), then READ_CHUNK at a time.

    Not `os.read(fd, limit + 1)`: every such read allocates the whole limit (megabytes) to fill
    a few KiB, and the read that finds the end frees a buffer of that size. glibc's malloc
    takes the free of a large mapped block as a sign to serve blocks up to that size from the
    heap from then on (its dynamic mmap threshold), and each read's multi-megabyte request then
    lands past the live small objects at the heap's end: the daemon's heap grew by kilobytes
    for every settings file and snapshot read, and never gave it back (tests/e2e/test_chaos.py).
    """
    try:
        expected = os.fstat(fd).st_size
    except OSError:
        expected = 0
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        want = expected + 1 - size if size < expected else READ_CHUNK
        chunk = os.read(fd, min(want, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def backup_private(path: Path | str, backup: Path | str) -> None:
    """Copy `path` to `backup` (mode 0600, atomically): a backup of a secret is a secret."""
    with open(path, "rb") as f:
        data = f.read()
    write_private(backup, data)
