"""The settings watcher: change batching on trio's MockClock, and real folder watching."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
import trio

from mcpool.daemon._watch import (
    SETTLE_DELAY,
    ChangeBatcher,
    SettingsWatcher,
    WatchPlan,
    plan_watch,
)

# A child process that only reads its stdin ends as soon as that is closed: this bounds it.
HOLDER_EXIT_TIMEOUT = 10.0
# A change reaches the watcher at once (inotify) or within a few of watchfiles' steps: a bound.
REPORT_TIMEOUT = 10.0


async def test_batch_waits_for_quiet_after_the_last_change(autojump_clock):
    batcher = ChangeBatcher(quiet=0.02, max_delay=0.1)
    start = trio.current_time()
    batcher.add({"/a"})
    async with trio.open_nursery() as nursery:

        async def more() -> None:
            await trio.sleep(0.01)
            batcher.add({"/b"})

        nursery.start_soon(more)
        batch = await batcher.next_batch()
    assert batch == {"/a", "/b"}
    assert trio.current_time() - start == pytest.approx(0.03)


async def test_batch_is_never_held_past_max_delay_by_a_write_storm(autojump_clock):
    batcher = ChangeBatcher(quiet=0.02, max_delay=0.1)
    start = trio.current_time()
    batcher.add({"/f"})
    got: list[set[str]] = []
    async with trio.open_nursery() as nursery:

        async def storm() -> None:
            for i in range(50):
                await trio.sleep(0.005)
                batcher.add({f"/f{i}"})

        async def consume() -> None:
            got.append(await batcher.next_batch())
            got.append({str(trio.current_time() - start)})

        nursery.start_soon(storm)
        nursery.start_soon(consume)
    assert float(next(iter(got[1]))) == pytest.approx(0.1)
    # The rest of the storm lands in the next batch: nothing is lost.
    rest = await batcher.next_batch()
    assert got[0] | rest == {"/f", *(f"/f{i}" for i in range(50))}


async def test_batch_waits_for_the_first_change(autojump_clock):
    batcher = ChangeBatcher(quiet=0.02, max_delay=0.1)
    with trio.move_on_after(5) as scope:
        await batcher.next_batch()
    assert scope.cancelled_caught


async def _watch_until(tmp_path: Path, action, expect: set[str]) -> set[str]:
    seen: set[str] = set()
    done = trio.Event()

    async def on_change(paths: set[str]) -> None:
        seen.update(paths)
        if expect <= seen:
            done.set()

    watcher = SettingsWatcher(on_change)
    watcher.watch(expect)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watcher.run)
        # The OS watch registers in watchfiles' thread with no event to wait on: repeat the write
        # until it is seen (bounded).
        with trio.fail_after(10):
            while not done.is_set():
                action()
                with trio.move_on_after(0.2):
                    await done.wait()
        watcher.close()
    return seen


async def test_atomic_replace_is_seen(tmp_path: Path):
    target = tmp_path / "s.json"
    target.write_text("{}")

    def replace() -> None:
        tmp = tmp_path / ".s.json.tmp"
        tmp.write_text('{"mcpServers": {}}')
        os.replace(tmp, target)

    assert str(target) in await _watch_until(tmp_path, replace, {str(target)})


async def test_in_place_write_is_seen_and_other_files_are_not_reported(tmp_path: Path):
    target = tmp_path / "s.json"
    target.write_text("{}")

    def write() -> None:
        (tmp_path / "unrelated.txt").write_text("x")
        with open(target, "w") as f:
            f.write('{"mcpServers": {}}')

    seen = await _watch_until(tmp_path, write, {str(target)})
    assert seen == {str(target)}


# --- what is watched: symlink hops and missing folders (no watch running) --------------------


def test_plan_follows_each_symlink_hop_to_the_real_folder(tmp_path: Path):
    (tmp_path / "dotfiles").mkdir()
    (tmp_path / "cfg").mkdir()
    target = tmp_path / "dotfiles" / "mcpool.json"
    target.write_text("{}")
    middle = tmp_path / "dotfiles" / "current.json"
    middle.symlink_to("mcpool.json")
    link = tmp_path / "cfg" / "config.json"
    link.symlink_to(middle)
    plan = plan_watch({str(link)})
    assert plan.folders == {str(tmp_path / "cfg"), str(tmp_path / "dotfiles")}
    for hop in (link, middle, target):
        assert plan.concerned({str(hop)}) == {str(link)}
    assert plan.concerned({str(tmp_path / "dotfiles" / "other.json")}) == set()


def test_plan_watches_the_nearest_existing_ancestor_of_a_missing_folder(tmp_path: Path):
    missing = tmp_path / "a" / "b" / "s.json"
    plan = plan_watch({str(missing)})
    assert plan.folders == {str(tmp_path)}
    # Creating the first missing folder is what concerns the file.
    assert plan.concerned({str(tmp_path / "a")}) == {str(missing)}


def test_plan_watches_each_folders_parent_for_the_folders_own_deletion(tmp_path: Path):
    (tmp_path / "project").mkdir()
    here = tmp_path / "project" / ".mcp.json"
    missing = tmp_path / "a" / "b" / "s.json"
    plan = plan_watch({str(here), str(missing)})
    assert plan.folders == {str(tmp_path / "project"), str(tmp_path)}
    # tmp_path is watched in full already (for "a" to appear): only its parent is added.
    assert plan.parents == {str(tmp_path.parent)}
    # The parent reports a folder going as the folder's path; so does the folder's own watch.
    assert plan.concerned({str(tmp_path / "project")}) == {str(here)}
    assert plan.concerned({str(tmp_path)}) == {str(missing)}


def test_plan_never_raises_on_a_path_a_session_sent(tmp_path: Path):
    plan = plan_watch({"/x/a\0b.json", str(tmp_path / "s.json")})
    assert plan.folders == {str(tmp_path)}


async def test_an_empty_file_is_settled_before_it_is_reported(tmp_path: Path, autojump_clock):
    target = tmp_path / "s.json"
    target.write_text("")  # an editor truncated it ...
    batches: list[tuple[float, set[str], str]] = []

    async def on_change(paths: set[str]) -> None:
        batches.append((trio.current_time(), paths, target.read_text()))

    watcher = SettingsWatcher(on_change)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watcher.apply_batches)
        watcher.batcher.add({str(target)})
        await trio.sleep(SETTLE_DELAY / 2)
        target.write_text('{"mcpServers": {}}')  # ... and writes it a moment later
        watcher.batcher.add({str(target)})
        await trio.sleep(SETTLE_DELAY * 4)
        nursery.cancel_scope.cancel()
    # One reload, after the write: never the passing empty file.
    assert [(paths, text) for _, paths, text in batches] == [({str(target)}, '{"mcpServers": {}}')]
    assert batches[0][0] - start >= SETTLE_DELAY


# --- real watching: folders deleted and re-created, symlinks edited and swapped ----------------


class _Seen:
    def __init__(self) -> None:
        self.paths: set[str] = set()
        self.news = trio.Event()

    async def __call__(self, paths: set[str]) -> None:
        self.paths.update(paths)
        self.news.set()

    async def until(self, path: Path, action) -> None:
        """Repeat `action` until the watcher reports `path` (bounded): the OS watch registers in
        watchfiles' thread with no event to wait on."""
        self.paths.clear()
        with trio.fail_after(10):
            while str(path) not in self.paths:
                self.news = trio.Event()
                action()
                with trio.move_on_after(0.5):
                    await self.news.wait()


async def _restarted(watcher: SettingsWatcher, after: int) -> None:
    with trio.fail_after(10):
        while watcher.starts <= after:
            await trio.sleep(0.01)


def _watched_file(folder: Path, name: str) -> tuple[Path, _Seen, SettingsWatcher]:
    """`folder/name`, made with "{}" in it, and a watcher (no stale check) watching it."""
    folder.mkdir()
    target = folder / name
    target.write_text("{}")
    seen = _Seen()
    watcher = SettingsWatcher(seen)
    watcher.watch({str(target)})
    return target, seen, watcher


async def test_a_write_is_seen_after_the_folder_is_deleted_and_recreated(tmp_path: Path):
    folder = tmp_path / "cfg"
    target, seen, watcher = _watched_file(folder, "s.json")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watcher.run)
        await seen.until(target, lambda: target.write_text('{"mcpServers": {}}'))
        for recreate_at_once in (False, True):
            starts = watcher.starts
            shutil.rmtree(folder)
            if recreate_at_once:
                # Same name, new inode: the old watch died with the old folder.
                folder.mkdir()
            await _restarted(watcher, starts)
            if not recreate_at_once:
                assert watcher.folders == {str(tmp_path)}
                starts = watcher.starts
                folder.mkdir()
                await _restarted(watcher, starts)
            assert watcher.folders == {str(folder)}
            await seen.until(target, lambda: target.write_text('{"mcpServers": {}}'))
        watcher.close()


async def test_a_symlinked_config_is_followed_when_edited_replaced_or_re_pointed(tmp_path: Path):
    for name in ("cfg", "dotfiles", "other"):
        (tmp_path / name).mkdir()
    first = tmp_path / "dotfiles" / "mcpool.json"
    first.write_text("{}")
    link = tmp_path / "cfg" / "config.json"
    link.symlink_to(first)
    seen = _Seen()
    watcher = SettingsWatcher(seen)
    watcher.watch({str(link)})

    def edit(path: Path) -> None:
        with open(path, "w") as f:
            f.write('{"mcpServers": {}}')

    def replace_in_its_folder(path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text('{"mcpServers": {}}')
        os.replace(tmp, path)

    second = tmp_path / "other" / "b.json"
    second.write_text("{}")

    def re_point() -> None:
        tmp_link = link.with_name(".config.json.new")
        tmp_link.unlink(missing_ok=True)
        tmp_link.symlink_to(second)
        os.replace(tmp_link, link)  # as `ln -sfn` does

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watcher.run)
        await seen.until(link, lambda: edit(first))
        await seen.until(link, lambda: replace_in_its_folder(first))
        starts = watcher.starts
        await seen.until(link, re_point)
        await _restarted(watcher, starts)
        assert str(tmp_path / "other") in watcher.folders
        await seen.until(link, lambda: edit(second))
        await seen.until(link, lambda: replace_in_its_folder(second))
        watcher.close()


async def test_a_folder_deleted_while_a_process_is_in_it_is_still_followed(tmp_path: Path):
    # The kernel reports a folder's own deletion only when the last process using it lets go,
    # and the servers mcpool starts run in their settings file's folder. So the file's deletion
    # arrives while the folder is still there, the folder's never: only its parent's watch
    # sees the folder go.
    folder = tmp_path / "project"
    # No stale check: only an event can report the file.
    target, seen, watcher = _watched_file(folder, ".mcp.json")
    holder = await trio.lowlevel.open_process(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], cwd=folder, stdin=subprocess.PIPE
    )
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watcher.run)
            await seen.until(target, lambda: target.write_text('{"mcpServers": {}}'))
            # The file goes first, and the watcher has handled that while the folder is there.
            await seen.until(target, lambda: target.unlink(missing_ok=True))
            folder.rmdir()
            folder.mkdir()
            await seen.until(target, lambda: target.write_text('{"mcpServers": {}}'))
            # And the watch is on the new folder: later writes into it are seen too.
            assert watcher.folders == {str(folder)}
            await seen.until(target, lambda: target.write_text('{"mcpServers": {"a": {}}}'))
            watcher.close()
    finally:
        assert holder.stdin is not None
        await holder.stdin.aclose()
        with trio.fail_after(HOLDER_EXIT_TIMEOUT):
            await holder.wait()


class _FolderCreatedWhileWatching(SettingsWatcher):
    """Creates `folder` with `target` in it right after the watch for the folder's creation was
    planned, before that watch is in place: the gap no event can report."""

    def __init__(self, on_change: _Seen, folder: Path, target: Path) -> None:
        super().__init__(on_change)
        self.folder = folder
        self.target = target

    def _changes(self, plan: WatchPlan, stop: anyio.Event) -> AsyncIterator[set[str]]:
        if plan.folders == {str(self.folder.parent)} and not self.folder.exists():
            self.folder.mkdir()
            self.target.write_text("{}")
        return super()._changes(plan, stop)


async def test_a_folder_created_while_its_watch_is_set_up_is_not_missed(tmp_path: Path):
    folder = tmp_path / "project"
    target = folder / ".mcp.json"
    seen = _Seen()
    watcher = _FolderCreatedWhileWatching(seen, folder, target)  # no stale check, as above
    watcher.watch({str(target)})
    assert watcher.folders == {str(tmp_path)}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watcher.run)
        # Reported once, by the check made when the watch is in place (no write repeats it).
        with trio.fail_after(REPORT_TIMEOUT):
            while str(target) not in seen.paths:
                seen.news = trio.Event()
                await seen.news.wait()
        # And the watch moved into the new folder: a later write is seen.
        await seen.until(target, lambda: target.write_text('{"mcpServers": {}}'))
        assert watcher.folders == {str(folder)}
        watcher.close()
