"""The aggregated server a session sees: lists paginated with the daemon's own cursors, upstream
notifications routed to the sessions of that upstream only, and an upstream's own
tools/list_changed followed by a re-list that the sessions' lists reflect."""

from __future__ import annotations

import math

import mcp_types as types
import trio
from mcp import ClientSession

from .harness import DaemonFactory, fake_server
from .support import STEP_TIMEOUT, Inbox, call_text, raw_attach, raw_call, raw_text, tool_names

PAGE_SIZE = 3
BUILTIN = ("pid", "echo", "env", "sleep", "progress", "crash", "set_tools", "log", "fail")


async def list_all_tools(session: ClientSession) -> list[list[str]]:
    """Follow nextCursor to the end, as a client must; the names of each page."""
    pages: list[list[str]] = []
    cursor: str | None = None
    with trio.fail_after(STEP_TIMEOUT):
        while True:
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            pages.append([tool.name for tool in page.tools])
            cursor = page.next_cursor
            if cursor is None:
                return pages


async def test_aggregated_tool_lists_paginate_with_the_daemons_cursors(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory(daemon={"pageSize": PAGE_SIZE})
    # `first` paginates its own tools/list too (2 a page): the daemon follows upstream cursors
    # to build its snapshot, then pages the aggregate with cursors of its own.
    settings = daemon.settings_file(
        "settings.json",
        {
            "first": fake_server(FAKE_PAGE_SIZE=2, FAKE_TOOL_COUNT=4),
            "second": fake_server(FAKE_TOOLS="extra"),
        },
    )
    async with daemon.attach([settings], "pager") as session:
        pages = await list_all_tools(session)
        again = await list_all_tools(session)

    first = [f"first__{n}" for n in (*BUILTIN, "tool_0", "tool_1", "tool_2", "tool_3")]
    second = [f"second__{n}" for n in (*BUILTIN, "extra")]
    names = [name for page in pages for name in page]
    assert sorted(names) == sorted(first + second)
    assert len(pages) == math.ceil(len(names) / PAGE_SIZE)
    assert all(len(page) == PAGE_SIZE for page in pages[:-1]), pages
    # Each server's tools keep their upstream order in the aggregate.
    assert [n for n in names if n.startswith("first__")] == first
    assert [n for n in names if n.startswith("second__")] == second
    assert again == pages


async def test_a_log_message_sent_during_one_sessions_call_reaches_that_session_only(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    shared = daemon.settings_file("shared.json", {"fake": fake_server()})
    other = daemon.settings_file("other.json", {"fake": fake_server(FAKE_MARK="other")})
    caller_inbox, sharer_inbox = Inbox(), Inbox()
    # The stranger is a raw connection, so "nothing arrived before the ping's reply" is exact.
    async with (
        daemon.attach([shared], "caller", message_handler=caller_inbox) as caller,
        daemon.attach([shared], "sharer", message_handler=sharer_inbox) as sharer,
        daemon.raw() as stranger,
    ):
        await raw_attach(stranger, [str(other)], "stranger")
        caller_pid = await call_text(caller, "fake__pid")
        assert await call_text(sharer, "fake__pid") == caller_pid
        assert raw_text(await raw_call(stranger, "fake__pid", {})) != caller_pid

        logged = await call_text(caller, "fake__log", {"level": "warning", "message": "hi"})
        assert logged == "logged"
        # Sent while only the caller had a request in flight: the caller's alone (issue 15).
        to_caller = await caller_inbox.wait_for(types.LoggingMessageNotification)
        # Replies written after the upstream's message prove the others got none.
        await sharer.send_ping()
        pong = await stranger.request("ping")
        assert pong.get("result") == {}, pong

    assert to_caller.params.level == "warning"
    assert to_caller.params.data == "hi"
    assert to_caller.params.logger == "fake"
    assert len(caller_inbox.of_type(types.LoggingMessageNotification)) == 1
    assert sharer_inbox.of_type(types.LoggingMessageNotification) == []
    assert [m for m in stranger.backlog if m.get("method") == "notifications/message"] == []


async def test_an_upstream_tools_list_changed_is_relisted_and_the_sessions_follow(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    settings = daemon.settings_file("settings.json", {"fake": fake_server()})
    filtered = daemon.settings_file(
        "filtered.json", {"fake": {**fake_server(), "excludeTools": ["hidden"]}}
    )
    changer_inbox, watcher_inbox = Inbox(), Inbox()
    async with (
        daemon.attach([settings], "changer", message_handler=changer_inbox) as changer,
        daemon.attach([filtered], "watcher", message_handler=watcher_inbox) as watcher,
    ):
        before = await tool_names(changer)
        assert "fake__fresh" not in before
        # A round trip on each connection: the daemon has seen its notifications/initialized,
        # so the change below is announced to both (S5 drops pre-handshake changes).
        assert await tool_names(watcher) == before
        await call_text(changer, "fake__set_tools", {"names": ["fresh", "hidden"]})
        await changer_inbox.wait_for(types.ToolListChangedNotification)
        await watcher_inbox.wait_for(types.ToolListChangedNotification)
        changed = await tool_names(changer)
        watched = await tool_names(watcher)
        assert await call_text(watcher, "fake__fresh") == "fresh"

        # Either session may change the shared upstream; both follow.
        changer_inbox.items.clear()
        await call_text(watcher, "fake__set_tools", {"names": []})
        await changer_inbox.wait_for(types.ToolListChangedNotification)
        after = await tool_names(changer)

    assert changed == [*before, "fake__fresh", "fake__hidden"]
    assert watched == [*before, "fake__fresh"]
    assert after == before
