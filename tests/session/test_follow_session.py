"""Issue 29 item 5: a session's subscriptions and log level follow it to every connection that
replaces one of its servers' (a transport change, pooling off with a policy change, a restart, a
crash), through one path: the pool's shared state, joined with the new lease and told to the
upstream when it runs or once it starts. A real `Pool` on fake upstreams (`FakeNet`)."""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing
from fakes import FakeNet, FakeServer, FakeWriter, desired, make_pool, stdio, tool

from mcpool.pool import Pool, ServerSettings
from mcpool.session import Session

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": "init",
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t"}},
}
URI = "file:///watched.md"


def send(session: Session, obj: dict[str, Any]) -> None:
    session.handle_line(json.dumps(obj).encode())


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


async def attach(
    nursery: trio.Nursery, pool: Pool, servers: dict[str, ServerSettings], generation: int
) -> tuple[Session, FakeWriter]:
    out = FakeWriter()
    session = Session("s1", name="s1", cwd=None, pool=pool, out=out)
    nursery.start_soon(session.run_notifier)
    await session.apply_settings({n: desired(n, s) for n, s in servers.items()}, generation)
    send(session, INITIALIZE)
    send(session, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    await settle()
    return session, out


def told(net: FakeNet, upstream_index: int = -1) -> list[tuple[str, Any]]:
    """What the server's given connection was asked of the session's state."""
    up = net.servers["srv"].upstreams[upstream_index]
    return [(m, p) for _u, m, p in up.sent if m in ("resources/subscribe", "logging/setLevel")]


def subscribe_and_set_level(session: Session, net: FakeNet) -> None:
    send(
        session,
        {"jsonrpc": "2.0", "id": 1, "method": "resources/subscribe", "params": {"uri": URI}},
    )
    send(
        session,
        {"jsonrpc": "2.0", "id": 2, "method": "logging/setLevel", "params": {"level": "debug"}},
    )
    up = net.servers["srv"].current
    for uid, _m, _p in list(up.sent):
        if uid in up._pending:
            up.reply(uid, {})


def server() -> FakeServer:
    s = FakeServer([tool("a")], resources=[{"uri": URI, "name": "w"}])
    s.capabilities = {"tools": {}, "resources": {"subscribe": True}, "logging": {}}
    return s


async def test_a_transport_change_takes_the_subscriptions_and_level_to_the_new_process(
    nursery: trio.Nursery,
) -> None:
    net = FakeNet(srv=server())
    pool = make_pool(nursery, net)
    session, _out = await attach(nursery, pool, {"srv": stdio("srv")}, 1)
    subscribe_and_set_level(session, net)
    assert told(net) == [
        ("resources/subscribe", {"uri": URI}),
        ("logging/setLevel", {"level": "debug"}),
    ]
    await session.apply_settings({"srv": desired("srv", stdio("srv", env={"V": "2"}))}, 2)
    await settle()
    assert net.servers["srv"].starts == 2
    assert sorted(told(net), key=str) == sorted(
        [("resources/subscribe", {"uri": URI}), ("logging/setLevel", {"level": "debug"})], key=str
    )
    # The new handle holds them: an unsubscribe reaches the new process.
    send(
        session,
        {"jsonrpc": "2.0", "id": 3, "method": "resources/unsubscribe", "params": {"uri": URI}},
    )
    up = net.servers["srv"].current
    assert [p for _u, m, p in up.sent if m == "resources/unsubscribe"] == [{"uri": URI}]


async def test_joining_a_running_connection_tells_it_at_once(nursery: trio.Nursery) -> None:
    net = FakeNet(srv=server())
    pool = make_pool(nursery, net)
    # Another session already runs the server with the new settings (the process is up).
    _other, _ = await attach(nursery, pool, {"srv": stdio("srv", env={"V": "2"})}, 1)
    session, _out = await attach(nursery, pool, {"srv": stdio("srv")}, 1)
    subscribe_and_set_level(session, net)
    running = net.servers["srv"].upstreams[0]
    assert told(net, 0) == []
    await session.apply_settings({"srv": desired("srv", stdio("srv", env={"V": "2"}))}, 2)
    await settle()
    assert net.servers["srv"].starts == 2  # joined, nothing new started
    assert running.alive
    assert told(net, 0) == [
        ("logging/setLevel", {"level": "debug"}),
        ("resources/subscribe", {"uri": URI}),
    ]


async def test_pooling_off_a_policy_change_keeps_them(nursery: trio.Nursery) -> None:
    # With pooling off the identity includes the policy: a policy change is a new process.
    net = FakeNet(srv=server())
    pool = make_pool(nursery, net)
    plain = desired("srv", stdio("srv", scope="session"))
    session = Session("s1", name="s1", cwd=None, pool=pool, out=FakeWriter())
    nursery.start_soon(session.run_notifier)
    await session.apply_settings({"srv": plain}, 1)
    send(session, INITIALIZE)
    send(session, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    await settle()
    subscribe_and_set_level(session, net)
    changed = desired("srv", stdio("srv", scope="session", args=["--policy-b"]))
    await session.apply_settings({"srv": changed}, 2)
    await settle()
    assert net.servers["srv"].starts == 2
    assert sorted(told(net), key=str) == sorted(
        [("resources/subscribe", {"uri": URI}), ("logging/setLevel", {"level": "debug"})], key=str
    )
