"""The sessions attached to the daemon: what the daemon knows of each (`SessionRecord`), by id.

Plain data: `Sessions` (daemon/_sessions.py) adds and removes records as sessions open and
close; the settings host, the admin API and `explain` read them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import trio

from mcpool.pool import ServerSettings
from mcpool.protocol import INVALID_PARAMS, McpoolError
from mcpool.session import Session


class SessionRecord:
    """Daemon-side facts about one session: its settings sources and runtime overrides."""

    def __init__(
        self, session: Session, sources: list[str], via: str, env: dict[str, str] | None = None
    ) -> None:
        self.session = session
        self.sources = sources
        # The values of the variables its settings reference, as its bridge sent them; None:
        # no bridge (raw socket, HTTP), which expands from the daemon's base environment.
        self.env = env
        # Entries desired_for refused (unset variable, self-launch, bad value, missing cwd):
        # name -> (file, error), for `daemonctl status` / `servers` and to log each once.
        self.skipped: dict[str, tuple[str, str]] = {}
        # How the client reaches the session: "attach" (its stdio handed to the daemon),
        # "attach-relay" (through the bridge's relay), "socket" (a raw client) or "http".
        self.via = via
        self.overrides: dict[str, tuple[ServerSettings, str]] = {}
        # A session's first reconciliation and a reload never interleave (S7).
        self.lock = trio.Lock()


class AttachedSessions:
    """The records of the sessions attached now, by session id."""

    def __init__(self) -> None:
        self.by_id: dict[str, SessionRecord] = {}

    def __len__(self) -> int:
        return len(self.by_id)

    def __iter__(self) -> Iterator[SessionRecord]:
        return iter(list(self.by_id.values()))

    def add(self, record: SessionRecord) -> None:
        self.by_id[record.session.id] = record

    def remove(self, record: SessionRecord) -> bool:
        """Forget it; False when it was not (or no longer) the record of its id."""
        if self.by_id.get(record.session.id) is not record:
            return False
        del self.by_id[record.session.id]
        return True

    def find(self, sid: str) -> SessionRecord:
        """A session by id, else by name; an invalid-params error naming it when none is."""
        record = self.by_id.get(sid)
        if record is not None:
            return record
        for candidate in self.by_id.values():
            if candidate.session.name == sid:
                return candidate
        raise McpoolError(
            f"no session {sid!r} is attached",
            message=f"Unknown session {sid}",
            code=INVALID_PARAMS,
        )

    def skipped_entries(self) -> list[dict[str, Any]]:
        """Entries some session's settings hold but were refused, with why and by whom."""
        by_error: dict[tuple[str, str, str], list[str]] = {}
        for sid, record in self.by_id.items():
            for name, (source, error) in record.skipped.items():
                by_error.setdefault((name, source, error), []).append(sid)
        return [
            {"server": name, "file": source, "error": error, "sessions": sids}
            for (name, source, error), sids in sorted(by_error.items())
        ]
