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

    @property
    def buffer(self) -> bytearray:
        """The incomplete tail itself (the same object for the framer's life, emptied and
        filled in place): a read loop that finds it empty and reads one whole line may take
        the line itself, as `feed`'s first branch would, without the call (see the session's
        and the upstream's read loops). Once `feed` has raised, it must not be used."""
        return self._buf

    def pending(self) -> int:
        """Bytes of an incomplete line buffered so far."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        """The complete, non-blank lines that `data` finishes, without their line endings."""
        if self._failed_size is not None:
            raise MessageTooLarge(limit=self._max_line, size=self._failed_size)
        buf = self._buf
        if not buf and data and data[-1] == 10:  # b"\n"
            line = data[:-1]
            # `10 in`, an int: one memchr. A bytes needle (`b"\n" in`) first formats a
            # TypeError for not being an int (~2,000 instructions), and find() parses its
            # arguments (~1,000): this runs twice per relayed call.
            if 10 not in line:
                # The hot path: one whole line in one read (a relayed call is two of these).
                # One copy (the slice), no list of pieces.
                if len(line) > self._max_line:
                    self._fail(len(line))
                if line and line[-1] == 13:  # b"\r"
                    line = line[:-1]
                # isspace() is False for b"", and stops at the first non-blank byte of a message.
                return [line] if line and not line.isspace() else []
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
