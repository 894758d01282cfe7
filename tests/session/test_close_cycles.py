"""A closed session goes by reference counting alone: no reference cycle keeps it, its views, its
handles or its generations alive until a full collection.

The daemon freezes its heap and collects the young generation seldom (daemon/_daemon.py), so a
cycle left by every closed session grew its memory under attach/detach churn. These tests run
with the collector off: what a closed session leaves in a cycle stays, and the weak references
say so. A real `Pool` on fake upstreams (`FakeNet`), a `FakeWriter` for the client side.
"""

from __future__ import annotations

import json
import weakref
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from fakes import FakeNet, FakeServer, FakeWriter, desired, make_pool, stdio, tool
from msgspec import Raw

from mcpool.pool import Pool, ServerSettings
from mcpool.protocol import Message
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


def call(session: Session, rid: int, tool_name: str) -> None:
    send(
        session,
        {
            "jsonrpc": "2.0",
            "id": rid,
            "method": "tools/call",
            "params": {"name": tool_name, "arguments": {}},
        },
    )


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


def dead(refs: dict[str, weakref.ref[Any]]) -> list[str]:
    """The names of the watched objects still alive."""
    return sorted(name for name, ref in refs.items() if ref() is not None)


async def attach(
    nursery: trio.Nursery, pool: Pool, servers: dict[str, ServerSettings], generation: int = 1
) -> tuple[Session, FakeWriter]:
    out = FakeWriter()
    session = Session("s1", name="s1", cwd=None, pool=pool, out=out)
    nursery.start_soon(session.run_notifier)
    await session.apply_settings({n: desired(n, s) for n, s in servers.items()}, generation)
    send(session, INITIALIZE)
    send(session, INITIALIZED)
    await settle()
    return session, out


def watch(session: Session) -> dict[str, weakref.ref[Any]]:
    refs: dict[str, weakref.ref[Any]] = {"session": weakref.ref(session)}
    for name, view in session.views.items():
        refs[f"view {name}"] = weakref.ref(view)
        assert view.handle is not None
        refs[f"handle {name}"] = weakref.ref(view.handle)
    return refs


@pytest.mark.usefixtures("no_collector")
async def test_a_closed_session_its_views_and_handles_go_without_the_collector(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    net = FakeNet(srv=FakeServer([tool("a")]), lz=FakeServer([tool("b")]))
    pool = make_pool(nursery, net, drain_grace=1.0)
    lazy = stdio("lz", start="lazy")
    # A first session learns the lazy server's lists; once it drained, the next one's call to
    # it waits for its start (parked) before it is forwarded.
    learner, _ = await attach(nursery, pool, {"lz": lazy})
    learner.close("done")
    await trio.sleep(2)  # past the drain grace
    assert pool.entries() == []
    session, out = await attach(nursery, pool, {"srv": stdio("srv"), "lz": lazy})
    call(session, 1, "srv__a")  # forwarded and answered
    call(session, 2, "lz__b")  # parked until its server is up, then forwarded and answered
    call(session, 3, "srv__a")  # still at the upstream when the session closes
    await settle()
    up = net.servers["srv"].current
    up.reply(up.sent[0][0], {"content": []})
    lz = net.servers["lz"].current
    lz.reply(lz.sent[-1][0], {"content": []})
    await settle()
    assert [r["id"] for r in out.responses()] == ["init", 1, 2]
    refs = watch(session)
    session.close("the client disconnected")
    session.close("again")  # idempotent
    await settle()  # the notifier task ends
    assert [r["id"] for r in out.responses()] == ["init", 1, 2, 3]  # the one left is answered
    del session
    assert dead(refs) == []


@pytest.mark.usefixtures("no_collector")
async def test_a_view_let_go_by_a_reconciliation_goes_without_the_collector(
    nursery: trio.Nursery,
) -> None:
    net = FakeNet(srv=FakeServer([tool("a")]))
    pool = make_pool(nursery, net)
    session, _out = await attach(nursery, pool, {"srv": stdio("srv")})
    replaced = watch(session)
    del replaced["session"]
    # R1: other transport settings, a new handle and view; the old ones are let go.
    await session.apply_settings({"srv": desired("srv", stdio("srv", args=["--v2"]))}, 2)
    await settle()
    assert dead(replaced) == []
    assert session.views["srv"].handle is not None
    removed = watch(session)
    del removed["session"]
    await session.apply_settings({}, 3)  # the server removed
    await settle()
    assert dead(removed) == []


@pytest.mark.usefixtures("no_collector")
async def test_a_view_let_go_while_its_call_is_out_goes_once_the_call_ends(
    nursery: trio.Nursery,
) -> None:
    net = FakeNet(srv=FakeServer([tool("a")]))
    pool = make_pool(nursery, net)
    session, out = await attach(nursery, pool, {"srv": stdio("srv")})
    params = {"name": "srv__a", "arguments": {}, "_meta": {"progressToken": "p1"}}
    send(session, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
    up = net.servers["srv"].current
    uid, _method, sent = up.sent[-1]
    replaced = watch(session)
    del replaced["session"]
    await session.apply_settings({"srv": desired("srv", stdio("srv", args=["--v2"]))}, 2)
    await settle()
    # The call goes on on the old handle: its progress and its answer still reach the client.
    progress = {"progressToken": sent["_meta"]["progressToken"], "progress": 1}
    up.events.on_notification("notifications/progress", Raw(json.dumps(progress).encode()))
    assert [f["params"]["progressToken"] for f in out.frames if "method" in f] == ["p1"]
    assert dead(replaced) == ["handle srv", "view srv"]
    up.reply(uid, {"content": []})
    assert [r["id"] for r in out.responses()] == ["init", 1]
    await settle()
    assert dead(replaced) == []


async def test_a_session_dropped_without_a_close_leaves_the_pools_tasks_unharmed(
    nursery: trio.Nursery,
) -> None:
    # What a session owns holds it weakly (so no cycle keeps it): a view outliving it, still
    # leased in the pool, is told of a list change, a notification and a server request in the
    # pool's shared tasks; it does nothing there, and another session of the server is served.
    net = FakeNet(srv=FakeServer([tool("a")]))
    pool = make_pool(nursery, net)
    other, other_out = await attach(nursery, pool, {"srv": stdio("srv")})
    # No notifier task (which holds its session until the close): a session nothing holds.
    dropped = Session("s2", name="s2", cwd=None, pool=pool, out=FakeWriter())
    await dropped.apply_settings({"srv": desired("srv", stdio("srv"))}, 1)
    view = dropped.views["srv"]
    gone = weakref.ref(dropped)
    del dropped
    assert gone() is None
    entry = view.handle.entry if view.handle is not None else None
    assert entry is not None and view.handle is not None and not view.handle.released
    snap = entry.snapshot
    entry.publish(msgspec.structs.replace(snap, generation=snap.generation + 1, tools=()))
    view.upstream_notification(entry, "notifications/message", Raw(b'{"level":"info"}'))
    up = net.servers["srv"].current
    ask = Message(jsonrpc="2.0", id=1, method="roots/list", params=Raw(b"{}"))
    assert view.server_request(entry, up, ask) == "the session this request was for is gone"
    await settle()
    assert other.registry.tools == ()
    assert "notifications/tools/list_changed" in [
        f.get("method") for f in other_out.frames if "method" in f
    ]
