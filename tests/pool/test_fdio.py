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
