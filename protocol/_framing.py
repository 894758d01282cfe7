"""Newline framing with a size limit (DESIGN P7: one JSON message per line).

A line's size is everything before its b"\\n" (a CRLF line's "\\r" counts). Once the limit is
exceeded the framer is poisoned: the rest of that line would otherwise be read as new messages, so
every later feed() raises the same MessageTooLarge and the caller answers and closes.
"""

from __future__ import annotations

from ._errors import MessageTooLarge

__all__ = ["DEFAULT_MAX_LINE", "LineFramer"]

# Large enough for a big tools/list or an image in a tool result, small enough that one bad peer
# cannot make the daemon buffer without bound.
DEFAULT_MAX_LINE = 16 * 1024 * 1024


class LineFramer:
    __slots__ = ("_buf", "_failed_size", "_max_line")

    def __init__(self, max_line: int = DEFAULT_MAX_LINE) -> None:
        if max_line < 1:
            raise ValueError(f"max_line must be positive, got {max_line}")
        self._max_line = max_line
        # Incomplete tail. A bytearray grows in amortized O(1), so a line that arrives one byte
        # at a time costs O(n), and only new chunks are searched for b"\n".
        self._buf = bytearray()
        self._failed_size: int | None = None

    @property
    def max_line(self) -> int:
        return self._max_line

    def whole_line(self, data: bytes) -> bytes | None:
        """`data` as the one line `feed` would give for it, when nothing is buffered and `data`
        is exactly one whole, non-blank line within the limit and without a CR; None for
        anything else (then `feed` decides). The hot path of every read loop: a relayed call is
        two of these. Read loops call it first and `feed` only on None; `feed` starts with it,
        so the rule is here once (tests/protocol/test_framing.py compares the two). It does not
        check for a framer `feed` has poisoned: once `feed` raised, its reader stops reading."""
        if self._buf or not data or data[-1] != 10:  # b"\n"
            return None
        line = data[:-1]
        # `10 in`, an int: one memchr. A bytes needle (`b"\n" in`) first formats a TypeError for
        # not being an int (~2,000 instructions), and find() parses its arguments (~1,000).
        # isspace() is False for b"", and stops at the first non-blank byte of a message.
        if (
            10 in line
            or len(line) > self._max_line
            or not line
            or line[-1] == 13  # b"\r"
            or line.isspace()
        ):
            return None
        return line

    def is_whole_line(self, data: bytes) -> bool:
        """Whether `whole_line` would give a line for `data`, without copying it: for a line of
        many reads (a long list page) that its reader takes with its newline (0.5 MB not copied
        each relist). A second form of the same rule, kept beside it and compared with `feed` by
        the same test; its `find` costs more than `whole_line`'s `in`, which runs on every call."""
        end = len(data) - 1
        return (
            not self._buf
            and end > 0
            and data[-1] == 10
            and end <= self._max_line
            and data.find(b"\n", 0, end) < 0
            and data[-2] != 13
            and not data.isspace()
        )

    def pending(self) -> int:
        """Bytes of an incomplete line buffered so far."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        """The complete, non-blank lines that `data` finishes, without their line endings."""
        if self._failed_size is not None:
            raise MessageTooLarge(limit=self._max_line, size=self._failed_size)
        line = self.whole_line(data)
        if line is not None:
            return [line]
        buf = self._buf
        end = data.find(b"\n")
        if end < 0:
            buf += data
            if len(buf) > self._max_line:
                self._fail(len(buf))
            return []
        pieces = data.split(b"\n")
        tail = pieces.pop()
        if buf:
            buf += pieces[0]
            pieces[0] = bytes(buf)
            buf.clear()
        limit = self._max_line
        lines: list[bytes] = []
        for line in pieces:
            if len(line) > limit:
                self._fail(len(line))
            if line.endswith(b"\r"):
                line = line[:-1]
            if line and not line.isspace():
                lines.append(line)
        if tail:
            if len(tail) > limit:
                self._fail(len(tail))
            buf += tail
        return lines

    def _fail(self, size: int) -> None:
        self._buf.clear()
        self._failed_size = size
        raise MessageTooLarge(limit=self._max_line, size=size)
