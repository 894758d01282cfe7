"""The settings watcher: change batching on trio's MockClock, and real folder watching."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from mcpool.daemon._watch import ChangeBatcher, SettingsWatcher


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
