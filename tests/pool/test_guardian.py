"""The guardian (L4, issue 12 item 11) with real processes: a dead guardian is replaced, and the
replacement is told every registered group, so the groups still die with the daemon."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

import trio

from mcpool.pool import Guardian, _guardian

WAIT = 10.0  # a guardian restart is one interpreter start; a group kill is TERM_GRACE at most
POLL = 0.05  # another process's exit has no event to wait on here: poll, bounded by WAIT


async def _until(condition: Any) -> None:
    with trio.fail_after(WAIT):
        while not condition():
            await trio.sleep(POLL)


async def test_a_killed_guardian_is_replaced_and_the_new_one_kills_every_group() -> None:
    guardian = Guardian()
    sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)
    logged: list[tuple[Any, ...]] = []
    try:
        guardian.register(sleeper.pid)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(guardian.watch, lambda *a, **_k: logged.append(a))
            first = guardian.pid
            os.kill(first, signal.SIGKILL)
            await _until(lambda: guardian.pid != first)
            assert guardian.restarts == 1
            assert logged and logged[0][0] == "warning"
            assert str(first) in logged[0][1] and str(guardian.pid) in logged[0][1]
            assert sleeper.poll() is None  # a guardian's death is not the daemon's
            # The daemon dies: its end of the pipe closes, however it died.
            guardian._close_pipe()
            await _until(lambda: sleeper.poll() is not None)
            assert sleeper.returncode == -signal.SIGTERM
            nursery.cancel_scope.cancel()
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        guardian.close()


async def test_what_left_every_group_but_carries_the_daemons_mark_dies_with_it() -> None:
    # Not registered, in a session of its own, not our child's child: only its environment
    # (every upstream's mark, inherited) ties it to the daemon (here: this process).
    guardian = Guardian()
    marked = subprocess.Popen(
        ["sleep", "600"],
        start_new_session=True,
        env={**os.environ, _guardian.UPSTREAM_MARKER.decode(): str(os.getpid())},
    )
    unmarked = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        guardian._close_pipe()  # the daemon is gone
        await _until(lambda: marked.poll() is not None)
        assert marked.returncode == -signal.SIGTERM
        assert unmarked.poll() is None  # nobody else's process is touched
    finally:
        for proc in (marked, unmarked):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        guardian.close()
