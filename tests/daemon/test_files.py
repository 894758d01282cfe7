"""Private files: created 0600 whatever the umask, replaced atomically, through symlinks."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mcpool.daemon._files import backup_private, open_private, write_private


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
