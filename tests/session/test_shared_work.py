"""Work shared by the sessions that hold one aggregate (issue 17): every page of a list cached
per aggregate, era and page size, and the change set between two aggregates computed once.

Each cached answer must equal what the uncached computation gives: the same pages, the same
cursors, the same list_changed notifications per session.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import msgspec
import trio
import trio.testing
from fakes import BytesWriter, FakeNet, FakeServer, FakeWriter, desired, make_pool, stdio, tool
from hypothesis import given
from hypothesis import strategies as st

from mcpool.pool import Pool, PoolEntry, ServerSettings
from mcpool.protocol import ByteTable, canonical_bytes, decode
from mcpool.session import Session, _registry
from mcpool.session._canoncache import canonical_of
from mcpool.session._changes import change_set
from mcpool.session._cursors import CursorBook
from mcpool.session._interner import MAX_CANONICAL_BYTES, UNSHARED
from mcpool.session._registry import LIST_KINDS, RegistryGeneration, build_candidate
from mcpool.session._view import common_ends, project

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": "init",
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t"}},
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


_books: dict[int, CursorBook[Any]] = {}


async def attach(
    nursery: trio.Nursery,
    pool: Pool,
    servers: dict[str, ServerSettings],
    sid: str,
    *,
    page_size: int = 500,
) -> tuple[Session, FakeWriter]:
    out = FakeWriter()
    # One book for the sessions of a pool, as the daemon gives all its sessions one.
    cursors = _books.setdefault(id(pool), CursorBook(trio.current_time))
    session = Session(
        sid, name=sid, cwd=None, pool=pool, out=out, page_size=page_size, cursors=cursors
    )
    nursery.start_soon(session.run_notifier)
    want = {name: desired(name, s) for name, s in servers.items()}
    await session.apply_settings(want, 1)
    session.handle_line(json.dumps(INITIALIZE).encode())
    session.handle_line(json.dumps(INITIALIZED).encode())
    await trio.testing.wait_all_tasks_blocked()
    out.frames.clear()
    return session, out


def ask(session: Session, out: FakeWriter, method: str, params: dict[str, Any]) -> Any:
    out.frames.clear()
    session.handle_line(
        json.dumps({"jsonrpc": "2.0", "id": 9, "method": method, "params": params}).encode()
    )
    (reply,) = [f for f in out.frames if f.get("id") == 9]
    return reply


def walk(session: Session, out: FakeWriter, method: str, field: str) -> list[Any]:
    """Every page of a list, following the cursors."""
    pages: list[Any] = []
    params: dict[str, Any] = {}
    for _ in range(100):
        result = ask(session, out, method, params)["result"]
        pages.append(result)
        if "nextCursor" not in result:
            return pages
        params = {"cursor": result["nextCursor"]}
    raise AssertionError("the cursors never ended")


def expected_pages(items: list[Any], field: str, size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, max(len(items), 1), size)]


def entry_of(session: Session, name: str) -> PoolEntry:
    handle = session.views[name].handle
    assert handle is not None
    return handle.entry


def publish(entry: PoolEntry, **changes: Any) -> None:
    snap = entry.snapshot
    entry.publish(msgspec.structs.replace(snap, generation=snap.generation + 1, **changes))


async def test_every_page_served_from_the_cache_equals_the_uncached_pages(
    nursery: trio.Nursery,
) -> None:
    net = FakeNet(srv=FakeServer([tool(f"t{i:02}") for i in range(23)]))
    pool = make_pool(nursery, net)
    servers = {"srv": stdio()}
    first, first_out = await attach(nursery, pool, servers, "a", page_size=7)
    second, second_out = await attach(nursery, pool, servers, "b", page_size=7)
    assert first.registry.agg is second.registry.agg
    items = list(json.loads(msgspec.json.encode(first.registry.tools)))

    cold = walk(first, first_out, "tools/list", "tools")  # fills the cache
    warm = walk(second, second_out, "tools/list", "tools")  # served from it
    assert cold == warm
    assert [p["tools"] for p in warm] == expected_pages(items, "tools", 7)
    assert len(warm) == 4 and "nextCursor" not in warm[-1]
    assert len(first.registry.encoded) == 4  # one per page

    # A cursor the daemon never issued (mid-page) is refused, naming it, and nothing cached.
    mid = base64.urlsafe_b64encode(b"o:3").decode()
    error = ask(second, second_out, "tools/list", {"cursor": mid})["error"]
    assert error["code"] == -32602 and mid in error["data"]["reason"], error
    assert len(first.registry.encoded) == 4

    # A change of the list: the new aggregate's pages, never the old cache.
    entry = entry_of(first, "srv")
    publish(entry, tools=tuple(tool(f"n{i:02}") for i in range(9)))
    await trio.testing.wait_all_tasks_blocked()
    new_items = list(json.loads(msgspec.json.encode(second.registry.tools)))
    assert [t["name"] for t in new_items] == [f"srv__n{i:02}" for i in range(9)]
    for session, out in ((first, first_out), (second, second_out)):
        pages = walk(session, out, "tools/list", "tools")
        assert [p["tools"] for p in pages] == expected_pages(new_items, "tools", 7)


def list_line(rid: Any, params: dict[str, Any]) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": rid, "method": "tools/list", "params": params}
    ).encode()


async def test_a_cached_tools_page_is_answered_directly_byte_for_byte_as_the_general_path(
    nursery: trio.Nursery,
) -> None:
    """`_tools_page_direct` serves a cached page of tools/list, and only one: its answer's
    bytes are the general path's (`_handle`), one compact line; anything it does not serve
    (not cached yet, a cursor mcpool did not issue, `_meta`, an id in use) it leaves alone."""
    net = FakeNet(srv=FakeServer([tool(f"t{i:02}") for i in range(23)]))
    pool = make_pool(nursery, net)
    session, out = await attach(nursery, pool, {"srv": stdio()}, "a", page_size=7)
    line = list_line(1, {})
    session.link.out = BytesWriter()
    assert not session.requests._tools_page_direct(line)  # nothing cached yet
    assert session.out.data == b""
    session.link.out = out
    pages = walk(session, out, "tools/list", "tools")  # fills the cache, through handle_line
    cursors = [None, *(page["nextCursor"] for page in pages[:-1])]
    for rid, cursor, page in zip(["x", 2, 3, 4], cursors, pages, strict=True):
        line = list_line(rid, {} if cursor is None else {"cursor": cursor})
        direct, general = BytesWriter(), BytesWriter()
        session.link.out = direct
        assert session.requests._tools_page_direct(line)
        session.link.out = general
        session.handle_message(decode(line))
        assert bytes(direct.data) == bytes(general.data)
        assert direct.data.count(b"\n") == 1 and direct.data.endswith(b"}\n")
        assert json.loads(direct.data) == {"jsonrpc": "2.0", "id": rid, "result": page}

    mid = base64.urlsafe_b64encode(b"o:3").decode()
    refused = [
        list_line(5, {"cursor": mid}),  # served (uncached) by the general path
        list_line(5, {"cursor": cursors[1], "_meta": {"progressToken": 1}}),
        list_line(5, {"cursor": 7}),  # not a string: the general path says why
        list_line(5, {"cursor": cursors[1], "other": True}),
    ]
    session.link.out = BytesWriter()
    for line in refused:
        assert not session.requests._tools_page_direct(line)
    session.inflight[6] = object()  # type: ignore[assignment]  # an id in flight
    assert not session.requests._tools_page_direct(list_line(6, {}))
    del session.inflight[6]
    assert session.out.data == b""


async def test_other_page_sizes_and_kinds_have_their_own_pages(nursery: trio.Nursery) -> None:
    server = FakeServer([tool(f"t{i}") for i in range(10)])
    pool = make_pool(nursery, FakeNet(srv=server))
    servers = {"srv": stdio()}
    small, small_out = await attach(nursery, pool, servers, "a", page_size=3)
    large, large_out = await attach(nursery, pool, servers, "b", page_size=4)
    assert small.registry.agg is large.registry.agg
    items = list(json.loads(msgspec.json.encode(small.registry.tools)))
    for _ in range(2):  # cold, then warm
        assert [p["tools"] for p in walk(small, small_out, "tools/list", "tools")] == (
            expected_pages(items, "tools", 3)
        )
        assert [p["tools"] for p in walk(large, large_out, "tools/list", "tools")] == (
            expected_pages(items, "tools", 4)
        )
    prompts = walk(small, small_out, "prompts/list", "prompts")
    assert prompts == [{"prompts": []}]


async def test_many_sessions_on_one_aggregate_each_hear_of_a_change_once(
    nursery: trio.Nursery,
) -> None:
    pool = make_pool(nursery, FakeNet(srv=FakeServer([tool("a"), tool("b")])))
    attached = [await attach(nursery, pool, {"srv": stdio()}, f"s{i}") for i in range(50)]
    # One session on a different policy: another previous aggregate, its own change set.
    _narrow, narrow_out = await attach(nursery, pool, {"srv": stdio(includeTools=["b"])}, "n")
    entry = entry_of(attached[0][0], "srv")

    publish(entry, tools=(tool("b"), tool("a")))  # a reorder: canonically no change
    await trio.testing.wait_all_tasks_blocked()
    assert all(out.notifications() == [] for _, out in attached)
    assert narrow_out.notifications() == []

    publish(entry, tools=(tool("a", "changed"), tool("b")))  # only "a" changed
    await trio.testing.wait_all_tasks_blocked()
    for _, out in attached:
        assert out.notifications() == ["notifications/tools/list_changed"]
    assert narrow_out.notifications() == []  # its view (only "b") did not change
    assert len({s.registry.agg for s, _ in attached}) == 1

    publish(entry, tools=(tool("a", "changed"), tool("b", "changed")))
    await trio.testing.wait_all_tasks_blocked()
    assert narrow_out.notifications() == ["notifications/tools/list_changed"]


async def test_kinds_changed_at_once_are_told_in_list_order_in_one_write(
    nursery: trio.Nursery,
) -> None:
    """A handshake-era session told of several kinds at once gets their list_changed lines in
    one write (one system call), in list order, each counted."""
    pool = make_pool(nursery, FakeNet(srv=FakeServer([tool("a")])))
    sessions = [await attach(nursery, pool, {"srv": stdio()}, f"s{i}") for i in range(3)]
    entry = entry_of(sessions[0][0], "srv")
    writers = []
    for session, _out in sessions:
        session.link.out = writer = BytesWriter()
        writes: list[bytes] = []
        writer.write = writes.append  # type: ignore[method-assign]
        writers.append((session, writes))
    publish(entry, tools=(tool("a", "changed"),), prompts=({"name": "p"},))
    await trio.testing.wait_all_tasks_blocked()
    for session, writes in writers:
        assert writes == [
            b'{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}\n'
            b'{"jsonrpc":"2.0","method":"notifications/prompts/list_changed"}\n'
        ]
        assert session.notifications_sent == 2


async def test_routes_after_a_relist_read_through_until_a_call_makes_them_whole(
    nursery: trio.Nursery,
) -> None:
    """A relist that changes one tool of many does not copy the routes table at the change:
    the aggregate's routes read through the last ones until the first lookup makes them a
    dict, once; every route, the changed tool's and the others', is what a table built whole
    says, before and after."""
    pool = make_pool(nursery, FakeNet(srv=FakeServer([tool(f"t{i}") for i in range(40)])))
    session, _out = await attach(nursery, pool, {"srv": stdio()}, "a")
    entry = entry_of(session, "srv")
    session.registry.tool_route("srv__t0")  # the first aggregate's routes, used
    for round_ in range(3):
        tools = [tool(f"t{i}") for i in range(40)]
        tools[7] = tool(f"new{round_}")
        publish(entry, tools=tuple(tools))
        await trio.testing.wait_all_tasks_blocked()
        agg = session.registry.agg
        assert agg.tool_routes.__class__ is not dict  # not copied at the change
        expected = {f"srv__{t['name']}": (0, t["name"]) for t in tools}
        assert dict(agg.tool_routes.items()) == expected
        for exposed, (_, upstream) in expected.items():
            route = session.registry.tool_route(exposed)
            assert route is not None and route.upstream_name == upstream
        assert session.registry.tool_route("srv__t7") is None
        assert agg.tool_routes.__class__ is dict and agg.tool_routes == expected
        assert agg.whole_tool_routes() is agg.tool_routes  # made whole once


def test_a_change_set_is_the_kinds_whose_canonical_form_differs() -> None:
    class Agg:
        def __init__(self, **canonical: Any) -> None:
            self.canonical = {k: canonical.get(k, ()) for k in LIST_KINDS}

    old = Agg(tools=(("a", b"1"),), prompts=(("p", b"1"),))
    new = Agg(tools=(("a", b"2"),), prompts=(("p", b"1"),), resources=(("r", b"1"),))
    assert change_set(old, new, LIST_KINDS) == ("tools", "resources")
    assert change_set(old, new, LIST_KINDS) == ("tools", "resources")  # remembered
    assert change_set(new, old, LIST_KINDS) == ("tools", "resources")
    assert change_set(new, new, LIST_KINDS) == ()
    same = Agg(tools=(("a", b"2"),), prompts=(("p", b"1"),), resources=(("r", b"1"),))
    assert change_set(new, same, LIST_KINDS) == ()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=20,
)


@given(st.lists(json_values, max_size=6))
def test_cached_canonical_bytes_are_the_computed_ones(items: list[Any]) -> None:
    table = ByteTable(MAX_CANONICAL_BYTES)
    for item in items + items:  # the second pass is served from the table
        assert canonical_of(item, table) == canonical_bytes(item)
    # Key order and set-like keyword order in a tool's schema make no difference, as for
    # canonical_bytes (an item's inputSchema is a schema, S4).
    schema = {"name": "t", "inputSchema": {"type": ["string", "null"], "required": ["b", "a"]}}
    reordered = {"inputSchema": {"required": ["a", "b"], "type": ["null", "string"]}, "name": "t"}
    assert canonical_of(schema, table) == canonical_of(reordered, table) == canonical_bytes(schema)


def test_a_full_table_starts_again() -> None:
    table = ByteTable(200)
    for i in range(50):
        item = {"name": f"t{i}", "inputSchema": {"type": "object"}}
        assert canonical_of(item, table) == canonical_bytes(item)
        assert table.held <= 200
    assert table.statistics()["resets"] > 0
    assert canonical_of({1, 2}, table) == canonical_bytes({1, 2})  # not JSON-encodable: computed


# -- a relist that keeps unchanged items (issue 17): reused work equals a fresh computation ------

names = st.sampled_from(["a", "A", "b", "c", " d", "", "e", "f"])
tool_lists = st.lists(st.tuples(names, st.sampled_from(["1", "2"])), max_size=7)


def clear_shared_caches() -> None:
    """Forget what builds reuse (projections stay: which part is unchanged is decided by their
    identity), so the next build validates and assembles from scratch."""
    UNSHARED.aggregates.clear()
    _registry._own_names.clear()
    _registry._projection_canonical.clear()
    _registry._part_tables_of.clear()


def served(gen: RegistryGeneration) -> Any:
    return (
        json.loads(msgspec.json.encode(gen.tools)),
        {e: (r.view.name, r.upstream_name) for e, r in gen.tool_routes.items()},
        gen.canonical,
    )


async def relist_scenario(before: list[tuple[str, str]], after: list[tuple[str, str]]) -> None:
    async with trio.open_nursery() as nursery:
        original = [tool(n, d) for n, d in before]
        server = FakeServer(list(original))
        pool = make_pool(nursery, FakeNet(srv=server, other=FakeServer([tool("a"), tool("z")])))
        servers = {"srv": stdio(prefix=False), "other": stdio("other", prefix=False)}
        narrow = {"srv": stdio(prefix=False, excludeTools=["b"]), "other": servers["other"]}
        sessions = [await attach(nursery, pool, servers, f"s{i}") for i in range(3)]
        sessions.append(await attach(nursery, pool, narrow, "n"))
        entry = entry_of(sessions[0][0], "srv")
        # What a relist gives: an item whose encoding did not change is the same object.
        by_value = {json.dumps(t, sort_keys=True): t for t in entry.snapshot.tools}
        relisted = []
        for n, d in after:
            fresh = tool(n, d)
            relisted.append(by_value.get(json.dumps(fresh, sort_keys=True), fresh))
        previous = [(s.registry, served(s.registry)) for s, _ in sessions]
        publish(entry, tools=tuple(relisted))
        await trio.testing.wait_all_tasks_blocked()
        for (session, out), (prev_gen, prev_served) in zip(sessions, previous, strict=True):
            got = served(session.registry)
            # The same generation computed again from nothing but the same inputs.
            clear_shared_caches()
            prev_gen.agg.moves.clear()
            views = list(session.views.values())
            again = build_candidate(views, number=0, settings_generation=0, previous=prev_gen)
            assert got == served(again)
            assert list(session.registry_errors.values()) == [r.describe() for r in again.rejected]
            # Each projection made from the previous one is what projecting afresh gives.
            for view in views:
                assert view.handle is not None
                snapshot = view.handle.entry.snapshot
                made = view.projection_of(snapshot)
                fresh = project(
                    snapshot, view.key, view.name, prefix=view.prefix, budget=session.name_budget
                )
                assert (made.tools, made.prompts, made.hidden_tools) == (
                    fresh.tools,
                    fresh.prompts,
                    fresh.hidden_tools,
                )
            # Told exactly when its own served lists changed, canonically.
            changed = got[2]["tools"] != prev_served[2]["tools"]
            assert out.notifications() == (["notifications/tools/list_changed"] if changed else [])
        nursery.cancel_scope.cancel()


@given(tool_lists, tool_lists)
def test_a_relist_keeping_unchanged_items_serves_what_a_fresh_build_serves(
    before: list[tuple[str, str]], after: list[tuple[str, str]]
) -> None:
    trio.run(relist_scenario, before, after)


@given(st.lists(st.integers(0, 5), max_size=8), st.lists(st.integers(0, 5), max_size=8))
def test_common_ends_are_the_longest_shared_ends_by_identity(
    old: list[int], new: list[int]
) -> None:
    pool_of = [object() for _ in range(6)]
    a, b = [pool_of[i] for i in new], [pool_of[i] for i in old]
    head, tail = common_ends(a, b)
    assert head + tail <= min(len(a), len(b))
    assert all(x is y for x, y in zip(a[:head], b[:head], strict=True))
    assert all(x is y for x, y in zip(a[len(a) - tail :], b[len(b) - tail :], strict=True))
    # Longest: the next item in from either end differs (or the ends meet).
    room = min(len(a), len(b))
    assert head == room or a[head] is not b[head] or head + tail == room
    assert tail == room - head or a[len(a) - 1 - tail] is not b[len(b) - 1 - tail]


async def test_relists_through_the_pages_delta_tell_each_view_what_its_own_view_warrants(
    nursery: trio.Nursery,
) -> None:
    """Upstream relists (each page compared with the last listing's bytes, pool/_reuse.py),
    sessions with different views on one entry: each hears of a change only when its own view
    changed, and serves the pages a session attached afresh serves."""
    server = FakeServer([tool(f"t{i:02}") for i in range(40)])
    pool = make_pool(nursery, FakeNet(srv=server))
    every = [await attach(nursery, pool, {"srv": stdio()}, f"s{i}", page_size=7) for i in range(3)]
    narrow, narrow_out = await attach(
        nursery, pool, {"srv": stdio(includeTools=["t05"])}, "n", page_size=7
    )
    entry = entry_of(narrow, "srv")

    async def relisted(tools: list[Any]) -> None:
        before = entry.snapshot
        server.tools = tools
        server.upstreams[-1].list_changed()
        with trio.fail_after(5):
            while entry.snapshot is before:
                await trio.sleep(0.01)
        await trio.testing.wait_all_tasks_blocked()

    changes: list[tuple[list[Any], bool, bool]] = [
        # (the new list, whether the full views changed, whether the narrow one did)
        ([*server.tools, tool("t40")], True, False),  # one added at the end
        ([tool(f"t{i:02}") for i in range(41) if i != 20], True, False),  # one in the middle gone
        ([tool(f"t{i:02}", "new" if i == 5 else "") for i in range(41) if i != 20], True, True),
        ([tool(f"t{i:02}", "new" if i == 5 else "") for i in range(41) if i != 20], False, False),
    ]
    for i, (tools, full, only) in enumerate(changes):
        for _, out in [*every, (narrow, narrow_out)]:
            out.frames.clear()
        await relisted(tools)
        told = ["notifications/tools/list_changed"]
        for _, out in every:
            assert out.notifications() == (told if full else []), i
        assert narrow_out.notifications() == (told if only else []), i
        fresh, fresh_out = await attach(nursery, pool, {"srv": stdio()}, f"fresh{i}", page_size=7)
        expected = walk(fresh, fresh_out, "tools/list", "tools")
        for session, out in every:
            assert walk(session, out, "tools/list", "tools") == expected
        # What the upstream listed last, as a decode from scratch gives it.
        assert [t for p in expected for t in p["tools"]] == [
            {**t, "name": f"srv__{t['name']}", "_meta": {"mcpool/server": "srv"}} for t in tools
        ]


async def relisted_scenario(lists: list[list[tuple[str, str]]]) -> None:
    """Relists through the pool (`list_all` and its page delta): the projections made with the
    ends the pool tells (`KnownItems.kept`, not compared again) are what projecting afresh
    gives, each session serves what a build from scratch serves, and is told of a change
    exactly when its own served lists changed."""
    async with trio.open_nursery() as nursery:
        server = FakeServer([tool(n, d) for n, d in lists[0]])
        pool = make_pool(nursery, FakeNet(srv=server))
        views = {
            "all": {"srv": stdio(prefix=False)},
            "narrow": {"srv": stdio(prefix=False, excludeTools=["b"])},
        }
        sessions = [await attach(nursery, pool, v, n) for n, v in views.items()]
        entry = entry_of(sessions[0][0], "srv")
        for tools in lists[1:]:
            previous = [(s.registry, served(s.registry)) for s, _ in sessions]
            for _, out in sessions:
                out.frames.clear()
            before = entry.snapshot
            server.tools = [tool(n, d) for n, d in tools]
            server.upstreams[-1].list_changed()
            with trio.fail_after(5):
                while entry.snapshot is before:
                    await trio.sleep(0.01)
            await trio.testing.wait_all_tasks_blocked()
            for (session, out), (prev_gen, prev_served) in zip(sessions, previous, strict=True):
                got = served(session.registry)
                for view in session.views.values():
                    snapshot = entry.snapshot
                    made = view.projection_of(snapshot)
                    fresh = project(
                        snapshot,
                        view.key,
                        view.name,
                        prefix=view.prefix,
                        budget=session.name_budget,
                    )
                    assert (made.tools, made.prompts, made.hidden_tools) == (
                        fresh.tools,
                        fresh.prompts,
                        fresh.hidden_tools,
                    )
                # The same generation computed again from nothing but the same inputs.
                clear_shared_caches()
                prev_gen.agg.moves.clear()
                again = build_candidate(
                    list(session.views.values()), number=0, settings_generation=0, previous=prev_gen
                )
                assert got == served(again)
                changed = got[2]["tools"] != prev_served[2]["tools"]
                told = ["notifications/tools/list_changed"] if changed else []
                assert out.notifications() == told
        nursery.cancel_scope.cancel()


@given(st.lists(tool_lists, min_size=2, max_size=4))
def test_relists_with_the_pools_ends_serve_what_a_fresh_build_serves(
    lists: list[list[tuple[str, str]]],
) -> None:
    trio.run(relisted_scenario, lists)
