"""The restart decision after an entry's connection fails (pool/_pool.py `after_failure`), as a
table: give up, wait for a login, rest for the crash-loop cooldown, or back off."""

from __future__ import annotations

import math
import random

import pytest

from mcpool.pool import EntryEvent, PoolOptions, backoff_delay
from mcpool.pool._pool import after_failure

E = EntryEvent
OPTIONS = PoolOptions(
    backoff_initial=1.0,
    backoff_max=30.0,
    crash_loop_failures=3,
    crash_loop_window=60.0,
    crash_loop_cooldown=300.0,
)
NOW = 1000.0


def decide(**facts: object) -> tuple[EntryEvent, int, bool, float]:
    given: dict[str, object] = {
        "now": NOW,
        "failures": [],
        "up_since": None,
        "crash_looped": False,
        "cannot_start": False,
        "needs_login": False,
        "stdio": True,
        **facts,
    }
    out = after_failure(options=OPTIONS, rng=random.Random(7), **given)  # type: ignore[arg-type]
    return out.event, len(out.failures), out.crash_looped, out.rest


FIRST_BACKOFF = backoff_delay(1, initial=1.0, maximum=30.0, rng=random.Random(7))
SECOND_BACKOFF = backoff_delay(2, initial=1.0, maximum=30.0, rng=random.Random(7))
THIRD_BACKOFF = backoff_delay(3, initial=1.0, maximum=30.0, rng=random.Random(7))


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        # a first crash of a local server: backed off
        ({}, (E.CRASHED, 1, False, FIRST_BACKOFF)),
        # no retry fixes it (bad command): given up, until a restart is asked for
        ({"cannot_start": True}, (E.GIVE_UP, 1, False, math.inf)),
        # cannot_start wins over a login need
        ({"cannot_start": True, "needs_login": True}, (E.GIVE_UP, 1, False, math.inf)),
        # OAuth wants the user: no retry until the login restarts it
        ({"needs_login": True, "stdio": False}, (E.NEEDS_LOGIN, 1, False, math.inf)),
        # the third failure in the window: a crash loop, resting for the cooldown
        ({"failures": [NOW - 20, NOW - 10]}, (E.CRASH_LOOP, 3, True, 300.0)),
        # old failures leave the window: only the recent one and this one count
        ({"failures": [NOW - 100, NOW - 10]}, (E.CRASHED, 2, False, SECOND_BACKOFF)),
        # a remote server never crash-loops: it is waited for at the backoff
        (
            {"failures": [NOW - 20, NOW - 10], "stdio": False},
            (E.CRASHED, 3, False, THIRD_BACKOFF),
        ),
        # crash-looped before and failed again after its retry: straight back to the cooldown
        ({"crash_looped": True}, (E.CRASH_LOOP, 1, True, 300.0)),
        # it stayed up longer than the window: its history is cleared
        (
            {"crash_looped": True, "failures": [NOW - 200, NOW - 190], "up_since": NOW - 120},
            (E.CRASHED, 1, False, FIRST_BACKOFF),
        ),
        # up only briefly: the history stays
        (
            {"failures": [NOW - 30, NOW - 20], "up_since": NOW - 5},
            (E.CRASH_LOOP, 3, True, 300.0),
        ),
    ],
)
def test_after_failure(
    facts: dict[str, object], expected: tuple[EntryEvent, int, bool, float]
) -> None:
    event, count, looped, rest = decide(**facts)
    assert (event, count, looped) == expected[:3]
    assert rest == pytest.approx(expected[3])


def test_the_rng_is_drawn_from_for_a_backoff_only() -> None:
    """A crash loop or a give-up draws nothing, so the backoffs that follow are the same."""
    rng = random.Random(3)
    after_failure(
        now=NOW,
        failures=[NOW - 2, NOW - 1],
        up_since=None,
        crash_looped=False,
        cannot_start=False,
        needs_login=False,
        stdio=True,
        options=OPTIONS,
        rng=rng,
    )
    assert rng.random() == random.Random(3).random()
