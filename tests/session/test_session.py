"""Session: reconciliation through handles, registry generations, list_changed (R1-R6, S2-S6).

A real `Pool` on fake upstreams (`FakeNet`), a `FakeWriter` for the client side: no sockets, no
processes. Snapshot changes are published straight onto the pool entry, as a relist would.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import msgspec
import trio
import trio.lowlevel
import trio.testing
from fakes import FakeNet, FakeServer, FakeWriter, LogLines, desired, make_pool, stdio, tool

from mcpool.pool import EntryState, Pool, PoolEntry, ServerSettings
from mcpool.session import Session

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": "init",
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t"}},
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def send(session: Session, obj: dict[str, Any]) -> None:
    session.handle_line(json.dumps(obj).encode())


def handshake(session: Session) -> None:
    send(session, INITIALIZE)
    send(session, INITIALIZED)


class Rig:
    """One pool on fake upstreams, and sessions attached to it."""

    def __init__(self, nursery: trio.Nursery, **servers: FakeServer) -> None:
        self.nursery = nursery
        self.net = FakeNet(**servers)
        self.pool: Pool = make_pool(nursery, self.net)
        self._generation = 0

    def session(self, sid: str = "s1", log: LogLines | None = None) -> tuple[Session, FakeWriter]:
        out = FakeWriter()
        session = Session(sid, name=sid, cwd=None, pool=self.pool, out=out, log=log)
        self.nursery.start_soon(session.run_notifier)
        return session, out

    async def apply(
        self, session: Session, servers: dict[str, ServerSettings], *, pool: bool = True
    ) -> dict[str, str]:
        self._generation += 1
        want = {name: desired(name, s, pool=pool) for name, s in servers.items()}
        return dict(await session.apply_settings(want, self._generation))

    async def attached(
        self, servers: dict[str, ServerSettings], sid: str = "s1"
    ) -> tuple[Session, FakeWriter]:
        session, out = self.session(sid)
        await self.apply(session, servers)
        handshake(session)
        await settle()
        out.frames.clear()
        return session, out


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


def entry_of(session: Session, name: str = "srv") -> PoolEntry:
    handle = session.views[name].handle
    assert handle is not None
    return handle.entry


def publish(entry: PoolEntry, **changes: Any) -> None:
    snap = entry.snapshot
    entry.publish(msgspec.structs.replace(snap, generation=snap.generation + 1, **changes))


def tool_names(session: Session) -> list[str]:
    return [t["name"] for t in session.registry.tools]


def metas(session: Session) -> dict[str, dict[str, Any]]:
    return {t["name"]: t["_meta"] for t in session.registry.tools}


# -- R1-R5 through a session ---------------------------------------------------------------------


async def test_equivalent_settings_keep_handle_generation_and_send_nothing(
    nursery: trio.Nursery,
) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a"), tool("b")]))
    session, out = await rig.attached(
        {"srv": stdio(includeTools=["a", "b"], alwaysLoadTools=False)}
    )
    handle, registry = session.views["srv"].handle, session.registry
    report = await rig.apply(session, {"srv": stdio(includeTools=["b", "a(x)", "a"])})
    await settle()
    assert report == {"srv": "keep"}
    assert session.views["srv"].handle is handle
    assert session.registry is registry
    assert out.frames == []
    assert rig.net.servers["srv"].starts == 1


async def test_policy_change_refreshes_the_same_handle_and_replays_the_view(
    nursery: trio.Nursery,
) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a"), tool("b")]))
    session, out = await rig.attached({"srv": stdio()})
    handle, entry, number = session.views["srv"].handle, entry_of(session), session.registry.number
    report = await rig.apply(session, {"srv": stdio(includeTools=["a"], trust=True)})
    await settle()
    assert report == {"srv": "refresh"}
    assert session.views["srv"].handle is handle
    assert entry_of(session) is entry
    assert entry.leases == 1
    assert rig.net.servers["srv"].starts == 1
    assert tool_names(session) == ["srv__a"]
    assert metas(session)["srv__a"]["mcpool/trust"] is True
    assert session.registry.number == number + 1
    assert out.notifications() == ["notifications/tools/list_changed"]


async def test_identity_change_releases_and_acquires_a_new_handle(nursery: trio.Nursery) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")]))
    session, _ = await rig.attached({"srv": stdio(args=["1"])})
    old = session.views["srv"].handle
    assert old is not None
    report = await rig.apply(session, {"srv": stdio(args=["2"])})
    assert report == {"srv": "replace"}
    new = session.views["srv"].handle
    assert new is not None
    assert new is not old
    assert old.released
    assert new.entry is not old.entry
    assert old.entry.leases == 0
    assert rig.net.servers["srv"].starts == 2


async def test_removed_server_is_released_and_its_tools_go(nursery: trio.Nursery) -> None:
    rig = Rig(nursery, one=FakeServer([tool("a")]), two=FakeServer([tool("b")]))
    session, out = await rig.attached({"one": stdio("one"), "two": stdio("two")})
    handle = session.views["two"].handle
    assert handle is not None
    assert await rig.apply(session, {"one": stdio("one")}) == {"one": "keep", "two": "release"}
    await settle()
    assert handle.released
    assert list(session.views) == ["one"]
    assert tool_names(session) == ["one__a"]
    assert "two__b" not in session.registry.tool_routes
    assert out.notifications() == ["notifications/tools/list_changed"]


async def test_unpooled_session_scope_server_with_matching_identity_is_kept(
    nursery: trio.Nursery,
) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")]))
    session, _ = await rig.attached({"srv": stdio(scope="session")})
    handle = session.views["srv"].handle
    assert handle is not None
    assert handle.lifecycle_id.startswith("srv::unpooled-")
    assert await rig.apply(session, {"srv": stdio(scope="session")}) == {"srv": "keep"}
    assert await rig.apply(session, {"srv": stdio(scope="session", trust=True)}) == {
        "srv": "refresh"
    }
    assert session.views["srv"].handle is handle
    assert rig.net.servers["srv"].starts == 1


async def test_pool_off_policy_change_reconnects_and_rediscovers(nursery: trio.Nursery) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a"), tool("b")]))
    session, _ = rig.session()
    await rig.apply(session, {"srv": stdio()}, pool=False)
    first = session.views["srv"].handle
    same = await rig.apply(session, {"srv": stdio(excludeTools=[])}, pool=False)
    assert same == {"srv": "keep"}
    report = await rig.apply(session, {"srv": stdio(includeTools=["a"])}, pool=False)
    assert report == {"srv": "replace"}
    assert session.views["srv"].handle is not first
    assert rig.net.servers["srv"].starts == 2
    assert tool_names(session) == ["srv__a"]


async def test_pool_off_sessions_with_different_policies_get_separate_upstreams(
    nursery: trio.Nursery,
) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")]))
    a, _ = rig.session("a")
    b, _ = rig.session("b")
    await rig.apply(a, {"srv": stdio(trust=True)}, pool=False)
    await rig.apply(b, {"srv": stdio()}, pool=False)
    assert entry_of(a) is not entry_of(b)


async def test_in_place_settings_mutation_after_apply_changes_nothing_held(
    nursery: trio.Nursery,
) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a"), tool("b")]))
    settings = stdio(includeTools=["a"], args=["x"])
    session, out = await rig.attached({"srv": settings})
    view = session.views["srv"]
    key, identity, registry = view.key, view.handle.identity, session.registry  # type: ignore[union-attr]
    assert isinstance(settings.include_tools, list)
    settings.include_tools.append("b")
    settings.args.append("y")
    settings.trust = True
    session.rebuild()
    await settle()
    assert view.key is key
    assert view.handle.identity is identity  # type: ignore[union-attr]
    assert session.registry is registry
    assert tool_names(session) == ["srv__a"]
    assert out.frames == []
    # Handing the mutated object over again is seen as the change it is.
    assert await rig.apply(session, {"srv": settings}) == {"srv": "replace"}


async def test_always_load_is_projected_per_session_and_the_shared_snapshot_is_untouched(
    nursery: trio.Nursery,
) -> None:
    original = {**tool("a"), "_meta": {"vendor/x": 1}}
    rig = Rig(nursery, srv=FakeServer([original, tool("b")]))
    eager, eager_out = await rig.attached({"srv": stdio(alwaysLoadTools=True)}, "eager")
    plain, plain_out = await rig.attached({"srv": stdio()}, "plain")
    entry = entry_of(eager)
    assert entry is entry_of(plain)
    pristine = copy.deepcopy(entry.snapshot)
    eager_registry, plain_registry = (
        copy.deepcopy(eager.registry.tools),
        copy.deepcopy(plain.registry.tools),
    )

    assert metas(eager) == {
        "srv__a": {
            "vendor/x": 1,
            "mcpool/server": "srv",
            "anthropic/alwaysLoad": True,
            "mcpool/alwaysLoad": True,
        },
        "srv__b": {"mcpool/server": "srv", "anthropic/alwaysLoad": True, "mcpool/alwaysLoad": True},
    }
    assert metas(plain) == {
        "srv__a": {"vendor/x": 1, "mcpool/server": "srv"},
        "srv__b": {"mcpool/server": "srv"},
    }
    # The wire agrees: tools/list of the plain session carries no alwaysLoad.
    send(plain, {"jsonrpc": "2.0", "id": 7, "method": "tools/list"})
    listed = plain_out.responses()[-1]["result"]["tools"]
    assert all("anthropic/alwaysLoad" not in t["_meta"] for t in listed)

    # Flip the plain session to eager: only it changes; the other and the entry do not.
    eager_before = eager.registry
    await rig.apply(plain, {"srv": stdio(alwaysLoadTools=True)})
    await settle()
    assert all(m["anthropic/alwaysLoad"] is True for m in metas(plain).values())
    assert eager.registry is eager_before
    assert eager.registry.tools == eager_registry
    assert plain_registry != plain.registry.tools
    assert entry.snapshot == pristine
    assert entry.snapshot.tools[0]["_meta"] == {"vendor/x": 1}
    assert plain_out.notifications() == ["notifications/tools/list_changed"]
    assert eager_out.notifications() == []


async def test_refresh_during_a_restart_is_accepted_and_the_next_publish_applies_it(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeServer([tool("a"), tool("b")])
    rig = Rig(nursery, srv=server)
    session, _out = await rig.attached({"srv": stdio()})
    entry, handle = entry_of(session), session.views["srv"].handle
    server.start_gate = trio.Event()
    server.current.crash()
    await settle()
    assert entry.state is EntryState.RESTARTING
    assert tool_names(session) == []  # the crash published an unavailable snapshot

    report = await rig.apply(session, {"srv": stdio(includeTools=["b"], alwaysLoadTools=True)})
    assert report == {"srv": "refresh"}
    assert session.views["srv"].handle is handle
    await trio.sleep(5)  # past the backoff, within the start timeout: waiting at the gate
    assert entry.state is EntryState.RESTARTING
    server.start_gate.set()
    await settle()
    assert entry.state is EntryState.ACTIVE
    assert entry_of(session) is entry
    assert server.starts == 2
    assert tool_names(session) == ["srv__b"]
    assert metas(session)["srv__b"]["anthropic/alwaysLoad"] is True


# -- S3, S4: generations -------------------------------------------------------------------------


async def test_empty_or_whitespace_name_keeps_the_exact_previous_generation(
    nursery: trio.Nursery,
) -> None:
    logs = LogLines()
    rig = Rig(nursery, srv=FakeServer([tool("a")]))
    session, out = rig.session(log=logs)
    await rig.apply(session, {"srv": stdio()})
    handshake(session)
    await settle()
    out.frames.clear()
    entry, previous = entry_of(session), session.registry
    for bad in ["", "  ", " a", "a\t"]:
        publish(entry, tools=(tool("a"), tool(bad)))
        await settle()
        assert session.registry is previous
        assert session.last_error is not None
    assert "whitespace" in session.last_error
    assert any("registry candidate rejected" in line for line in logs)
    assert out.frames == []
    # A later valid change publishes normally.
    publish(entry, tools=(tool("a"), tool("c")))
    await settle()
    assert session.registry is not previous
    assert session.last_error is None
    assert tool_names(session) == ["srv__a", "srv__c"]
    assert out.notifications() == ["notifications/tools/list_changed"]


async def test_collision_rejects_and_keeps_the_exact_previous_generation(
    nursery: trio.Nursery,
) -> None:
    rig = Rig(nursery, one=FakeServer([tool("a")]), two=FakeServer([tool("b")]))
    session, out = await rig.attached(
        {"one": stdio("one", prefix=False), "two": stdio("two", prefix=False)}
    )
    previous = session.registry
    publish(entry_of(session, "two"), tools=(tool("b"), tool("a")))
    await settle()
    assert session.registry is previous
    assert session.last_error is not None
    assert "which server 'one' uses" in session.last_error
    assert session.registry.tool_routes["a"].view.name == "one"
    assert out.frames == []


async def test_rename_changes_lookup_and_listing_atomically(nursery: trio.Nursery) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("old")]))
    session, out = await rig.attached({"srv": stdio()})
    upstream = rig.net.servers["srv"].current
    before = session.registry
    publish(entry_of(session), tools=(tool("new"),))
    after = session.registry
    assert [t["name"] for t in before.tools] == list(before.tool_routes) == ["srv__old"]
    assert [t["name"] for t in after.tools] == list(after.tool_routes) == ["srv__new"]

    send(
        session, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "srv__old"}}
    )
    gone = out.responses()[-1]["result"]
    assert gone["isError"] is True
    assert gone["content"][0]["text"].startswith("Unknown tool: srv__old")
    send(
        session,
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "srv__new", "arguments": {}},
        },
    )
    uid, method, params = upstream.sent[-1]
    assert (method, params["name"]) == ("tools/call", "new")
    upstream.reply(uid, {"content": []})
    assert out.responses()[-1] == {"jsonrpc": "2.0", "id": 2, "result": {"content": []}}


async def test_tools_list_reads_one_generation_in_upstream_order(nursery: trio.Nursery) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("z"), tool("a", properties={"y": {}, "b": {}})]))
    session, out = await rig.attached({"srv": stdio()})
    send(session, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    listed = out.responses()[-1]["result"]["tools"]
    assert [t["name"] for t in listed] == ["srv__z", "srv__a"]
    assert list(listed[1]["inputSchema"]["properties"]) == ["y", "b"]


async def test_concurrent_readers_during_1000_swaps_see_whole_generations(
    nursery: trio.Nursery,
) -> None:
    first = (tool("a"), tool("b"), tool("c"))
    second = (tool("x"), tool("y"))
    rig = Rig(nursery, srv=FakeServer(list(first)))
    session, out = await rig.attached({"srv": stdio()})
    entry = entry_of(session)
    valid = {("srv__a", "srv__b", "srv__c"), ("srv__x", "srv__y")}
    swaps_done = trio.Event()
    reads = 0

    async def reader(rid: int) -> None:
        nonlocal reads
        request_id = 0
        while not swaps_done.is_set():
            gen = session.registry  # one reference per operation
            names = tuple(t["name"] for t in gen.tools)
            assert names in valid
            assert tuple(gen.tool_routes) == names
            request_id += 1
            send(session, {"jsonrpc": "2.0", "id": f"{rid}-{request_id}", "method": "tools/list"})
            answer = out.frames[-1]
            assert answer["id"] == f"{rid}-{request_id}"
            assert tuple(t["name"] for t in answer["result"]["tools"]) in valid
            reads += 1
            await trio.lowlevel.checkpoint()

    async def writer() -> None:
        for i in range(1000):
            publish(entry, tools=second if i % 2 == 0 else first)
            await trio.lowlevel.checkpoint()
        swaps_done.set()

    async with trio.open_nursery() as inner:
        for rid in range(4):
            inner.start_soon(reader, rid)
        inner.start_soon(writer)
    assert reads >= 1000
    assert entry.snapshot.generation == 1001
    assert tool_names(session) == ["srv__a", "srv__b", "srv__c"]


# -- S5: notifications ---------------------------------------------------------------------------


async def test_no_notification_for_the_first_generation_even_after_an_early_handshake(
    nursery: trio.Nursery,
) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")]))
    session, out = rig.session()
    handshake(session)  # backlogged until the first generation exists
    assert out.frames == []
    await rig.apply(session, {"srv": stdio()})
    await settle()
    assert out.responses()[0]["id"] == "init"
    assert out.notifications() == []
    assert session.initialized


async def test_no_notification_before_initialized_and_missed_changes_are_not_queued(
    nursery: trio.Nursery,
) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")]))
    session, out = rig.session()
    await rig.apply(session, {"srv": stdio()})
    send(session, INITIALIZE)
    entry = entry_of(session)
    publish(entry, tools=(tool("b"),))
    await settle()
    assert out.notifications() == []
    send(session, INITIALIZED)
    await settle()
    assert out.notifications() == []  # the missed change is not replayed
    publish(entry, tools=(tool("c"),))
    await settle()
    assert out.notifications() == ["notifications/tools/list_changed"]


async def test_initialized_before_the_initialize_answer_is_ignored(nursery: trio.Nursery) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")]))
    session, out = rig.session()
    await rig.apply(session, {"srv": stdio()})
    send(session, INITIALIZED)
    send(session, INITIALIZE)
    assert not session.initialized
    publish(entry_of(session), tools=(tool("b"),))
    await settle()
    assert out.notifications() == []


async def test_exactly_one_frame_per_real_change_and_none_for_equivalent_ones(
    nursery: trio.Nursery,
) -> None:
    schema = {
        "required": ["p", "q"],
        "properties": {"p": {"type": ["string", "null"]}, "q": {"default": [1, 2]}},
    }
    rig = Rig(nursery, srv=FakeServer([tool("a", **schema)]))
    session, out = await rig.attached({"srv": stdio()})
    entry = entry_of(session)

    equivalent = {
        "required": ["q", "p"],
        "properties": {"p": {"type": ["null", "string"]}, "q": {"default": [1, 2]}},
    }
    publish(entry, tools=(tool("a", **equivalent),))
    await settle()
    assert out.frames == []

    reordered_default = {
        **equivalent,
        "properties": {**equivalent["properties"], "q": {"default": [2, 1]}},
    }
    publish(entry, tools=(tool("a", **reordered_default),))
    await settle()
    assert out.notifications() == ["notifications/tools/list_changed"]

    publish(entry, prompts=({"name": "p"},))
    await settle()
    assert out.notifications() == [
        "notifications/tools/list_changed",
        "notifications/prompts/list_changed",
    ]
    assert session.notifications_sent == 2


async def test_changes_while_the_writer_is_blocked_coalesce_to_one_frame_per_kind(
    nursery: trio.Nursery,
) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")]))
    session, out = await rig.attached({"srv": stdio()})
    entry = entry_of(session)
    out.block()
    for i in range(5):
        publish(entry, tools=(tool("a"), tool(f"t{i}")))
        await settle()
    publish(entry, resources=({"uri": "file:///r"},))
    await settle()
    assert out.notifications() == []
    assert out.drain_waits == 1
    out.unblock()
    await settle()
    assert out.notifications() == [
        "notifications/tools/list_changed",
        "notifications/resources/list_changed",
    ]
    # Nothing left over: the next real change is one more frame, no replay of the old ones.
    publish(entry, tools=(tool("a"),))
    await settle()
    assert out.notifications("tools") == ["notifications/tools/list_changed"] * 2
    assert len(out.notifications()) == 3


async def test_a_change_for_one_session_does_not_notify_another(nursery: trio.Nursery) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a"), tool("b")]))
    only_a, a_out = await rig.attached({"srv": stdio(includeTools=["a"])}, "only-a")
    both, both_out = await rig.attached({"srv": stdio()}, "both")
    publish(entry_of(both), tools=(tool("a"), tool("b"), tool("c")))
    await settle()
    assert both_out.notifications() == ["notifications/tools/list_changed"]
    assert a_out.notifications() == []
    assert tool_names(only_a) == ["srv__a"]


async def test_initialize_advertises_list_changed_for_every_kind(nursery: trio.Nursery) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")]))
    session, out = rig.session()
    await rig.apply(session, {"srv": stdio()})
    send(session, INITIALIZE)
    caps = out.responses()[-1]["result"]["capabilities"]
    assert caps["tools"]["listChanged"] is True
    assert caps["prompts"]["listChanged"] is True
    assert caps["resources"]["listChanged"] is True


async def test_stale_settings_generation_is_discarded(nursery: trio.Nursery) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")]))
    session, _out = await rig.attached({"srv": stdio()})
    registry = session.registry
    newer = {"srv": desired("srv", stdio(trust=True))}
    await session.apply_settings(newer, 10)
    installed = session.registry
    assert installed is not registry
    stale = {"srv": desired("srv", stdio(includeTools=[]))}
    assert await session.apply_settings(stale, 9) == []
    assert session.registry is installed
    assert tool_names(session) == ["srv__a"]
