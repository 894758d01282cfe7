"""Settings file watching: one watcher for the daemon, folders watched, files watched once.

Theory of operation: watchfiles watches folders, not files (a file watch goes silent after an
atomic replace: the watched inode is gone). `SettingsWatcher` keeps the set of files the daemon
cares about (its config plus every attached session's sources), watches their folders with one
`awatch`, and hands each batch of changed files that are in that set to the daemon's reload
callback. When the set of folders changes (a session with a new project attaches) the running
`awatch` is stopped through its `stop_event` (cancelling alone can take seconds) and started
again over the new folders. Reloads themselves go through the daemon's one reload gate (S7);
the watcher only says which files changed.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterable

import anyio
import trio

# watchfiles groups changes arriving within DEBOUNCE_MS of each other and polls its queue every
# STEP_MS. Editors write a file in a burst of a few ms; this keeps write-to-reload well under the
# 150 ms budget while still seeing an atomic replace (create temp, rename) as one batch.
DEBOUNCE_MS = 30
STEP_MS = 20
# How long awatch may take to notice its stop_event (its step, plus slack for the Rust thread).
STOP_BOUND = 2.0

# After a change, wait this long for more before reloading: one reload per editor save burst.
QUIET = 0.02
# ...but never hold a change back longer than this while writes keep coming.
MAX_DELAY = 0.1

# watchfiles registers its OS watches in a worker thread with no signal when done: a write in
# that window is never reported. This long after each (re)start, files whose on-disk signature
# differs from what the daemon loaded are treated as changed.
STARTUP_RECHECK = 0.5

ReloadCallback = Callable[[set[str]], Awaitable[None]]
StaleCheck = Callable[[], set[str]]


class ChangeBatcher:
    """Coalesces changed paths: a batch is ready after QUIET s without news, or MAX_DELAY s.

    Pure trio timing (trio.current_time), so MockClock tests drive it exactly.
    """

    def __init__(self, quiet: float = QUIET, max_delay: float = MAX_DELAY) -> None:
        self.quiet = quiet
        self.max_delay = max_delay
        self._paths: set[str] = set()
        self._first = 0.0
        self._last = 0.0
        self._news = trio.Event()

    def add(self, paths: Iterable[str]) -> None:
        now = trio.current_time()
        if not self._paths:
            self._first = now
        self._paths.update(paths)
        self._last = now
        self._news.set()

    async def next_batch(self) -> set[str]:
        while not self._paths:
            self._news = trio.Event()
            await self._news.wait()
        while True:
            deadline = min(self._last + self.quiet, self._first + self.max_delay)
            if trio.current_time() >= deadline:
                break
            self._news = trio.Event()
            with trio.move_on_at(deadline):
                await self._news.wait()
        batch, self._paths = self._paths, set()
        return batch


class SettingsWatcher:
    def __init__(self, on_change: ReloadCallback, stale: StaleCheck | None = None) -> None:
        self._on_change = on_change
        self._stale = stale
        self._nursery: trio.Nursery | None = None
        self.batcher = ChangeBatcher()
        self._files: set[str] = set()
        self._changed = trio.Event()
        self._stop: anyio.Event | None = None
        self.closed = False

    @property
    def folders(self) -> set[str]:
        return {os.path.dirname(f) for f in self._files}

    def watch(self, files: Iterable[str]) -> None:
        """Replace the watched file set (idempotent; folders restart only when they change)."""
        new = {os.path.abspath(f) for f in files}
        old_folders = self.folders
        self._files = new
        if self.folders != old_folders:
            self._changed.set()
            if self._stop is not None:
                self._stop.set()

    def close(self) -> None:
        self.closed = True
        self._changed.set()
        if self._stop is not None:
            self._stop.set()

    async def run(self) -> None:
        """Watch folders and feed the batcher; a second task applies batches one at a time."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._apply_batches)
            await self._watch_folders()
            nursery.cancel_scope.cancel()

    async def _apply_batches(self) -> None:
        while True:
            batch = await self.batcher.next_batch()
            await self._on_change(batch)

    async def _recheck(self, delay: float) -> None:
        await trio.sleep(delay)
        assert self._stale is not None
        stale = self._stale() & self._files
        if stale:
            self.batcher.add(stale)

    def _existing_folders(self) -> list[str]:
        # A folder that does not exist yet cannot be watched; attach of a new one re-runs this.
        return sorted(f for f in self.folders if os.path.isdir(f))

    def _watched(self, paths: set[str]) -> set[str]:
        return {os.path.abspath(p) for p in paths} & self._files

    async def _watch_folders(self) -> None:
        from watchfiles import awatch

        while not self.closed:
            folders = self._existing_folders()
            self._changed = trio.Event()
            if not folders:
                await self._changed.wait()
                continue
            self._stop = anyio.Event()
            if self._nursery is not None and self._stale is not None:
                self._nursery.start_soon(self._recheck, STARTUP_RECHECK)
            async for changes in awatch(
                *folders,
                debounce=DEBOUNCE_MS,
                step=STEP_MS,
                stop_event=self._stop,
                recursive=False,
            ):
                hit = self._watched({path for _, path in changes})
                if hit:
                    self.batcher.add(hit)
            self._stop = None
