"""Issue 12: the upstream's reader task is shared by every session of that server, so nothing a
dispatched callback raises may reach it. `_dispatch` records the failure (with its traceback,
in the server's log tail) and goes on with the next message."""

from __future__ import annotations

import json
from typing import Any

from fakes import stdio
from msgspec import Raw, UnsetType

from mcpool.pool import identity_of
from mcpool.pool._upstream import StdioUpstream
from mcpool.protocol import Message


class BrokenSink:
    """An event sink whose first notification raises, as a bug in a session would."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_notification(self, method: str, params: Raw | UnsetType) -> None:
        self.seen.append(method)
        if len(self.seen) == 1:
            raise RuntimeError("a bug in a listener")

    def on_server_request(self, upstream: Any, msg: Message) -> None:
        raise ValueError("another bug")


def _line(*messages: dict[str, Any]) -> bytes:
    return json.dumps(messages[0] if len(messages) == 1 else list(messages)).encode()


def test_a_failing_callback_is_recorded_and_the_next_message_still_dispatched() -> None:
    sink = BrokenSink()
    up = StdioUpstream(
        identity_of("up", stdio()), sink, guardian=None, max_line=1 << 20, handshake_timeout=30
    )
    replies: list[Any] = []

    def failing_reply(msg: Message) -> None:
        raise KeyError("a bug in a reply callback")

    up._pending[1] = failing_reply
    up._pending[2] = replies.append
    up._dispatch(
        _line(
            {"jsonrpc": "2.0", "method": "notifications/message", "params": {}},
            {"jsonrpc": "2.0", "id": 1, "result": {}},
            {"jsonrpc": "2.0", "id": 9, "method": "sampling/createMessage"},
            {"jsonrpc": "2.0", "method": "notifications/progress", "params": {}},
        )
    )
    up._dispatch(_line({"jsonrpc": "2.0", "id": 2, "result": {}}))
    assert sink.seen == ["notifications/message", "notifications/progress"]
    assert [m.id for m in replies] == [2]
    errors = [line for line in up.stderr_tail if "internal error dispatching" in line]
    assert len(errors) == 3
    assert all("Traceback" in line for line in errors)
    assert "a bug in a listener" in errors[0] and "a bug in a reply callback" in errors[1]
