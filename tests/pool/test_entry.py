"""Pool entry states, transitions and drain timing (DESIGN L2, L3; pool/_entry.py)."""

from __future__ import annotations

import random

import pytest
from fakes import entry_with

from mcpool.pool import (
    TERMINAL_STATES,
    EntryEvent,
    EntryState,
    Snapshot,
    backoff_delay,
    close_deadline,
    is_crash_loop,
    next_idle_since,
    transition,
)
from mcpool.pool._entry import TRANSITIONS

S, E = EntryState, EntryEvent


# -- the transition table ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "event", "leases", "expected"),
    [
        (S.SPAWNING, E.READY, 1, S.ACTIVE),
        (S.SPAWNING, E.READY, 0, S.DRAINING),
        (S.RESTARTING, E.READY, 2, S.ACTIVE),
        (S.RESTARTING, E.READY, 0, S.DRAINING),
        (S.ACTIVE, E.IDLE, 0, S.DRAINING),
        (S.DRAINING, E.LEASED, 1, S.ACTIVE),
        (S.SPAWNING, E.CRASHED, 1, S.RESTARTING),
        (S.ACTIVE, E.CRASHED, 1, S.RESTARTING),
        (S.DRAINING, E.CRASHED, 0, S.RESTARTING),
        (S.RESTARTING, E.CRASHED, 1, S.RESTARTING),
        (S.SPAWNING, E.CRASH_LOOP, 1, S.CRASH_LOOP),
        (S.RESTARTING, E.CRASH_LOOP, 1, S.CRASH_LOOP),
        (S.ACTIVE, E.CRASH_LOOP, 1, S.CRASH_LOOP),
        (S.DRAINING, E.CRASH_LOOP, 0, S.CRASH_LOOP),
        (S.CRASH_LOOP, E.RESTART, 1, S.RESTARTING),
        (S.ACTIVE, E.RESTART, 1, S.RESTARTING),
        (S.DRAINING, E.RESTART, 0, S.RESTARTING),
        (S.SPAWNING, E.GIVE_UP, 1, S.FAILED),
        (S.RESTARTING, E.GIVE_UP, 1, S.FAILED),
    ],
)
def test_listed_transitions(state: S, event: E, leases: int, expected: S) -> None:
    assert transition(state, event, leases=leases) is expected


@pytest.mark.parametrize("state", [s for s in EntryState if s not in TERMINAL_STATES])
def test_close_from_every_live_state_is_closed(state: S) -> None:
    assert transition(state, E.CLOSE, leases=1) is S.CLOSED


@pytest.mark.parametrize("state", sorted(TERMINAL_STATES, key=lambda s: s.value))
@pytest.mark.parametrize("event", list(EntryEvent))
def test_terminal_states_never_leave(state: S, event: E) -> None:
    assert transition(state, event, leases=1) is state


def test_unlisted_pairs_are_no_ops_not_errors() -> None:
    for state in EntryState:
        for event in EntryEvent:
            if (state, event) not in TRANSITIONS:
                assert transition(state, event, leases=1) is state, (state, event)


def test_leased_while_spawning_stays_spawning() -> None:
    assert transition(S.SPAWNING, E.LEASED, leases=1) is S.SPAWNING


def test_idle_while_spawning_stays_spawning_and_ready_then_settles_on_draining() -> None:
    state = transition(S.SPAWNING, E.IDLE, leases=0)
    assert state is S.SPAWNING
    assert transition(state, E.READY, leases=0) is S.DRAINING


def test_terminal_states_are_closed_and_failed() -> None:
    assert frozenset({S.CLOSED, S.FAILED}) == TERMINAL_STATES


def test_entry_fire_uses_its_lease_count() -> None:
    entry = entry_with("fs")
    assert entry.state is S.SPAWNING
    entry.fire(E.READY)
    assert entry.state is S.DRAINING  # no leases yet
    entry.fire(E.LEASED)
    assert entry.state is S.ACTIVE


# -- drain timing (L2) ---------------------------------------------------------------------------


def test_close_deadline_is_drain_grace_after_the_first_idle_moment() -> None:
    assert close_deadline(now=100.0, idle_since=100.0, drain_grace=30.0, max_idle=300.0) == 130.0


def test_close_deadline_is_capped_by_max_idle_from_the_first_idle_moment() -> None:
    assert close_deadline(now=290.0, idle_since=0.0, drain_grace=30.0, max_idle=300.0) == 300.0
    assert close_deadline(now=200.0, idle_since=0.0, drain_grace=30.0, max_idle=300.0) == 230.0


def test_first_idle_moment_starts_the_stretch() -> None:
    assert next_idle_since(now=5.0, idle_since=None, leased_since=1.0, drain_grace=30.0) == 5.0


def test_short_leases_do_not_reset_the_idle_stretch() -> None:
    assert next_idle_since(now=50.0, idle_since=10.0, leased_since=49.0, drain_grace=30.0) == 10.0
    assert next_idle_since(now=50.0, idle_since=10.0, leased_since=20.1, drain_grace=30.0) == 10.0


def test_a_lease_as_long_as_the_grace_starts_a_new_stretch() -> None:
    assert next_idle_since(now=50.0, idle_since=10.0, leased_since=20.0, drain_grace=30.0) == 50.0


def test_flapping_never_moves_the_cap() -> None:
    idle_since: float | None = None
    deadlines = []
    for t in range(0, 600, 10):
        idle_since = next_idle_since(
            now=float(t), idle_since=idle_since, leased_since=t - 1.0, drain_grace=30.0
        )
        deadlines.append(
            close_deadline(now=float(t), idle_since=idle_since, drain_grace=30.0, max_idle=300.0)
        )
    assert idle_since == 0.0
    assert max(deadlines) == 300.0


# -- backoff and crash loops (L3) -----------------------------------------------------------------


class _FixedRandom(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


def test_backoff_doubles_from_initial_with_the_jitter_range_ends() -> None:
    low, high = _FixedRandom(0.0), _FixedRandom(1.0)
    assert [backoff_delay(n, initial=1.0, maximum=30.0, rng=high) for n in range(1, 6)] == [
        1.0,
        2.0,
        4.0,
        8.0,
        16.0,
    ]
    assert [backoff_delay(n, initial=1.0, maximum=30.0, rng=low) for n in range(1, 6)] == [
        0.5,
        1.0,
        2.0,
        4.0,
        8.0,
    ]


def test_backoff_is_capped_at_maximum() -> None:
    high = _FixedRandom(1.0)
    assert backoff_delay(6, initial=1.0, maximum=30.0, rng=high) == 30.0
    assert backoff_delay(60, initial=1.0, maximum=30.0, rng=high) == 30.0


def test_backoff_with_zero_failures_is_the_initial_delay() -> None:
    assert backoff_delay(0, initial=2.0, maximum=30.0, rng=_FixedRandom(1.0)) == 2.0


def test_backoff_jitter_stays_within_half_to_full_base() -> None:
    rng = random.Random(7)
    for n in range(1, 10):
        base = min(30.0, 2 ** (n - 1))
        samples = [backoff_delay(n, initial=1.0, maximum=30.0, rng=rng) for _ in range(200)]
        assert all(base / 2 <= s <= base for s in samples)
        assert max(samples) - min(samples) > base / 10  # there is jitter


def test_crash_loop_after_five_failures_within_two_minutes() -> None:
    failures = [0.0, 10.0, 20.0, 30.0, 40.0]
    assert is_crash_loop(failures, now=40.0, window=120.0, limit=5)
    assert not is_crash_loop(failures[:4], now=40.0, window=120.0, limit=5)


def test_failures_older_than_the_window_do_not_count() -> None:
    failures = [0.0, 100.0, 110.0, 115.0, 121.0]
    assert not is_crash_loop(failures, now=121.0, window=120.0, limit=5)
    assert is_crash_loop([1.0, *failures[1:]], now=121.0, window=120.0, limit=5)


# -- snapshots (S1) ------------------------------------------------------------------------------


def test_snapshots_are_frozen() -> None:
    snap = Snapshot(generation=1)
    with pytest.raises(AttributeError):
        snap.generation = 2  # type: ignore[misc]


def test_publish_swaps_one_reference_and_tells_every_listener() -> None:
    entry = entry_with("fs")
    seen: list[int] = []

    class Listener:
        def snapshot_changed(self, e: object) -> None:
            seen.append(entry.snapshot.generation)

    from mcpool.pool import Handle

    for i in range(3):
        entry.handles[i] = Handle(entry, f"s{i}", entry.identity, entry.settings, Listener())  # type: ignore[arg-type]
    old = entry.snapshot
    new = Snapshot(generation=old.generation + 1, available=True)
    entry.publish(new)
    assert entry.snapshot is new
    assert old.generation == 1
    assert seen == [2, 2, 2]
