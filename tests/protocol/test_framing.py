from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcpool.protocol import DEFAULT_MAX_LINE, MESSAGE_TOO_LARGE, LineFramer, MessageTooLarge


def test_default_limit() -> None:
    assert LineFramer().max_line == DEFAULT_MAX_LINE == 16 * 1024 * 1024


def test_complete_lines_in_one_chunk() -> None:
    framer = LineFramer(100)
    assert framer.feed(b'{"a":1}\n{"b":2}\n') == [b'{"a":1}', b'{"b":2}']
    assert framer.pending() == 0


def test_no_newline_buffers() -> None:
    framer = LineFramer(100)
    assert framer.feed(b'{"a"') == []
    assert framer.pending() == 4
    assert framer.feed(b":1}") == []
    assert framer.feed(b"\n") == [b'{"a":1}']
    assert framer.pending() == 0


def test_line_split_across_chunks() -> None:
    framer = LineFramer(100)
    assert framer.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    assert framer.pending() == 4
    assert framer.feed(b':2}\n{"c":3}\n{') == [b'{"b":2}', b'{"c":3}']
    assert framer.pending() == 1


def test_crlf_is_stripped() -> None:
    framer = LineFramer(100)
    assert framer.feed(b"one\r\ntwo\r") == [b"one"]
    assert framer.feed(b"\nthree\n") == [b"two", b"three"]


def test_only_a_trailing_cr_is_stripped() -> None:
    framer = LineFramer(100)
    assert framer.feed(b"a\rb\r\r\n") == [b"a\rb\r"]


def test_blank_and_whitespace_lines_are_skipped() -> None:
    framer = LineFramer(100)
    assert framer.feed(b"\n\n \t\n\r\n x \n") == [b" x "]
    assert framer.feed(b"  ") == []
    assert framer.feed(b"\n") == []
    assert framer.pending() == 0


def test_many_one_byte_chunks() -> None:
    framer = LineFramer(1 << 20)
    payload = b'{"jsonrpc":"2.0","method":"x","params":{"p":"' + b"y" * 100_000 + b'"}}'
    out: list[bytes] = []
    for i in range(len(payload)):
        out += framer.feed(payload[i : i + 1])
    assert out == []
    assert framer.pending() == len(payload)
    assert framer.feed(b"\n") == [payload]


def test_line_at_exactly_the_limit_is_accepted() -> None:
    framer = LineFramer(5)
    assert framer.feed(b"12345\n") == [b"12345"]
    assert framer.feed(b"123") == []
    assert framer.feed(b"45") == []
    assert framer.feed(b"\n") == [b"12345"]


def test_oversize_complete_line() -> None:
    framer = LineFramer(5)
    with pytest.raises(MessageTooLarge) as info:
        framer.feed(b"ok\n123456\nlater\n")
    assert info.value.code == MESSAGE_TOO_LARGE
    assert info.value.data == {"reason": info.value.data["reason"], "limit": 5, "size": 6}


def test_oversize_tail_raises_before_the_newline_arrives() -> None:
    framer = LineFramer(5)
    assert framer.feed(b"1234") == []
    with pytest.raises(MessageTooLarge):
        framer.feed(b"56")
    assert framer.pending() == 0


def test_oversize_tail_after_complete_lines() -> None:
    framer = LineFramer(5)
    with pytest.raises(MessageTooLarge):
        framer.feed(b"ok\n123456")


def test_oversize_across_chunks_of_a_complete_line() -> None:
    framer = LineFramer(5)
    assert framer.feed(b"123") == []
    with pytest.raises(MessageTooLarge):
        framer.feed(b"456\n")


def test_framer_stays_failed() -> None:
    # The rest of an oversized line must never be read as new messages.
    framer = LineFramer(5)
    with pytest.raises(MessageTooLarge):
        framer.feed(b"123456")
    with pytest.raises(MessageTooLarge):
        framer.feed(b'789\n{"ok":1}\n')


def test_invalid_limit() -> None:
    with pytest.raises(ValueError, match="max_line"):
        LineFramer(0)


@given(st.lists(st.binary(max_size=40), max_size=30), st.integers(min_value=1, max_value=32))
def test_framer_never_raises_other_errors_nor_overbuffers(chunks: list[bytes], limit: int) -> None:
    framer = LineFramer(limit)
    for chunk in chunks:
        try:
            lines = framer.feed(chunk)
        except MessageTooLarge:
            return
        assert framer.pending() <= limit
        for line in lines:
            assert len(line) <= limit
            assert b"\n" not in line
            assert line.strip()


@given(st.lists(st.binary(max_size=20), max_size=20), st.data())
def test_framing_is_independent_of_chunking(lines: list[bytes], data: st.DataObject) -> None:
    lines = [line.replace(b"\n", b"") for line in lines]
    stream = b"".join(line + b"\n" for line in lines)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    framer = LineFramer(1000)
    out: list[bytes] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        out += framer.feed(stream[start:cut])
        start = cut
    expected = [line[:-1] if line.endswith(b"\r") else line for line in lines]
    assert out == [line for line in expected if line.strip()]
    assert framer.pending() == 0


# -- one whole line per read: the relay's hot path (a read that ends at its only newline) -----


@pytest.mark.parametrize(
    ("chunk", "lines"),
    [
        (b'{"a":1}\n', [b'{"a":1}']),
        (b'{"a":1}\r\n', [b'{"a":1}']),  # CRLF: the "\r" goes too
        (b"a\r\r\n", [b"a\r"]),  # only the one "\r" before the "\n"
        (b"\n", []),  # an empty line
        (b"\r\n", []),  # an empty CRLF line
        (b" \t \n", []),  # a blank line
        (b"\r", []),  # no newline yet: buffered
    ],
)
def test_a_single_whole_line(chunk: bytes, lines: list[bytes]) -> None:
    framer = LineFramer(100)
    assert framer.feed(chunk) == lines
    assert framer.pending() == (0 if chunk.endswith(b"\n") else len(chunk))


def test_a_whole_line_after_a_buffered_part_joins_it() -> None:
    framer = LineFramer(100)
    assert framer.feed(b'{"a"') == []
    assert framer.feed(b":1}\r\n") == [b'{"a":1}']
    assert framer.feed(b'{"b":2}\n') == [b'{"b":2}']  # nothing left over from the first line
    assert framer.pending() == 0


def test_a_cr_split_from_its_lf_is_stripped() -> None:
    framer = LineFramer(100)
    assert framer.feed(b"x\r") == []
    assert framer.feed(b"\n") == [b"x"]


def test_a_huge_single_line_over_the_limit_fails_and_poisons() -> None:
    framer = LineFramer(1000)
    with pytest.raises(MessageTooLarge) as info:
        framer.feed(b"x" * 1001 + b"\n")
    assert info.value.data["size"] == 1001
    assert framer.pending() == 0
    with pytest.raises(MessageTooLarge):
        framer.feed(b'{"ok":1}\n')


def test_a_single_crlf_line_counts_its_cr() -> None:
    # A line's size is everything before its "\n", the "\r" of a CRLF included.
    assert LineFramer(5).feed(b"1234\r\n") == [b"1234"]
    with pytest.raises(MessageTooLarge) as info:
        LineFramer(5).feed(b"12345\r\n")
    assert info.value.data["size"] == 6


def test_a_huge_line_within_the_limit_in_one_read() -> None:
    payload = b'{"p":"' + b"y" * (1 << 20) + b'"}'
    assert LineFramer(2 << 20).feed(payload + b"\n") == [payload]


def test_lines_are_bytes() -> None:
    # Callers keep lines (a batch's pending lines, an error's excerpt): never a view of a buffer
    # the framer reuses.
    framer = LineFramer(100)
    for chunk in (b"one\n", b"tw", b"o\nthree\nfo", b"ur\n"):
        for line in framer.feed(chunk):
            assert type(line) is bytes


# -- the read loops' fast path equals `feed` (issue 27 item 3) ------------------------------------


@given(
    st.binary(max_size=12),
    st.lists(
        st.sampled_from([b"a", b" ", b"\t", b"\r", b"\n", b"{", b"\xff"]), min_size=0, max_size=12
    ),
    st.integers(min_value=1, max_value=8),
)
def test_whole_line_is_what_feed_gives(prefix: bytes, parts: list[bytes], limit: int) -> None:
    """A read loop takes `whole_line(data)` when it is not None and calls `feed` otherwise; for
    every framer state (something buffered or not) and chunk, that is exactly what `feed` alone
    gives, and `is_whole_line` says the same as `whole_line`."""
    data = b"".join(parts)
    fast, slow = LineFramer(limit), LineFramer(limit)
    for framer in (fast, slow):
        try:
            framer.feed(prefix.replace(b"\n", b""))  # leaves an incomplete tail, or none
        except MessageTooLarge:
            return
    one = fast.whole_line(data)
    assert fast.is_whole_line(data) == (one is not None)
    try:
        expected: list[bytes] | None = slow.feed(data)
    except MessageTooLarge:
        expected = None
    if one is not None:
        assert expected == [one]
        assert fast.pending() == slow.pending() == 0
    else:
        try:
            got: list[bytes] | None = fast.feed(data)
        except MessageTooLarge:
            got = None
        assert got == expected
