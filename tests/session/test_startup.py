"""Tools at once (L6, issue 14): no server holds a session hostage, and lazy servers.

A real `Pool` on fake upstreams (`FakeNet`) under trio's MockClock: `initialize` is answered
before any upstream is up, the first list waits at most the startup budget, a late server arrives
by list_changed, a reload does not wait for a slow server, and a `"start": "lazy"` server is
listed from its last snapshot without a process until a call needs one.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing
from fakes import FakeNet, FakeServer, FakeWriter, desired, make_pool, stdio, tool

from mcpool.pool import EntryState, Pool, PoolEntry, ServerSettings
from mcpool.session import Session

BUDGET = 1.5
POLL = 0.01  # how often `answer` looks (mock time)
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": "init",
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t"}},
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def send(session: Session, obj: dict[str, Any]) -> None:
    session.handle_line(json.dumps(obj).encode())


def request(session: Session, rid: Any, method: str, params: dict[str, Any] | None = None) -> None:
    send(session, {"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}})


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


async def answer(out: FakeWriter, rid: Any) -> dict[str, Any]:
    with trio.fail_after(60):  # mock time: only a hang gets this far
        while True:
            found = [r for r in out.responses() if r["id"] == rid]
            if found:
                return found[0]
            await trio.sleep(POLL)


def names(reply: dict[str, Any]) -> list[str]:
    return [t["name"] for t in reply["result"]["tools"]]


def new_session(
    nursery: trio.Nursery, pool: Pool, sid: str = "s1", logs: list[str] | None = None
) -> tuple[Session, FakeWriter]:
    out = FakeWriter()

    def log(text: str, level: str = "warning") -> None:
        # The session logs at a level (debug for each generation): the tests read the text.
        if logs is not None:
            logs.append(text)

    session = Session(sid, name=sid, cwd=None, pool=pool, out=out, log=log)
    nursery.start_soon(session.run_notifier)
    return session, out


def wants(servers: dict[str, ServerSettings]) -> dict[str, Any]:
    return {name: desired(name, s) for name, s in servers.items()}


def entry_of(session: Session, name: str) -> PoolEntry:
    handle = session.views[name].handle
    assert handle is not None
    return handle.entry


# -- initialize at once, the first list within the budget, late servers by list_changed ---------


async def test_initialize_at_once_fast_tools_within_the_budget_and_a_late_server_by_list_changed(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    late = FakeServer([tool("late")])
    late.start_gate = trio.Event()
    hung = FakeServer([tool("never")])
    hung.start_gate = trio.Event()  # never answers its handshake
    net = FakeNet(fast=FakeServer([tool("a")]), late=late, hung=hung)
    pool = make_pool(nursery, net, startup_budget=BUDGET)
    logs: list[str] = []
    session, out = new_session(nursery, pool, logs=logs)
    t0 = trio.current_time()
    servers = {name: stdio(name) for name in ("fast", "late", "hung")}
    nursery.start_soon(session.apply_settings, wants(servers), 1)
    send(session, INITIALIZE)
    send(session, INITIALIZED)
    request(session, 1, "tools/list")
    await settle()
    init = await answer(out, "init")
    assert trio.current_time() == t0  # answered before any upstream was waited for
    assert init["result"]["capabilities"]["tools"] == {"listChanged": True}
    assert init["result"]["capabilities"]["prompts"] == {"listChanged": True}
    assert init["result"]["capabilities"]["resources"]["listChanged"] is True

    first = await answer(out, 1)
    assert trio.current_time() - t0 <= BUDGET + POLL
    assert names(first) == ["fast__a"]
    assert out.notifications() == []  # never for the first generation
    assert any("'late' is still starting" in line for line in logs)
    assert any("'hung' is still starting" in line for line in logs)

    await trio.sleep_until(t0 + 5)
    late.start_gate.set()  # answers after 5 s
    await settle()
    assert out.notifications() == ["notifications/tools/list_changed"]
    request(session, 2, "tools/list")
    assert names(await answer(out, 2)) == ["fast__a", "late__late"]

    # The hung server's start times out: its view never had items, so nothing is announced.
    await trio.sleep_until(t0 + 31)
    assert entry_of(session, "hung").last_error == "did not start within 30 s"
    assert out.notifications() == ["notifications/tools/list_changed"]


async def test_initialize_carries_the_instructions_of_the_servers_already_up(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    hung = FakeServer([tool("h")], instructions="never shown")
    hung.start_gate = trio.Event()
    net = FakeNet(up=FakeServer([tool("a")], instructions="be brief"), hung=hung)
    pool = make_pool(nursery, net, startup_budget=BUDGET)
    other, _ = new_session(nursery, pool, "s0")
    await other.apply_settings(wants({"up": stdio("up")}), 1)  # already running
    session, out = new_session(nursery, pool)
    t0 = trio.current_time()
    send(session, INITIALIZE)
    assert out.frames == []  # not before its servers are leased
    nursery.start_soon(session.apply_settings, wants({"up": stdio("up"), "hung": stdio("hung")}), 1)
    await settle()
    init = await answer(out, "init")
    assert trio.current_time() == t0
    assert init["result"]["instructions"] == "## up\nbe brief"


async def test_every_server_up_before_the_budget_answers_the_first_list_at_once(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    net = FakeNet(one=FakeServer([tool("a")]), two=FakeServer([tool("b")]))
    pool = make_pool(nursery, net, startup_budget=BUDGET)
    session, out = new_session(nursery, pool)
    t0 = trio.current_time()
    request(session, 1, "tools/list")
    await session.apply_settings(wants({"one": stdio("one"), "two": stdio("two")}), 1)
    assert trio.current_time() == t0  # no budget spent when nothing is slow
    assert names(await answer(out, 1)) == ["one__a", "two__b"]


async def test_a_reload_adding_a_slow_server_waits_only_the_budget(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    slow = FakeServer([tool("s")])
    slow.start_gate = trio.Event()
    net = FakeNet(fast=FakeServer([tool("a")]), slow=slow)
    pool = make_pool(nursery, net, startup_budget=BUDGET)
    session, out = new_session(nursery, pool)
    await session.apply_settings(wants({"fast": stdio("fast")}), 1)
    send(session, INITIALIZE)
    send(session, INITIALIZED)
    t0 = trio.current_time()
    report = await session.apply_settings(wants({"fast": stdio("fast"), "slow": stdio("slow")}), 2)
    assert dict(report) == {"fast": "keep", "slow": "acquire"}
    assert trio.current_time() - t0 == pytest.approx(
        BUDGET
    )  # S7: within the budget, not until it is up
    request(session, 1, "tools/list")
    assert names(await answer(out, 1)) == ["fast__a"]
    slow.start_gate.set()
    await settle()
    assert out.notifications() == ["notifications/tools/list_changed"]


async def test_a_second_session_does_not_wait_again_for_a_server_already_past_its_budget(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    slow = FakeServer([tool("s")])
    slow.start_gate = trio.Event()
    pool = make_pool(nursery, FakeNet(slow=slow), startup_budget=BUDGET)
    first, _ = new_session(nursery, pool, "s1")
    await first.apply_settings(wants({"slow": stdio("slow")}), 1)
    second, out = new_session(nursery, pool, "s2")
    t0 = trio.current_time()
    await second.apply_settings(wants({"slow": stdio("slow")}), 1)
    assert trio.current_time() == t0  # the entry's budget was spent already
    request(second, 1, "tools/list")
    assert names(await answer(out, 1)) == []


# -- "start": "lazy" ------------------------------------------------------------------------------


async def known_then_drained(
    nursery: trio.Nursery, pool: Pool, server: FakeServer, settings: ServerSettings
) -> None:
    """A first session learns the lazy server's lists (its one start); it leaves, and the
    entry drains."""
    session, _ = new_session(nursery, pool, "learner")
    await session.apply_settings(wants({"lz": settings}), 1)
    assert server.starts == 1
    session.close("done")
    await trio.sleep(2)  # past the drain grace
    assert pool.entries() == []


async def test_lazy_server_lists_from_its_last_snapshot_and_the_first_call_starts_it(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("a"), tool("b")])
    pool = make_pool(nursery, FakeNet(lz=server), drain_grace=1.0)
    lazy = stdio("lz", start="lazy")
    await known_then_drained(nursery, pool, server, lazy)

    session, out = new_session(nursery, pool)
    send(session, INITIALIZE)
    send(session, INITIALIZED)
    await session.apply_settings(wants({"lz": lazy}), 1)
    request(session, 1, "tools/list")
    request(session, 2, "prompts/list")
    assert names(await answer(out, 1)) == ["lz__a", "lz__b"]
    await settle()
    assert server.starts == 1  # listing never starts it
    entry = entry_of(session, "lz")
    assert entry.state is EntryState.STANDBY

    request(session, 3, "tools/call", {"name": "lz__b", "arguments": {}})
    await settle()
    assert server.starts == 2
    assert entry.state is EntryState.ACTIVE
    upstream = server.current
    [(uid, _method, params)] = [s for s in upstream.sent if s[1] == "tools/call"]
    assert params["name"] == "b"
    upstream.reply(uid, {"content": [{"type": "text", "text": "done"}]})
    reply = await answer(out, 3)
    assert reply["result"]["content"][0]["text"] == "done"
    assert out.notifications() == []  # the live lists equal the snapshot's


async def test_a_lazy_server_that_fails_to_start_answers_the_waiting_call_with_an_error(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("a")])
    pool = make_pool(nursery, FakeNet(lz=server), drain_grace=1.0)
    lazy = stdio("lz", start="lazy")
    await known_then_drained(nursery, pool, server, lazy)
    server.always_fail = True
    session, out = new_session(nursery, pool)
    await session.apply_settings(wants({"lz": lazy}), 1)
    request(session, 1, "tools/call", {"name": "lz__a", "arguments": {}})
    error = (await answer(out, 1))["error"]
    assert "server 'lz' failed to start" in error["data"]["reason"]
    assert server.starts == 2


async def test_a_call_waiting_for_its_server_is_answered_when_the_session_closes(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("a")])
    pool = make_pool(nursery, FakeNet(lz=server), drain_grace=1.0)
    lazy = stdio("lz", start="lazy")
    await known_then_drained(nursery, pool, server, lazy)
    server.start_gate = trio.Event()
    session, out = new_session(nursery, pool)
    await session.apply_settings(wants({"lz": lazy}), 1)
    request(session, "cancelled", "tools/call", {"name": "lz__a", "arguments": {}})
    request(session, "kept", "tools/call", {"name": "lz__a", "arguments": {}})
    send(
        session,
        {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": "cancelled"},
        },
    )
    await settle()
    assert out.responses() == []  # both wait for the start
    session.close("the client disconnected")
    assert [r["id"] for r in out.responses()] == ["kept"]  # a cancelled request gets none
    server.start_gate.set()
    await settle()
    assert [r["id"] for r in out.responses()] == ["kept"]


async def test_a_lazy_server_never_seen_is_started_once_to_learn_its_lists(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("a")])
    pool = make_pool(nursery, FakeNet(lz=server))
    session, out = new_session(nursery, pool)
    await session.apply_settings(wants({"lz": stdio("lz", start="lazy")}), 1)
    request(session, 1, "tools/list")
    assert names(await answer(out, 1)) == ["lz__a"]
    assert server.starts == 1


async def test_start_is_a_policy_field_not_part_of_the_transport_identity() -> None:
    eager, lazy = desired("x", stdio("x")), desired("x", stdio("x", start="lazy"))
    assert eager.identity == lazy.identity
    assert eager.identity.fingerprint == lazy.identity.fingerprint


async def test_a_waiting_call_is_checked_against_the_policy_in_force_when_it_goes(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("a"), tool("b")])
    pool = make_pool(nursery, FakeNet(lz=server), drain_grace=1.0)
    await known_then_drained(nursery, pool, server, stdio("lz", start="lazy"))
    server.start_gate = trio.Event()
    session, out = new_session(nursery, pool)
    await session.apply_settings(wants({"lz": stdio("lz", start="lazy")}), 1)
    request(session, 1, "tools/call", {"name": "lz__b", "arguments": {}})
    await settle()
    # S8: while it waits, the settings stop allowing the tool (same server, same process).
    report = await session.apply_settings(
        wants({"lz": stdio("lz", start="lazy", excludeTools=["b"])}), 2
    )
    assert dict(report) == {"lz": "refresh"}
    server.start_gate.set()
    error = (await answer(out, 1))["error"]
    assert "b is no longer allowed" in error["data"]["reason"]
    assert [s for s in server.current.sent if s[1] == "tools/call"] == []


async def test_a_2026_session_discovers_at_once_and_its_first_list_waits_the_budget(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    # server/discover opens a 2026-07-28 session as initialize opens an older one: it needs no
    # upstream, so it is not held until the first generation (an SDK client's discover probe
    # gives up after a few seconds and falls back to initialize, another era).
    late = FakeServer([tool("late")], instructions="not yet")
    late.start_gate = trio.Event()
    net = FakeNet(fast=FakeServer([tool("a")], instructions="be brief"), late=late)
    pool = make_pool(nursery, net, startup_budget=BUDGET)
    session, out = new_session(nursery, pool)
    envelope = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    t0 = trio.current_time()
    nursery.start_soon(session.apply_settings, wants({n: stdio(n) for n in ("fast", "late")}), 1)
    request(session, "d", "server/discover", {"_meta": envelope})
    request(session, 1, "tools/list", {"_meta": envelope})
    await settle()
    found = await answer(out, "d")
    assert trio.current_time() == t0  # before any upstream was waited for
    assert found["result"]["capabilities"]["tools"] == {"listChanged": True}
    assert "not yet" not in (found["result"].get("instructions") or "")
    first = await answer(out, 1)
    assert trio.current_time() - t0 <= BUDGET + POLL
    assert names(first) == ["fast__a"]
    late.start_gate.set()
