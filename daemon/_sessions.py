"""Opening and closing sessions, for the socket side and the HTTP endpoint alike.

`Sessions` makes each `Session` with the pool, the daemon's options and the shared caches,
records it among the attached sessions and has its settings files watched; closing undoes both.
It is the `SessionHost` the HTTP endpoint is given (daemon/_http.py).
"""

from __future__ import annotations

import time
from typing import Any

from mcpool.pool import Pool
from mcpool.session import Interner, Session, new_session_id
from mcpool.session._cursors import CursorBook
from mcpool.session._login_notice import LoginDesk
from mcpool.session._pins import NO_PINS, PinDesk
from mcpool.session._toolsearch import ToolSearchMode, ToolSearchSettings

from ._attached import AttachedSessions, SessionRecord
from ._core import DaemonProcess
from ._hosting import SettingsHost
from ._ledger import Ledger


class Sessions:
    def __init__(
        self,
        attached: AttachedSessions,
        host: SettingsHost,
        pool: Pool,
        process: DaemonProcess,
        *,
        logins: LoginDesk,
        cursors: CursorBook[tuple[dict[str, Any], ...]],
        interner: Interner,
        observer: Ledger | None = None,
        pins: PinDesk = NO_PINS,
    ) -> None:
        self._attached = attached
        self._pins = pins
        # Told of every session's answered calls (audit log, statistics; daemon/_ledger.py).
        self._ledger = observer
        self._interner = interner
        self._host = host
        self._files = host.files
        self._pool = pool
        self._process = process
        self._logins = logins
        self._cursors = cursors
        self.config_path = host.files.config_path

    def log(self, level: str, message: str, **fields: Any) -> None:
        self._process.log(level, message, **fields)

    def open_session(
        self,
        out: Any,
        *,
        name: str,
        sources: list[str],
        peer: Any,
        cwd: str | None = None,
        via: str = "socket",
        env: dict[str, str] | None = None,
        max_name_length: int | None = None,
        tool_search: ToolSearchMode | None = None,
    ) -> SessionRecord:
        """A new session writing to `out`, recorded as attached and its files watched."""
        options = self._files.options
        log = self._process.log
        session = Session(
            new_session_id(),
            name=name,
            cwd=cwd,
            pool=self._pool,
            out=out,
            page_size=options.page_size,
            log=lambda text, level="warning": log(level, text),
            attached_at=time.time(),
            log_enabled=self._process.journal.enabled,
            logins=self._logins,
            cursors=self._cursors,
            interner=self._interner,
            observer=self._ledger,
            pins=self._pins,
            tool_search=ToolSearchSettings(
                tool_search or options.tool_search,
                options.tool_search_tools,
                options.tool_search_bytes,
            ),
        )
        session.set_name_budget(explicit=max_name_length, configured=options.max_name_length)
        record = SessionRecord(session, sources, via, env)
        self._attached.add(record)
        self._host.watch_sources(sources)
        log("info", "session attached", session=session.id, name=name, peer=peer)
        return record

    async def apply_to_session(self, record: SessionRecord) -> list[tuple[str, str]]:
        return await self._host.apply_to_session(record)

    def close_session(self, record: SessionRecord, reason: str) -> None:
        session = record.session
        session.close(reason)
        if self._attached.remove(record):
            self._host.unwatch_sources(record.sources)
        self._process.log(
            "info", "session detached", session=session.id, reason=session.close_reason
        )
