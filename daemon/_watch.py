"""Settings file watching: one watcher for the daemon, folders watched, files watched once.

Theory of operation: watchfiles watches folders, not files (a file watch goes silent after an
atomic replace: the watched inode is gone). `SettingsWatcher` keeps the set of files the daemon
cares about (its config plus every attached session's sources), watches their folders with one
`awatch`, and hands each batch of changed files that are in that set to the daemon's reload
callback. When the set of folders changes (a session with a new project attaches) the running
`awatch` is stopped through its `stop_event` (cancelling alone can take seconds) and started
again over the new folders. Reloads themselves go through the daemon's one reload gate (S7);
the watcher only says which files changed.

What is watched is a `WatchPlan`, planned from the files and the disk as they are now:
- a symlinked file is watched at every hop (the link's folder and each target's real folder):
  editing the target in place, replacing it atomically in its own folder, or re-pointing the
  link are all seen, and a change to a hop plans again (the new target's folder is watched);
- a folder that does not exist (deleted, or not created yet) is watched through its nearest
  existing ancestor, for the creation of the next folder down;
- a watched folder that is deleted or moved away (its inotify watch dies with it, even if a
  new folder of the same name appears at once) restarts the watch over a new plan;
- so each watched folder's parent is watched too, for its entries only: the kernel reports a
  folder's own deletion only once no process has it open or as its cwd, and the servers the
  daemon starts run in their settings file's folder, so the folder's own watch may never say it
  is gone (the file's deletion came first, while the folder was still there), its parent does.
Events only report what happens while a watch is in place. So once a new watch is (the moment
it opens on inotify, STARTUP_RECHECK later on watchfiles) the watcher plans again from the disk
and reports what changed while it was being set up: a folder created or deleted in that gap
plans again, and every file whose signature differs from the one loaded is reported.
Nothing polls: an idle daemon only wakes for events in the folders it watches (on Linux the
inotify fd is read by trio when the kernel has events, daemon/_inotify.py; elsewhere watchfiles,
whose loop wakes every STEP_MS).
"""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio
import trio

from ._inotify import Inotify

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
# that window is never reported. This long after each (re)start the watcher catches up with the
# disk (`_caught_up`); inotify's watch is in place when it opens, and is caught up with at once.
STARTUP_RECHECK = 0.5

# A batch with a file that is empty or missing is held this long, then re-read with whatever
# arrived meanwhile: an editor that truncates then writes, or renames the old file away then
# writes the new one, has finished by then, so the daemon neither reports a passing error nor
# removes a file's servers for a file that is back a moment later.
SETTLE_DELAY = 0.25

# The watch could not start (a folder removed between planning and watching, or the OS watch
# limit reached): plan again after this, doubling up to WATCH_RETRY_MAX while it keeps failing
# (slow enough that a lasting failure is no busy loop).
WATCH_RETRY_INITIAL = 0.1
WATCH_RETRY_MAX = 30.0

# As the kernel's ELOOP limit: a longer symlink chain (or a loop) is followed no further.
MAX_SYMLINK_HOPS = 40

ReloadCallback = Callable[[set[str]], Awaitable[None]]
StaleCheck = Callable[[], set[str]]
LogCallback = Callable[..., None]


def symlink_hops(path: str) -> list[str]:
    """`path` and each symlink target on the way to the file, each as real folder + name (the
    form watchfiles reports for a watched real folder)."""
    hops: list[str] = []
    current = os.path.abspath(path)
    for _ in range(MAX_SYMLINK_HOPS):
        current = os.path.join(
            os.path.realpath(os.path.dirname(current)), os.path.basename(current)
        )
        if current in hops:
            break
        hops.append(current)
        try:
            target = os.readlink(current)
        except OSError:  # not a link (or gone): the chain ends here
            break
        current = os.path.join(os.path.dirname(current), target)
    return hops


def existing_folder(folder: str) -> tuple[str, str | None]:
    """`folder` if it exists; else its nearest existing ancestor and that ancestor's child on
    the way down (whose creation is what to wait for)."""
    child: str | None = None
    while not os.path.isdir(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        child, folder = folder, parent
    return folder, child


@dataclass(frozen=True)
class WatchPlan:
    """The folders to watch, and which watched files an event at a path concerns."""

    folders: frozenset[str] = frozenset()
    # Watched for their entries coming and going only: each folder's parent (see the top).
    parents: frozenset[str] = frozenset()
    routes: dict[str, frozenset[str]] = field(default_factory=dict)

    def concerned(self, paths: Iterable[str]) -> set[str]:
        hit: set[str] = set()
        for path in paths:
            hit.update(self.routes.get(path, ()))
        return hit


def plan_watch(files: Iterable[str]) -> WatchPlan:
    """Plan from the disk as it is now (a few stat/readlink calls per file); never raises."""
    routes: dict[str, set[str]] = {}
    folders: set[str] = set()
    parents: set[str] = set()
    for file in files:
        try:
            hops = symlink_hops(file)
            for hop in hops:
                routes.setdefault(hop, set()).add(file)
                folder, child = existing_folder(os.path.dirname(hop))
                folders.add(folder)
                # The folder itself: its deletion or move concerns the file (reported by its
                # own watch or its parent's), and for an ancestor so does the creation of the
                # next folder down.
                routes.setdefault(folder, set()).add(file)
                if child is not None:
                    routes.setdefault(child, set()).add(file)
                if (parent := os.path.dirname(folder)) != folder:
                    parents.add(parent)
        except ValueError:  # a NUL byte in a path a session sent: nothing to watch for it
            continue
    return WatchPlan(
        frozenset(folders),
        frozenset(parents - folders),  # a folder's full watch sees its entries already
        {k: frozenset(v) for k, v in routes.items()},
    )


def unsettled(path: str) -> bool:
    """Empty or missing: maybe an editor's save in progress (see SETTLE_DELAY)."""
    try:
        return os.stat(path).st_size == 0
    except (OSError, ValueError):
        return True


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

    def take(self) -> set[str]:
        """Whatever is pending, at once (the settle re-check merges it into its batch)."""
        batch, self._paths = self._paths, set()
        return batch

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
    def __init__(
        self,
        on_change: ReloadCallback,
        stale: StaleCheck | None = None,
        log: LogCallback | None = None,
    ) -> None:
        self._on_change = on_change
        self._stale = stale
        self._log = log
        self._nursery: trio.Nursery | None = None
        self.batcher = ChangeBatcher()
        self._files: set[str] = set()
        self.plan = WatchPlan()
        self._changed = trio.Event()
        self._stop: anyio.Event | None = None
        self.closed = False
        # How many times the watch has been (re)started: tests wait on it.
        self.starts = 0
        # Linux inotify, read only when it has events (daemon/_inotify.py); False: watchfiles.
        self.use_inotify = True

    @property
    def folders(self) -> set[str]:
        return set(self.plan.folders)

    def watch(self, files: Iterable[str]) -> None:
        """Replace the watched file set (idempotent; folders restart only when they change)."""
        self._files = {os.path.abspath(f) for f in files}
        self._replan()

    def _replan(self) -> bool:
        """Plan again; restart the running watch when what it watches changed."""
        plan = plan_watch(self._files)
        if plan == self.plan:
            return False
        restart = plan.folders != self.plan.folders
        self.plan = plan
        if restart:
            self._restart()
        return restart

    def _restart(self) -> None:
        self._changed.set()
        if self._stop is not None:
            self._stop.set()

    def close(self) -> None:
        self.closed = True
        self._restart()

    async def run(self) -> None:
        """Watch folders and feed the batcher; a second task applies batches one at a time."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self.apply_batches)
            await self._watch_folders()
            nursery.cancel_scope.cancel()

    async def apply_batches(self) -> None:
        while True:
            batch = await self.batcher.next_batch()
            if any(unsettled(path) for path in batch):
                await trio.sleep(SETTLE_DELAY)
                batch |= self.batcher.take()
            await self._on_change(batch)

    async def _recheck(self, delay: float) -> None:
        await trio.sleep(delay)
        self._caught_up()

    def _caught_up(self) -> None:
        """The watch is in place: report what changed on disk while it was being set up, which
        no watch could see. A folder created or deleted since planning plans again (and
        restarts the watch) and reports the files routed through it; so does every file whose
        signature differs from the one loaded."""
        before = self.plan
        self._replan()
        moved = (before.folders ^ self.plan.folders) | (before.parents ^ self.plan.parents)
        missed = before.concerned(moved) | self.plan.concerned(moved)
        if self._stale is not None:
            missed |= self._stale() & self._files
        if missed:
            self.batcher.add(missed)

    def _seen(self, paths: set[str]) -> None:
        """One awatch batch: report the files it concerns; plan again when it touched a hop
        or a folder, and restart when a watched folder itself was deleted or moved."""
        paths = {os.path.abspath(path) for path in paths}
        hit = self.plan.concerned(paths)
        if not hit:
            return
        self.batcher.add(hit)
        folder_event = bool(paths & self.plan.folders)
        if not self._replan() and folder_event:
            # Same plan, but the folder was replaced: the old watch died with its inode.
            self._restart()

    async def _watch_folders(self) -> None:
        retry = WATCH_RETRY_INITIAL
        while not self.closed:
            self._replan()
            plan = self.plan
            folders = sorted(plan.folders)
            self._changed = trio.Event()
            if not folders:
                await self._changed.wait()
                continue
            self._stop = anyio.Event()
            self.starts += 1
            try:
                async for paths in self._changes(plan, self._stop):
                    self._seen(paths)
                    retry = WATCH_RETRY_INITIAL
            except OSError as exc:
                # Never the end of hot reload: a file's folder can vanish between planning and
                # watching, and the next plan watches its ancestor instead.
                self._note("warning", f"settings watch failed ({exc}); retrying", folders=folders)
                with trio.move_on_after(retry):
                    await self._changed.wait()
                retry = min(retry * 2, WATCH_RETRY_MAX)
                if self._stale is not None and (missed := self._stale() & self._files):
                    # Writes during the gap had no watch to report them.
                    self.batcher.add(missed)
            self._stop = None

    async def _changes(self, plan: WatchPlan, stop: anyio.Event) -> AsyncIterator[set[str]]:
        """Batches of changed paths in the plan's folders and parents until `stop`: inotify
        where there is one (no wake-up while idle), else watchfiles (which wakes every
        STEP_MS)."""
        folders = sorted(plan.folders)
        parents = sorted(plan.parents)
        try:
            ino = Inotify.open(folders, entries_only=parents) if self.use_inotify else None
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EMFILE, errno.ENFILE, errno.ENOSPC):
                raise  # a folder gone since planning: plan again (the caller retries)
            ino = None  # no inotify here, or out of instances or watches: watchfiles polls
        if ino is None:
            from watchfiles import awatch

            # No entries-only watch here: a parent's other files are reported, and not routed.
            # One we may not read is left out, as Inotify.open does.
            readable = [p for p in parents if os.access(p, os.R_OK | os.X_OK)]
            if self._nursery is not None:
                # (Its watches are in place some time after this: caught up with then.)
                self._nursery.start_soon(self._recheck, STARTUP_RECHECK)
            async for changes in awatch(
                *folders,
                *readable,
                debounce=DEBOUNCE_MS,
                step=STEP_MS,
                stop_event=stop,
                recursive=False,
            ):
                yield {path for _, path in changes}
            return
        try:
            # In place now (inotify_add_watch is synchronous): what changed since planning?
            self._caught_up()
            while not stop.is_set():
                paths: set[str] | None = None
                async with trio.open_nursery() as nursery:

                    async def until_stopped() -> None:
                        await stop.wait()
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(until_stopped)
                    paths = await ino.read()
                    nursery.cancel_scope.cancel()
                if paths:
                    yield paths
        finally:
            ino.close()

    def _note(self, level: str, message: str, **fields: Any) -> None:
        if self._log is not None:
            self._log(level, message, **fields)
