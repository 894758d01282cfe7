"""Pure decisions of issue 15, without sockets: whose log message it is (point 2), what makes a
listed item unusable and how it is reported (point 8), how long a polled stream waits (point 3)
and how an HTTP error status reads (point 12)."""

from __future__ import annotations

from typing import Any

import httpx2
import pytest

from mcpool.pool import Handle
from mcpool.pool._http import GET_RETRY, MAX_RETRY, retry_seconds, status_text
from mcpool.pool._pool import log_audience, malformed_item, malformed_note


class _H:
    """Just what `log_audience` reads of a handle."""

    def __init__(self, in_flight: int = 0, session_id: str = "") -> None:
        self.in_flight = in_flight
        self.session_id = session_id or f"s{id(self)}"


def _audience(
    handles: list[Any], related: Any = None, *, stdio: bool = True, cut: Any = ()
) -> tuple[Any, ...]:
    hs: list[Handle] = handles
    return log_audience(hs, related=related, stdio=stdio, cut=dict.fromkeys(cut, 1.0))


def test_a_message_on_a_sessions_request_stream_is_that_sessions() -> None:
    a, b = _H(1), _H(1)
    assert _audience([a, b], related=a, stdio=False) == (a,)


def test_a_message_for_a_session_that_is_gone_is_dropped() -> None:
    assert _audience([_H(1)], related=_H(1), stdio=False) == ()


def test_over_stdio_the_one_busy_session_owns_the_message() -> None:
    a, b = _H(0), _H(2)
    assert _audience([a, b]) == (b,)


def test_over_stdio_with_no_busy_session_it_goes_to_every_session() -> None:
    a, b = _H(0), _H(0)
    assert _audience([a, b]) == (a, b)


def test_over_stdio_with_several_busy_sessions_it_goes_to_those_only() -> None:
    a, b, idle = _H(1), _H(1), _H(0)
    assert _audience([a, idle, b]) == (a, b)


def test_a_cut_call_still_owns_what_the_server_sends_after_it() -> None:
    """X8: once the calling session is cut (or cancelled its call), what the server goes on
    sending is still that session's: dropped when it is gone, never fanned out."""
    idle = _H(0)
    assert _audience([idle], cut=["gone"]) == ()
    cancelled = _H(0, "mine")
    assert _audience([idle, cancelled], cut=["mine"]) == (cancelled,)
    busy = _H(1)
    assert _audience([idle, busy], cut=["gone"]) == (busy,)  # several owners: those here


def test_over_http_an_unrelated_message_fans_out_even_with_one_busy_session() -> None:
    a, b = _H(1), _H(0)
    assert _audience([a, b], stdio=False, cut=["gone"]) == (a, b)


@pytest.mark.parametrize(
    ("field", "item", "why"),
    [
        ("tools", {"name": "ok"}, None),
        ("tools", {"description": "x"}, "an item with no name"),
        ("tools", {"name": 3}, "an item whose name is a number (3), not a string"),
        ("prompts", {"name": None}, "an item whose name is null, not a string"),
        ("resources", {"name": "r"}, "an item with no uri"),
        (
            "resourceTemplates",
            {"uriTemplate": ["x"]},
            "an item whose uriTemplate is an array, not a string",
        ),
        ("tools", "x", "a non-object item (a string)"),
        ("tools", True, "a non-object item (a boolean (true))"),
        # A view copies a tool's _meta to add its own keys: a string there failed every session.
        ("tools", {"name": "t", "_meta": "x"}, "an item whose _meta is a string, not an object"),
        ("tools", {"name": "t", "_meta": None}, None),
        ("prompts", {"name": "p", "_meta": "x"}, None),
    ],
)
def test_malformed_items(field: str, item: Any, why: str | None) -> None:
    assert malformed_item(field, item) == why


def test_a_note_describes_five_items_and_counts_the_rest() -> None:
    note = malformed_note("tools/list", [f"item {i}: x" for i in range(1, 8)])
    assert note == (
        "tools/list: 7 malformed items left out: item 1: x; item 2: x; item 3: x; item 4: x; "
        "item 5: x; and 2 more"
    )
    assert malformed_note("prompts/list", ["item 1: x"]) == (
        "prompts/list: 1 malformed item left out: item 1: x"
    )


def test_a_polled_stream_waits_the_servers_retry_capped() -> None:
    assert retry_seconds({"retry": 500}) == 0.5
    assert retry_seconds({}) == GET_RETRY
    assert retry_seconds({"retry": 10**9}) == MAX_RETRY


def test_a_401_names_the_challenge() -> None:
    resp = httpx2.Response(401, headers={"www-authenticate": 'Bearer realm="x"\\nmore'})
    assert status_text(resp) == 'HTTP 401 Unauthorized (WWW-Authenticate: Bearer realm="x"\\nmore)'
    assert status_text(httpx2.Response(401)) == "HTTP 401 Unauthorized"
    assert status_text(httpx2.Response(503)) == "HTTP 503"
