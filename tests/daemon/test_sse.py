"""SSE event ids, priming and resumption decisions (daemon/_sse.py), and what a resumable
stream keeps (daemon/_http.py's Stream and SessionOutbox): pure, no I/O."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing

from mcpool.daemon._http import SessionOutbox, Stream
from mcpool.daemon._sse import (
    HISTORY_BYTES,
    ResumeDecision,
    ResumeKind,
    decide_resume,
    message_event,
    parse_event_id,
    primes,
    priming_event,
)
from mcpool.protocol import decode


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (None, False),
        ("2024-11-05", False),
        ("2025-06-18", False),
        ("2025-11-25", True),
        ("2026-07-28", False),  # the modern era has no resumption
    ],
)
def test_which_clients_are_primed(version: str | None, expected: bool) -> None:
    assert primes(version) is expected


def test_event_ids_round_trip_and_strangers_do_not_parse() -> None:
    assert message_event(3, 7, b"{}").startswith(b"id: 3-7\nevent: message\ndata: {}")
    assert priming_event(3, 5, 250) == b"id: 3-5\nretry: 250\ndata: \n\n"
    assert parse_event_id("3-7") == (3, 7)
    for strange in ("", "3", "3-", "-7", "a-b", "3-7-1", "1" * 19 + "-1", "3-7\nid: 1-1"):
        assert parse_event_id(strange) is None, strange


@pytest.mark.parametrize(
    ("last", "live", "last_get", "expected"),
    [
        (None, frozenset(), None, ResumeDecision(ResumeKind.NEW_GET)),
        ("4-2", frozenset({4}), None, ResumeDecision(ResumeKind.RESUME, 4, 2)),
        ("4-0", frozenset({1, 4}), 1, ResumeDecision(ResumeKind.RESUME, 4, 0)),
        # The session's GET stream ended: a new one is opened (what it would carry waits).
        ("1-9", frozenset({4}), 1, ResumeDecision(ResumeKind.NEW_GET)),
    ],
)
def test_resume_decisions(
    last: str | None, live: frozenset[int], last_get: int | None, expected: ResumeDecision
) -> None:
    assert decide_resume(last, live, last_get) == expected


@pytest.mark.parametrize("last", ["4-2", "x", "1-1"])
def test_what_cannot_be_resumed_is_refused_with_the_id(last: str) -> None:
    decision = decide_resume(last, frozenset({2}), None)
    assert decision.kind is ResumeKind.REFUSE and last in decision.reason


def response(msg_id: int, size: int = 10) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": msg_id, "result": {"x": "y" * size}}).encode()


def take_all(stream: Stream) -> list[bytes]:
    got = []
    while True:
        try:
            chunk = stream.receive.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            return got
        stream.taken(chunk)
        stream.sent(chunk)
        got.append(chunk)


def request(msg_id: int) -> object:
    return decode(b'{"jsonrpc":"2.0","id":%d,"method":"ping"}' % msg_id)


def test_a_resumable_stream_keeps_what_it_handed_out_outside_the_queue() -> None:
    box = SessionOutbox(1 << 20)
    post = Stream(box, kind="post", resumable=True)
    box.open(post, [request(1), request(2)])  # type: ignore[list-item]
    box.write(response(1) + b"\n")
    assert box.buffered > 0
    (first,) = take_all(post)
    # Handed to a connection: no longer waiting (the session sees no pending write), but kept.
    assert box.buffered == 0 and box.history_bytes == len(first)
    assert post.after(0) == [first] and post.after(1) == []
    box.write(response(2) + b"\n")
    second = take_all(post)
    assert post.after(1) == second
    post.close()
    assert box.history_bytes == 0 and box.buffered == 0 and post.number not in box.resumable


def test_history_is_bounded_and_gives_way_to_messages() -> None:
    limit = 3 * HISTORY_BYTES
    box = SessionOutbox(limit)
    get = Stream(box, kind="get", resumable=True)
    box.open_get(get)
    note = b'{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{"p":"%s"}}'
    big = note % (b"z" * 100_000)
    for _ in range(30):  # 3 MB through the stream: its history keeps the newest HISTORY_BYTES
        box.write(big + b"\n")
        take_all(get)
    assert HISTORY_BYTES - len(big) - 200 < get.history_bytes <= HISTORY_BYTES
    assert box.history_bytes == get.history_bytes
    # A second stream's history plus waiting messages would pass the session's bound: the
    # histories go first, and the session is not cut.
    other = Stream(box, kind="post", resumable=True)
    box.open(other, [request(7)])  # type: ignore[list-item]
    for _ in range(7):  # 700 KB waiting on the GET stream, nobody reading: within the bound
        box.write(big + b"\n")  # alone, past it with the history
    assert box.buffered + box.history_bytes <= limit
    assert get.history_bytes < HISTORY_BYTES


class _Touched:
    def __init__(self) -> None:
        self.touches = 0

    def touch(self) -> None:
        self.touches += 1


async def test_a_detached_stream_waits_its_window_then_goes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from mcpool.daemon._http import HttpEndpoint
    from mcpool.daemon._sse import RESUME_WINDOW

    box = SessionOutbox(1 << 20)
    kept, dropped = (
        Stream(box, kind="post", resumable=True),
        Stream(box, kind="post", resumable=True),
    )
    hs = _Touched()
    async with trio.open_nursery() as nursery:
        for stream in (kept, dropped):
            stream.detach()
            nursery.start_soon(HttpEndpoint._expire_detached, None, hs, stream)
        await trio.sleep(RESUME_WINDOW - 1)
        kept.attach(trio.CancelScope())  # resumed in time
        await trio.sleep(2)
        assert dropped.closed and dropped.number not in box.resumable
        assert not kept.closed and kept.number in box.resumable
        # Resumed, then gone again: a window of its own, counted from then.
        kept.detach()
        nursery.start_soon(HttpEndpoint._expire_detached, None, hs, kept)
        await trio.sleep(RESUME_WINDOW - 1)
        assert not kept.closed
        await trio.sleep(2)
        assert kept.closed
