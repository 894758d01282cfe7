"""Run `python -m mcpool ...` with a trio instrument timing every pass of the event loop.

    python tools/bench/_looptime.py OUT.json -m mcpool daemon ...

A pass is what runs between two waits for I/O: every task made runnable, one after the other.
While one pass runs, no other task (another session's call) can, so the longest passes are how
long the loop was held. Each pass is measured in CPU time of the loop's thread
(`time.thread_time`, immune to the machine's other load) and in wall time; passes over
`MIN_MS` are written to OUT.json at exit as [start (CLOCK_MONOTONIC s), cpu ms, wall ms, task
steps], so a benchmark can pick those of a window it timed with `time.monotonic()`; so are the
interpreter's full garbage collections (generation 2: they walk the whole heap), as [start, CPU
ms].
"""

from __future__ import annotations

import gc
import json
import runpy
import sys
import time
from typing import Any

import trio

MIN_MS = 0.5  # passes shorter than this are not recorded (most are a few microseconds)


class LoopTimer(trio.abc.Instrument):
    def __init__(self) -> None:
        self.passes: list[list[float]] = []
        self._wall = time.monotonic()
        self._cpu = time.thread_time()
        self._steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._steps += 1

    def after_io_wait(self, timeout: float) -> None:
        self._wall = time.monotonic()
        self._cpu = time.thread_time()
        self._steps = 0

    def before_io_wait(self, timeout: float) -> None:
        cpu = (time.thread_time() - self._cpu) * 1000
        if cpu >= MIN_MS:
            wall = (time.monotonic() - self._wall) * 1000
            self.passes.append([round(self._wall, 6), round(cpu, 3), round(wall, 3), self._steps])


class FullCollections:
    """The interpreter's full (generation 2) garbage collections: [start, cpu ms] each."""

    def __init__(self) -> None:
        self.runs: list[list[float]] = []
        self._start = (0.0, 0.0)

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._start = (time.monotonic(), time.thread_time())
        else:
            cpu = (time.thread_time() - self._start[1]) * 1000
            self.runs.append([round(self._start[0], 6), round(cpu, 3)])


def main() -> None:
    out, rest = sys.argv[1], sys.argv[2:]
    assert rest[:2] == ["-m", "mcpool"], rest
    timer = LoopTimer()
    collections = FullCollections()
    gc.callbacks.append(collections)
    real_run = trio.run

    def run(*args: Any, **kwargs: Any) -> Any:
        kwargs["instruments"] = [*kwargs.get("instruments", ()), timer]
        try:
            return real_run(*args, **kwargs)
        finally:
            with open(out, "w") as f:
                json.dump({"passes": timer.passes, "full_collections": collections.runs}, f)

    trio.run = run  # the daemon's one trio.run (daemon/_daemon.py)
    sys.argv = ["mcpool", *rest[2:]]
    runpy.run_module("mcpool", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
