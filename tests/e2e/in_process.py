"""The real `Daemon` run in the test's own process and trio run (for tests that look inside it:
its objects, its collector), started, served and stopped with its exit status checked."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from mcpool.daemon._daemon import Daemon

STEP_TIMEOUT = 10.0  # an in-process start or round trip takes milliseconds; this bounds a hang


@asynccontextmanager
async def running_daemon(d: Daemon) -> AsyncIterator[Daemon]:
    """`d` running until the block ends, then stopped; its `run` must return 0."""
    threshold = gc.get_threshold()
    async with trio.open_nursery() as nursery:
        status: list[int] = []

        async def run() -> None:
            status.append(await d.run())

        nursery.start_soon(run)
        with trio.fail_after(STEP_TIMEOUT):
            await d.ready.wait()
        yield d
        d.request_stop()
        with trio.fail_after(STEP_TIMEOUT + d.options.shutdown_timeout):
            while not status:
                await trio.sleep(0.01)
    # Daemon.run tunes the collector for a process of its own; give the test process its own back.
    gc.unfreeze()
    gc.set_threshold(*threshold)
    assert status == [0]
