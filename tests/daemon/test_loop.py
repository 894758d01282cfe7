"""daemon/_loop.py's `quicker_instruments`: the running loop's instruments become a dict that
trio uses as it used its own `Instruments` (hooks added, called, removed, a failing one
dropped), whose `in` is dict's."""

from __future__ import annotations

import trio
import trio.testing

from mcpool.daemon._loop import DictInstruments, quicker_instruments

WAIT = 5.0


class Steps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps = 0
        self.io_waits = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1

    def before_io_wait(self, timeout: float) -> None:
        self.io_waits += 1


class Failing(trio.abc.Instrument):
    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        raise RuntimeError("an instrument's own fault")


def _runner_instruments() -> object:
    from trio._core._run import GLOBAL_RUN_CONTEXT

    return GLOBAL_RUN_CONTEXT.runner.instruments


async def test_the_loop_keeps_calling_the_instruments_it_had_and_those_added_later() -> None:
    before = Steps()
    trio.lowlevel.add_instrument(before)
    quicker_instruments()
    instruments = _runner_instruments()
    assert type(instruments) is DictInstruments
    assert "before_task_step" in instruments  # type: ignore[operator]
    later = Steps()
    trio.lowlevel.add_instrument(later)
    with trio.fail_after(WAIT):
        for _ in range(5):
            await trio.lowlevel.checkpoint()
        await trio.sleep(0.01)  # one pass that waits for I/O
    trio.lowlevel.remove_instrument(before)
    trio.lowlevel.remove_instrument(later)
    assert before.steps >= 5 and later.steps >= 5
    assert later.io_waits >= 1
    assert "before_task_step" not in instruments  # type: ignore[operator]
    steps = later.steps
    await trio.lowlevel.checkpoint()
    assert later.steps == steps  # removed: no longer called


async def test_a_failing_instrument_is_dropped_as_trio_drops_it() -> None:
    quicker_instruments()
    trio.lowlevel.add_instrument(Failing())
    with trio.fail_after(WAIT):
        await trio.lowlevel.checkpoint()
        await trio.lowlevel.checkpoint()
    assert "before_task_step" not in _runner_instruments()  # type: ignore[operator]


async def test_applied_twice_it_changes_nothing_more() -> None:
    quicker_instruments()
    first = _runner_instruments()
    quicker_instruments()
    assert _runner_instruments() is first
