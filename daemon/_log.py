"""The daemon's own log: one JSON object per line, filtered by level, rotated by size.

A record is `{"ts": unix time, "level": ..., "msg": ..., **fields}`. The file lives under the XDG
state folder (`_paths.daemon_log_path`); when a write would take it past `max_bytes`, the file
becomes `daemon.log.1` (older ones shift up to `backups`, the oldest is dropped) and a new file
starts. Writing never raises: a full disk or a deleted folder must not take the daemon down, so
a failed write closes the file and the next record tries to reopen it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from ._files import open_private

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
ALIASES = {"warn": "warning", "err": "error"}
DEFAULT_LEVEL = "info"
# 5 MiB x (1 + 3 backups) bounds the log at 20 MiB: weeks of a busy daemon at info level.
DEFAULT_MAX_BYTES = 5 << 20
DEFAULT_BACKUPS = 3


def normalize_level(level: str) -> str:
    """The canonical level name; ValueError names the accepted ones."""
    name = ALIASES.get(level.strip().lower(), level.strip().lower())
    if name not in LEVELS:
        raise ValueError(f"unknown log level {level!r} (use {', '.join(LEVELS)})")
    return name


class _Kept(dict[str, bool]):
    """Whether each level (and alias) is kept; a level callers made up is kept as an error
    is (logged rather than lost)."""

    def __init__(self) -> None:
        super().__init__()
        self.threshold = LEVELS[DEFAULT_LEVEL]

    def set_threshold(self, threshold: int) -> None:
        self.threshold = threshold
        self.update({name: value >= threshold for name, value in LEVELS.items()})
        self.update({alias: LEVELS[name] >= threshold for alias, name in ALIASES.items()})

    def __missing__(self, level: str) -> bool:
        return LEVELS["error"] >= self.threshold


class JsonLinesLog:
    def __init__(
        self,
        path: Path | str | None = None,
        *,
        level: str = DEFAULT_LEVEL,
        max_bytes: int = DEFAULT_MAX_BYTES,
        backups: int = DEFAULT_BACKUPS,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.level = normalize_level(level)
        self._kept = _Kept()
        self._kept.set_threshold(LEVELS[self.level])
        # `enabled(level)`: whether a record of `level` is kept. The table's own lookup, no
        # Python frame: every session asks it once per change of its lists (issue 17).
        self.enabled = self._kept.__getitem__
        self.max_bytes = max_bytes
        self.backups = backups
        self._fd: int | None = None  # written with os.write: one system call a write
        self._size = 0

    def set_level(self, level: str) -> None:
        self.level = normalize_level(level)
        self._kept.set_threshold(LEVELS[self.level])  # (in place: `enabled` stays bound to it)

    def record(self, level: str, message: str, **fields: Any) -> str | None:
        """Format and write one record; the line written, or None when filtered out."""
        if not self.enabled(level):
            return None
        record = {"ts": round(time.time(), 3), "level": level, "msg": message, **fields}
        line = json.dumps(record, default=str)
        self.write_line(line)
        return line

    def write_line(self, line: str) -> None:
        self.write_bytes(line.encode() + b"\n")

    def write_bytes(self, data: bytes) -> None:
        """Append `data` (whole lines), rotating first when it would pass max_bytes."""
        if self.path is None:
            return
        try:
            if self._fd is None:
                self._open()
            if self._size and self._size + len(data) > self.max_bytes:
                self._rotate()
            assert self._fd is not None
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            self._size += len(data)
        except OSError:
            self.close()

    def _open(self) -> None:
        assert self.path is not None
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # 0600 from the start (records can quote settings values); rotation renames it, so
        # daemon.log.N keep the mode.
        self._fd = open_private(self.path, os.O_WRONLY | os.O_APPEND)
        self._size = os.fstat(self._fd).st_size

    def _rotate(self) -> None:
        assert self.path is not None
        self.close()
        if self.backups > 0:
            for n in range(self.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{n}")
                if older.exists():
                    older.replace(self.path.with_name(f"{self.path.name}.{n + 1}"))
            self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink(missing_ok=True)
        self._open()

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
            self._size = 0
