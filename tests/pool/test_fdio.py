"""FdWriter and read_some on real pipes: direct writes, queueing, draining, limits, closing."""

from __future__ import annotations

import fcntl
import os

import pytest
import trio

from mcpool.pool import FdWriter, WriterClosed, read_some

WAIT = 5.0  # every wait below is local pipe I/O: milliseconds when it works


def pipe_capacity(w: int) -> int:
    return fcntl.fcntl(w, fcntl.F_GETPIPE_SZ)


async def test_a_write_that_fits_goes_out_at_once_without_a_task(pipe: tuple[int, int]) -> None:
    r, w = pipe
    spawned: list[object] = []
    writer = FdWriter(w, 1 << 20, spawn=spawned.append)
    writer.write(b"hello\n")
    assert os.read(r, 100) == b"hello\n"
    assert spawned == [] and writer.buffered == 0


async def test_what_the_pipe_refuses_is_queued_and_drained_in_order(pipe: tuple[int, int]) -> None:
    r, w = pipe
    size = pipe_capacity(w)
    async with trio.open_nursery() as nursery:
        writer = FdWriter(w, 4 * size, spawn=nursery.start_soon)
        first, second = b"a" * (size + 100), b"b" * 300
        writer.write(first)
        writer.write(second)
        assert writer.buffered == 400  # 100 of the first, all of the second
        received = bytearray()
        with trio.fail_after(WAIT):
            while len(received) < len(first) + len(second):
                received += await read_some(r)
            await writer.wait_drained()
    assert bytes(received) == first + second


async def test_parts_go_out_as_their_join_would_in_order_whatever_the_pipe_takes(
    pipe: tuple[int, int],
) -> None:
    """`write_parts` writes what `write(b"".join(parts))` would: at once when it fits, the
    rest queued from the very byte the kernel stopped at (inside any part), after whatever was
    queued before, and before whatever is written after."""
    r, w = pipe
    size = pipe_capacity(w)
    async with trio.open_nursery() as nursery:
        writer = FdWriter(w, 8 * size, spawn=nursery.start_soon)
        writer.write_parts((b"{", b"fits", b"}\n"))
        assert os.read(r, 100) == b"{fits}\n" and writer.buffered == 0
        # The kernel stops inside the middle part: its rest and the tail are queued.
        head, body, tail = b"<" * 10, b"m" * (size + 50), b">" * 20
        writer.write_parts((head, body, tail))
        assert writer.buffered == 10 + 50 + 20
        writer.write_parts((b"after", b"wards"))  # behind the queue, not around it
        writer.write(b"last")
        received = bytearray()
        expected = head + body + tail + b"afterwards" + b"last"
        with trio.fail_after(WAIT):
            while len(received) < len(expected):
                received += await read_some(r)
            await writer.wait_drained()
    assert bytes(received) == expected
    writer.close()
    with pytest.raises(WriterClosed):
        writer.write_parts((b"x",))


async def test_a_peer_that_stops_reading_fails_the_writer_at_its_limit(
    pipe: tuple[int, int],
) -> None:
    _r, w = pipe
    size = pipe_capacity(w)
    writer = FdWriter(w, 1000, spawn=lambda _fn: None)
    writer.write(b"x" * size)  # fills the pipe
    writer.write(b"y" * 1000)  # exactly the limit: queued
    with pytest.raises(WriterClosed, match="buffer full"):
        writer.write(b"z")
    assert writer.closed and writer.buffered == 0
    with pytest.raises(WriterClosed):
        writer.write(b"later")


async def test_closing_the_fd_under_a_waiting_drain_ends_it_quietly(
    pipe: tuple[int, int],
) -> None:
    _r, w = pipe
    size = pipe_capacity(w)
    async with trio.open_nursery() as nursery:
        writer = FdWriter(w, 4 * size, spawn=nursery.start_soon)
        writer.write(b"x" * (size + 10))
        await trio.testing.wait_all_tasks_blocked()
        # What the daemon does when a handed-off client stopped reading: close under the drain.
        trio.lowlevel.notify_closing(w)
        with trio.fail_after(WAIT):
            await writer.wait_drained()
    assert writer.closed and writer.error == "closed with unsent data"


async def test_a_closed_reader_is_an_epipe_failure_not_an_exception_elsewhere(
    pipe: tuple[int, int],
) -> None:
    r, w = pipe
    os.close(r)
    writer = FdWriter(w, 1000)
    with pytest.raises(WriterClosed, match="write failed"):
        writer.write(b"x")
    assert writer.peer_gone  # the reader left: not a failure of ours


async def test_read_some_returns_data_then_end_of_file(pipe: tuple[int, int]) -> None:
    r, w = pipe
    os.write(w, b"abc")
    with trio.fail_after(WAIT):
        assert await read_some(r) == b"abc"
    os.close(w)
    with trio.fail_after(WAIT):
        assert await read_some(r) == b""


async def test_a_lossy_write_is_dropped_past_its_bound_never_failing_the_writer(
    pipe: tuple[int, int],
) -> None:
    """X8: a log flood to a peer that is behind is shed at the lossy bound (a quarter of the
    limit by default), long before the answers behind it would close the writer; what fits
    goes out in order with the rest."""
    r, w = pipe
    size = pipe_capacity(w)
    writer = FdWriter(w, 4000, spawn=lambda _fn: None)
    assert writer.lossy_buffer == 1000
    assert writer.write_lossy(b"l" * 10)  # nothing queued: straight out
    assert os.read(r, 100) == b"l" * 10
    writer.write(b"x" * size)  # fills the pipe
    assert writer.buffered == 0
    assert writer.write_lossy(b"a" * 600)  # queued: within the bound
    assert not writer.write_lossy(b"b" * 600)  # 1,200 would be queued: dropped
    assert writer.buffered == 600 and not writer.closed
    writer.write(b"y" * 3400)  # an answer still has the rest of the limit
    assert writer.buffered == 4000 and not writer.closed
    for _ in range(100):
        assert not writer.write_lossy(b"c")  # never raises, never closes
    assert not writer.closed
    assert os.read(r, size) == b"x" * size
    writer._flush()
    received = b""
    while len(received) < 4000:
        received += os.read(r, 8192)
    assert received == b"a" * 600 + b"y" * 3400


async def test_a_lossy_write_larger_than_its_bound_or_to_a_gone_peer_is_dropped(
    pipe: tuple[int, int],
) -> None:
    r, w = pipe
    writer = FdWriter(w, 4000, lossy_buffer=100, spawn=lambda _fn: None)
    assert not writer.write_lossy(b"x" * 101)  # could not be queued if the kernel refused it
    assert writer.write_lossy(b"x" * 100)
    os.close(r)
    assert not writer.write_lossy(b"x")  # EPIPE: dropped, and the writer knows the peer left
    assert writer.closed and writer.peer_gone
    assert not writer.write_lossy(b"x")
