"""An upstream's stdout read several chunks per wake-up (`READS_PER_WAKE`), and a server that
sends large messages given a larger pipe (`BIG_PIPE`): every message still arrives whole, in
order, however the writes split them."""

from __future__ import annotations

import fcntl
import json
import os
from typing import Any

import trio
from fakes import stdio
from msgspec import Raw, UnsetType

from mcpool.pool import identity_of
from mcpool.pool._upstream import BIG_MESSAGE, BIG_PIPE, StdioUpstream
from mcpool.protocol import Message

STEP_TIMEOUT = 10.0  # local pipe traffic of a few MB: only turns a hang into a failure


class Sink:
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def on_notification(self, method: str, params: Raw | UnsetType) -> None:
        self.seen.append(json.loads(bytes(params)) if isinstance(params, Raw) else None)

    def on_server_request(self, upstream: Any, msg: Message) -> None:
        raise AssertionError("no server requests here")


def note(n: int, size: int) -> bytes:
    message = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"n": n}}
    message["params"]["pad"] = "x" * size
    return json.dumps(message).encode() + b"\n"


async def test_large_and_small_messages_arrive_whole_and_in_order() -> None:
    sink = Sink()
    up = StdioUpstream(
        identity_of("up", stdio()), sink, guardian=None, max_line=8 << 20, handshake_timeout=30
    )
    r, w = os.pipe()
    os.set_blocking(r, False)
    sizes = [10, 700_000, 5, 3, 1_500_000, 200_000, 1]
    data = b"".join(note(n, size) for n, size in enumerate(sizes))

    def write_all() -> None:
        view = memoryview(data)
        for at in range(0, len(data), 100_003):  # writes that split messages anywhere
            os.write(w, view[at : at + 100_003])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(up._read_stdout, r)
        with trio.fail_after(STEP_TIMEOUT):
            await trio.to_thread.run_sync(write_all)
            while len(sink.seen) < len(sizes):
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert [m["n"] for m in sink.seen] == list(range(len(sizes)))
    assert [len(m["pad"]) for m in sink.seen] == sizes
    assert max(sizes) > BIG_MESSAGE
    get_size = getattr(fcntl, "F_GETPIPE_SZ", None)
    if get_size is not None:  # Linux: a server that sent large messages has the larger pipe
        assert fcntl.fcntl(w, get_size) >= BIG_PIPE
    os.close(r)
    os.close(w)


async def test_messages_read_with_the_end_of_stdout_all_arrive_before_it_is_closed() -> None:
    """A server that writes large and small messages and exits: the chunks read in the pass
    that also reads the end of its stdout are framed and dispatched before the end is."""
    sink = Sink()
    up = StdioUpstream(
        identity_of("up", stdio()), sink, guardian=None, max_line=8 << 20, handshake_timeout=30
    )
    up._exited.set()  # (its exit status is known: the end is not waited on)
    r, w = os.pipe()
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None)
    if set_size is not None:
        fcntl.fcntl(w, set_size, BIG_PIPE)  # all of it in the pipe before the first read
    os.set_blocking(r, False)
    sizes = [5, 300_000, 2, 200_000, 7] if set_size is not None else [5, 2, 7]
    # Whole chunks only, so the read after the last one is the end, in the same pass.
    sizes[-1] += -len(b"".join(note(n, size) for n, size in enumerate(sizes))) % 65536
    data = b"".join(note(n, size) for n, size in enumerate(sizes))
    assert len(data) % 65536 == 0
    view = memoryview(data)
    for at in range(0, len(data), 65536):
        os.write(w, view[at : at + 65536])
    os.close(w)
    with trio.fail_after(STEP_TIMEOUT):
        await up._read_stdout(r)
    assert [len(m["pad"]) for m in sink.seen] == sizes
    assert up.closed_reason == "closed its stdout"
    os.close(r)


async def test_a_long_line_read_whole_in_one_pass_arrives_as_any_other() -> None:
    """A long message that is alone in its pass (a list page) is dispatched without being
    copied; one ending in CR LF, one after a partial line, and a short one still go the
    framer's way. Each arrives whole and in order."""
    sink = Sink()
    up = StdioUpstream(
        identity_of("up", stdio()), sink, guardian=None, max_line=8 << 20, handshake_timeout=30
    )
    r, w = os.pipe()
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None)
    if set_size is not None:
        fcntl.fcntl(w, set_size, BIG_PIPE)
    os.set_blocking(r, False)
    big, crlf = note(0, 300_000), note(1, 200_000)[:-1] + b"\r\n"
    head, tail = note(2, 250_000)[:1000], note(2, 250_000)[1000:]
    writes = [big, crlf, head, tail, note(3, 5), big.replace(b'"n": 0', b'"n": 4')]
    seen_after = [1, 2, 2, 3, 4, 5]  # a partial line is told only with its end
    async with trio.open_nursery() as nursery:
        nursery.start_soon(up._read_stdout, r)
        with trio.fail_after(STEP_TIMEOUT):
            for data, count in zip(writes, seen_after, strict=True):
                await trio.to_thread.run_sync(os.write, w, data)
                while len(sink.seen) < count:
                    await trio.sleep(0.01)
                await trio.sleep(0.05)  # (nothing more arrives from this write)
                assert len(sink.seen) == count
        nursery.cancel_scope.cancel()
    assert [m["n"] for m in sink.seen] == [0, 1, 2, 3, 4]
    assert [len(m["pad"]) for m in sink.seen] == [300_000, 200_000, 250_000, 5, 300_000]
    os.close(r)
    os.close(w)
