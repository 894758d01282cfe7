"""Private files: created 0600 whatever the umask, replaced atomically, through symlinks; bounded
reads that allocate for what the file holds."""

from __future__ import annotations

import os
import stat
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from mcpool.daemon._files import (
    READ_CHUNK,
    backup_private,
    open_private,
    read_bounded,
    write_private,
)

LIMIT = 4 * 1024 * 1024  # the settings files' bound


@pytest.fixture
def open_umask():
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_new_and_replaced_files_are_0600(tmp_path: Path, open_umask) -> None:
    path = tmp_path / "new" / "config.json"
    write_private(path, b"{}")
    assert (_mode(path), path.read_bytes()) == (0o600, b"{}")
    assert _mode(path.parent) == 0o700
    path.chmod(0o644)
    inode = path.stat().st_ino
    write_private(path, b"{ }")
    assert (_mode(path), path.read_bytes()) == (0o600, b"{ }")
    assert path.stat().st_ino != inode  # renamed over, never truncated in place
    assert os.listdir(path.parent) == ["config.json"]


def test_a_backup_is_0600_even_of_a_readable_file(tmp_path: Path, open_umask) -> None:
    src = tmp_path / "client.json"
    src.write_text('{"token": "s"}')
    src.chmod(0o644)
    backup_private(src, tmp_path / "client.json.bak")
    assert _mode(tmp_path / "client.json.bak") == 0o600


def test_a_symlink_is_written_at_its_target(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert write_private(link, b"[]") == target
    assert link.is_symlink() and target.read_bytes() == b"[]"


def test_open_private_tightens_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "daemon.log"
    path.write_text("old\n")
    path.chmod(0o666)
    os.close(open_private(path, os.O_WRONLY | os.O_APPEND))
    assert _mode(path) == 0o600


def test_a_failed_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "config.json").mkdir()  # the rename over a folder fails
    with pytest.raises(IsADirectoryError):
        write_private(folder / "config.json", b"{}")
    assert os.listdir(folder) == ["config.json"]


def peak_allocation(read: Callable[[], bytes]) -> tuple[bytes, int]:
    """What `read` returned and the most memory the interpreter held for it at any moment."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        data = read()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return data, peak - before


def test_a_bounded_read_of_a_small_file_allocates_for_the_file_not_the_limit(
    tmp_path: Path,
) -> None:
    # A read buffer of the whole limit, freed when the read finds the end, made glibc serve
    # later megabyte requests from the heap: the daemon's RSS grew per file read.
    path = tmp_path / "s.json"
    path.write_bytes(b"x" * 3000)
    fd = os.open(path, os.O_RDONLY)
    try:
        data, peak = peak_allocation(lambda: read_bounded(fd, LIMIT))
    finally:
        os.close(fd)
    assert data == b"x" * 3000
    assert peak < 3000 + 2 * READ_CHUNK, peak


def test_a_bounded_read_stops_one_byte_past_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"y" * (3 * READ_CHUNK))
    for limit in (0, 10, READ_CHUNK, 3 * READ_CHUNK - 1, 3 * READ_CHUNK, 4 * READ_CHUNK):
        fd = os.open(path, os.O_RDONLY)
        try:
            data = read_bounded(fd, limit)
        finally:
            os.close(fd)
        assert data == b"y" * min(limit + 1, 3 * READ_CHUNK), limit


def test_a_bounded_read_of_a_pipe_reads_to_its_end_in_chunks() -> None:
    # No size to go by (fstat says 0): READ_CHUNK at a time, to the end or the limit.
    for limit, expected in ((LIMIT, 50_000), (1000, 1001)):
        r, w = os.pipe()
        try:
            os.write(w, b"z" * 50_000)
            os.close(w)
            data, peak = peak_allocation(lambda: read_bounded(r, limit))  # noqa: B023
        finally:
            os.close(r)
        assert data == b"z" * expected
        assert peak < 2 * READ_CHUNK + 50_000, peak
