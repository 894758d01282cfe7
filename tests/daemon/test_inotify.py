"""The inotify folder watch (daemon/_inotify.py): event parsing without the kernel, then real
inotify on a temporary folder, and the watcher's watchfiles fallback."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from mcpool.daemon._inotify import (
    IN_CLOSE_WRITE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    Inotify,
    parse_events,
)
from mcpool.daemon._watch import SettingsWatcher

# A write reaches inotify at once; this only bounds the wait.
EVENT_TIMEOUT = 10.0

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux")


def event(wd: int, mask: int, name: bytes = b"") -> bytes:
    padded = name + b"\0" * (16 - len(name) % 16) if name else b""  # NUL-padded, as the kernel
    return struct.pack("iIII", wd, mask, 0, len(padded)) + padded


def test_entries_are_folder_slash_name_and_self_events_the_folder() -> None:
    folders = {1: "/a", 2: "/b"}
    data = (
        event(1, IN_CLOSE_WRITE, b"s.json")
        + event(2, IN_MOVED_TO, b"x")
        + event(2, IN_DELETE_SELF)
        + event(2, IN_IGNORED)
        + event(9, IN_CLOSE_WRITE, b"unknown-wd")
    )
    assert parse_events(data, folders) == {"/a/s.json", "/b/x", "/b"}


def test_an_overflow_reports_every_folder() -> None:
    assert parse_events(event(-1, IN_Q_OVERFLOW), {1: "/a", 2: "/b"}) == {"/a", "/b"}


def test_a_truncated_buffer_is_no_error() -> None:
    data = event(1, IN_CLOSE_WRITE, b"s.json")
    assert parse_events(data[:10], {1: "/a"}) == set()


@linux_only
async def test_real_inotify_reports_a_write_and_the_folders_deletion(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    ino = Inotify.open([str(folder)])
    try:
        (folder / ".mcp.json").write_text("{}")
        with trio.fail_after(EVENT_TIMEOUT):
            assert str(folder / ".mcp.json") in await ino.read()
        (folder / ".mcp.json").unlink()
        os.rmdir(folder)
        seen: set[str] = set()
        with trio.fail_after(EVENT_TIMEOUT):
            while str(folder) not in seen:
                seen |= await ino.read()
    finally:
        ino.close()


@linux_only
async def test_an_entries_only_parent_reports_its_folder_going_while_a_process_is_in_it(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    other = tmp_path / "other.txt"
    other.touch()
    ino = Inotify.open([str(folder)], entries_only=[str(tmp_path)])
    holder = await trio.lowlevel.open_process(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], cwd=folder, stdin=subprocess.PIPE
    )
    try:
        other.write_text("x")  # no entry came or went: the parent's watch does not report it
        folder.rmdir()  # the holder's cwd: the folder's own watch stays silent
        seen: set[str] = set()
        with trio.fail_after(EVENT_TIMEOUT):
            while str(folder) not in seen:
                seen |= await ino.read()
        assert seen == {str(folder)}
    finally:
        ino.close()
        assert holder.stdin is not None
        await holder.stdin.aclose()
        with trio.fail_after(EVENT_TIMEOUT):
            await holder.wait()


@linux_only
def test_a_missing_folder_is_an_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="inotify_add_watch"):
        Inotify.open([str(tmp_path / "nowhere")])


async def test_without_inotify_the_watchfiles_fallback_sees_a_write(tmp_path: Path) -> None:
    target = tmp_path / "s.json"
    target.write_text("{}")
    seen: set[str] = set()
    done = trio.Event()

    async def on_change(paths: set[str]) -> None:
        seen.update(paths)
        done.set()

    watcher = SettingsWatcher(on_change)
    watcher.use_inotify = False
    watcher.watch({str(target)})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watcher.run)
        # watchfiles registers its watch in a thread with no event to wait on: repeat the write.
        with trio.fail_after(EVENT_TIMEOUT):
            while not done.is_set():
                target.write_text('{"mcpServers": {}}')
                with trio.move_on_after(0.2):
                    await done.wait()
        watcher.close()
    assert seen == {str(target)}
