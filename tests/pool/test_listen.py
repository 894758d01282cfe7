"""The modern-era listen stream of a StdioUpstream, driven on a pipe with trio's MockClock: a
stream the server ends is reopened with backoff and what it missed is caught up."""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

import pytest
import trio
import trio.testing
from fakes import stdio
from msgspec import Raw, UnsetType

from mcpool.pool import FdWriter, _eras, identity_of
from mcpool.pool._upstream import (
    LISTEN_REOPEN_MAX,
    LISTEN_STABLE,
    StdioUpstream,
    listen_reopen_delay,
)
from mcpool.protocol import Message


class Sink:
    """The entry's event sink: what the upstream reports."""

    def __init__(self) -> None:
        self.notifications: list[tuple[str, Any]] = []

    def on_notification(self, method: str, params: Raw | UnsetType) -> None:
        decoded = json.loads(bytes(params)) if isinstance(params, Raw) else None
        self.notifications.append((method, decoded))

    def on_server_request(self, upstream: Any, msg: Message) -> None:
        raise AssertionError("no server requests here")


def modern_upstream(w: int, sink: Sink) -> StdioUpstream:
    up = StdioUpstream(
        identity_of("up", stdio()), sink, guardian=None, max_line=1 << 20, handshake_timeout=30
    )
    up.era = _eras.MODERN
    up.protocol_version = "2026-07-28"
    up.server_capabilities = {"tools": {"listChanged": True}, "resources": {"subscribe": True}}
    up.listen_uris = {"note://pad"}
    up._writer = FdWriter(w, 1 << 20)
    return up


def listens_sent(r: int) -> list[str]:
    """Ids of the subscriptions/listen requests written to the server so far."""
    try:
        data = os.read(r, 1 << 20)
    except BlockingIOError:
        return []
    sent = [json.loads(line) for line in data.splitlines()]
    return [m["id"] for m in sent if m.get("method") == "subscriptions/listen"]


async def next_listen(r: int) -> str:
    """The id of the next listen request the upstream sends (exactly one)."""
    with trio.fail_after(LISTEN_REOPEN_MAX + 5):  # virtual time: no backoff is longer
        while not (sent := listens_sent(r)):
            await trio.sleep(0.05)
    (only,) = sent
    return only


def end_stream(up: StdioUpstream, listen_id: str) -> None:
    up._dispatch(json.dumps({"jsonrpc": "2.0", "id": listen_id, "result": {}}).encode())


def test_the_reopen_delay_doubles_up_to_its_cap() -> None:
    assert [listen_reopen_delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert listen_reopen_delay(1000) == LISTEN_REOPEN_MAX


async def test_an_ended_stream_is_reopened_after_the_backoff_and_caught_up(
    pipe: tuple[int, int], autojump_clock: trio.testing.MockClock
) -> None:
    r, w = pipe
    sink = Sink()
    up = modern_upstream(w, sink)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(up._keep_listening)
        first = await next_listen(r)
        end_stream(up, first)
        began = trio.current_time()
        reopened = await next_listen(r)
        assert trio.current_time() - began == pytest.approx(1.0, abs=0.15)
        assert reopened != first
        # What the ended stream could have carried is caught up: a relist, a resource re-read.
        assert sink.notifications == [
            ("notifications/tools/list_changed", None),
            ("notifications/resources/updated", {"uri": "note://pad"}),
        ]
        nursery.cancel_scope.cancel()


async def test_a_server_that_ends_every_stream_is_not_reopened_in_a_loop(
    pipe: tuple[int, int], autojump_clock: trio.testing.MockClock
) -> None:
    r, w = pipe
    up = modern_upstream(w, Sink())
    opened_at: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(up._keep_listening)
        began = trio.current_time()
        while trio.current_time() - began < 120:
            for listen_id in listens_sent(r):
                opened_at.append(trio.current_time() - began)
                end_stream(up, listen_id)  # at once, every time
            await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    gaps = [b - a for a, b in itertools.pairwise(opened_at)]
    assert [round(g) for g in gaps[:6]] == [1, 2, 4, 8, 16, 30]
    assert len(opened_at) <= 9  # 1 + 1 + 2 + 4 + 8 + 16 + 30 + 30 + 30 > 120


async def test_a_stream_that_lived_long_resets_the_backoff(
    pipe: tuple[int, int], autojump_clock: trio.testing.MockClock
) -> None:
    r, w = pipe
    up = modern_upstream(w, Sink())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(up._keep_listening)
        listen_id = await next_listen(r)
        for _ in range(3):  # three streams in a row ended at once: reopened after 1, 2, 4 s
            end_stream(up, listen_id)
            listen_id = await next_listen(r)
        # This one lives long, then ends: the backoff starts again from its first delay (the
        # fourth quick end in a row would have waited 8 s).
        await trio.sleep(LISTEN_STABLE + 1)
        end_stream(up, listen_id)
        began = trio.current_time()
        await next_listen(r)
        assert trio.current_time() - began == pytest.approx(1.0, abs=0.15)
        nursery.cancel_scope.cancel()
