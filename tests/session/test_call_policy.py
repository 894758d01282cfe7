"""Serving an older generation never authorizes what the current settings forbid (DESIGN S8,
issue 15 points 1, 7, 9 and 11).

A real `Pool` on fake upstreams (`FakeNet`), a `FakeWriter` for the client side: no sockets, no
processes. A gated start (`FakeServer.start_gate`) holds a settings change between reconcile
and publication, which is when the served generation predates the session's policy.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import trio
import trio.testing
from fakes import FakeNet, FakeServer, FakeWriter, LogLines, desired, make_pool, stdio, tool

from mcpool.pool import Pool, PoolEntry, ServerSettings
from mcpool.session import Session

WAIT = 5.0  # every wait below is bounded by this (the mock-free trio clock)

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": "init",
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t"}},
}


class Rig:
    def __init__(self, nursery: trio.Nursery, **servers: FakeServer) -> None:
        self.net = FakeNet(**servers)
        self.pool: Pool = make_pool(nursery, self.net)
        self.nursery = nursery
        self.generation = 0
        self.logs = LogLines()

    async def attached(self, servers: dict[str, ServerSettings]) -> tuple[Session, FakeWriter]:
        out = FakeWriter()
        session = Session("s1", name="s1", cwd=None, pool=self.pool, out=out, log=self.logs)
        self.nursery.start_soon(session.run_notifier)
        await self.apply(session, servers)
        send(session, INITIALIZE)
        send(session, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        await settle()
        out.frames.clear()
        return session, out

    async def apply(self, session: Session, servers: dict[str, ServerSettings]) -> None:
        self.generation += 1
        want = {name: desired(name, s) for name, s in servers.items()}
        await session.apply_settings(want, self.generation)


def send(session: Session, obj: dict[str, Any]) -> None:
    session.handle_line(json.dumps(obj).encode())


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


def entry_of(session: Session, name: str) -> PoolEntry:
    handle = session.views[name].handle
    assert handle is not None
    return handle.entry


def publish(entry: PoolEntry, **changes: Any) -> None:
    snap = entry.snapshot
    entry.publish(msgspec.structs.replace(snap, generation=snap.generation + 1, **changes))


def tool_names(session: Session) -> list[str]:
    return [t["name"] for t in session.registry.tools]


def request(session: Session, out: FakeWriter, rid: str, method: str, **params: Any) -> Any:
    """Send one request; the answer if mcpool gave one at once, else None (forwarded)."""
    send(session, {"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
    for frame in out.frames:
        if frame.get("id") == rid:
            return frame
    return None


def unknown_tool(answer: Any, name: str) -> bool:
    return answer is not None and answer["result"] == {
        "content": [
            {"type": "text", "text": f"Unknown tool: {name} (no server of this session exposes it)"}
        ],
        "isError": True,
    }


def forwarded(rig: Rig, server: str, method: str) -> list[Any]:
    return [p for _, m, p in rig.net.servers[server].current.sent if m == method]


# -- 1a: every call, read, get and subscribe checks the current policy ----------------------------


async def test_an_older_generation_being_served_never_authorizes_what_settings_forbid(
    nursery: trio.Nursery,
) -> None:
    rig = Rig(
        nursery,
        srv=FakeServer([tool("a"), tool("b")], prompts=[{"name": "p"}, {"name": "q"}]),
        gone=FakeServer([tool("x")], resources=[{"uri": "file:///gone"}]),
        slow=FakeServer([tool("s")]),
    )
    for name in ("srv", "slow"):  # `gone` is the only server with resources
        rig.net.servers[name].capabilities = {"tools": {}, "prompts": {}}
    session, out = await rig.attached({"srv": stdio("srv"), "gone": stdio("gone")})
    served = session.registry
    # A settings change excludes a and p, drops `gone` (disabled), and adds a server that is
    # slow to start: the pipeline waits for it, and the old generation is still served.
    rig.net.servers["slow"].start_gate = gate = trio.Event()
    done = trio.Event()

    async def change() -> None:
        await rig.apply(
            session, {"srv": stdio("srv", excludeTools=["a", "p"]), "slow": stdio("slow")}
        )
        done.set()

    nursery.start_soon(change)
    await settle()
    assert session.registry is served
    assert "srv__a" in tool_names(session) and "gone__x" in tool_names(session)
    # Filtered, disabled: answered exactly as a name never listed.
    assert unknown_tool(request(session, out, "1", "tools/call", name="srv__a"), "srv__a")
    assert unknown_tool(request(session, out, "2", "tools/call", name="gone__x"), "gone__x")
    assert unknown_tool(request(session, out, "3", "tools/call", name="nope"), "nope")
    got = request(session, out, "4", "prompts/get", name="srv__p")
    assert got["error"]["message"] == "Unknown prompt: srv__p"
    read = request(session, out, "5", "resources/read", uri="file:///gone")
    assert read["error"]["message"] == "Resource not found"
    sub = request(session, out, "6", "resources/subscribe", uri="file:///gone")
    assert sub["error"]["message"] == "Resource not found"
    done_complete = request(
        session,
        out,
        "7",
        "completion/complete",
        ref={"type": "ref/prompt", "name": "srv__p"},
        argument={"name": "n", "value": "v"},
    )
    assert "unknown prompt" in done_complete["error"]["data"]["reason"]
    # What the policy still allows goes through.
    assert request(session, out, "8", "tools/call", name="srv__b") is None
    assert request(session, out, "9", "prompts/get", name="srv__q") is None
    assert forwarded(rig, "srv", "tools/call") == [{"name": "b"}]
    assert forwarded(rig, "srv", "prompts/get") == [{"name": "q"}]
    assert forwarded(rig, "gone", "resources/read") == []
    assert forwarded(rig, "gone", "resources/subscribe") == []
    gate.set()
    with trio.fail_after(WAIT):
        await done.wait()
    assert tool_names(session) == ["srv__b", "slow__s"]


# -- 1b: one server's bad snapshot does not freeze the others -------------------------------------


async def test_a_bad_snapshot_rejects_only_its_server_and_policy_changes_publish(
    nursery: trio.Nursery,
) -> None:
    rig = Rig(nursery, one=FakeServer([tool("a"), tool("b")]), two=FakeServer([tool("c")]))
    session, out = await rig.attached({"one": stdio("one"), "two": stdio("two")})
    publish(entry_of(session, "two"), tools=(tool("c"), tool(" y")))
    await settle()
    assert list(session.registry_errors) == ["two"]
    assert "' y' tool name has leading or trailing whitespace" in session.registry_errors["two"]
    assert "its last accepted lists stay served" in session.registry_errors["two"]
    assert session.last_error == session.registry_errors["two"]
    assert tool_names(session) == ["one__a", "one__b", "two__c"]
    assert any("registry candidate rejected" in line for line in rig.logs.at("warning"))
    assert out.notifications() == []
    # The user excludes a tool of the healthy server, and one of the bad server's.
    await rig.apply(
        session,
        {"one": stdio("one", excludeTools=["a"]), "two": stdio("two", excludeTools=["c"])},
    )
    await settle()
    assert tool_names(session) == ["one__b"]
    assert unknown_tool(request(session, out, "1", "tools/call", name="one__a"), "one__a")
    assert unknown_tool(request(session, out, "2", "tools/call", name="two__c"), "two__c")
    assert out.notifications() == ["notifications/tools/list_changed"]
    assert list(session.registry_errors) == ["two"]
    # The upstream fixes its list: the error goes, and its new tools arrive.
    publish(entry_of(session, "two"), tools=(tool("c"), tool("y")))
    await settle()
    assert session.registry_errors == {} and session.last_error is None
    assert tool_names(session) == ["one__b", "two__y"]


async def test_case_insensitive_collision_rejects_the_server_that_took_the_name(
    nursery: trio.Nursery,
) -> None:
    rig = Rig(nursery, one=FakeServer([tool("X")]), two=FakeServer([tool("b")]))
    session, _ = await rig.attached(
        {"one": stdio("one", prefix=False), "two": stdio("two", prefix=False)}
    )
    publish(entry_of(session, "two"), tools=(tool("b"), tool("x")))
    await settle()
    assert "differs only in case from 'X' (server 'one')" in session.registry_errors["two"]
    assert tool_names(session) == ["X", "b"]
    assert session.registry.tool_route("X").view.name == "one"  # type: ignore[union-attr]


# -- 9: a stale error goes when the settings return to the published state -----------------------


async def test_registry_error_clears_when_the_settings_return_to_the_published_state(
    nursery: trio.Nursery,
) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a"), tool(" hidden")]))
    session, out = await rig.attached({"srv": stdio(includeTools=["a"])})
    served = session.registry
    assert session.last_error is None
    await rig.apply(session, {"srv": stdio()})  # shows the bad name: rejected
    assert session.last_error is not None and "' hidden'" in session.last_error
    assert tool_names(session) == ["srv__a"]
    await rig.apply(session, {"srv": stdio(includeTools=["a"])})  # back as published
    assert session.last_error is None
    assert session.registry_errors == {}
    assert session.registry is served
    await settle()
    assert out.notifications() == []


# -- 11: generations are logged -----------------------------------------------------------------


async def test_generations_rejections_and_discarded_candidates_are_logged(
    nursery: trio.Nursery,
) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")], prompts=[{"name": "p"}]))
    session, _ = await rig.attached({"srv": stdio(env={"TOKEN": "secret-value"})})
    debug = rig.logs.at("debug")
    assert debug == [
        "session s1: generation 1 published (settings): 1 tools, 1 prompts, 0 resources, "
        "0 resource templates; changed: tools, prompts"
    ]
    publish(entry_of(session, "srv"), tools=(tool("a"), tool("b")))
    await settle()
    assert rig.logs.at("debug")[-1] == (
        "session s1: generation 2 published (upstream): 2 tools, 1 prompts, 0 resources, "
        "0 resource templates; changed: tools"
    )
    session.set_name_budget(explicit=20, configured=None)
    assert "generation 3 published (budget)" in rig.logs.at("debug")[-1]
    publish(entry_of(session, "srv"), tools=(tool("a"), tool("b "), tool("c")))
    await settle()
    (warning,) = rig.logs.at("warning")
    assert warning.startswith("session s1: registry candidate rejected: server 'srv': 'b '")
    assert len(rig.logs.at("debug")) == 3  # the fallback serves what is served: no generation
    # A candidate older than the installed settings generation is discarded, with a warning.
    await session.apply_settings({"srv": desired("srv", stdio(trust=True))}, 10)
    await session.apply_settings({"srv": desired("srv", stdio())}, 9)
    assert "settings generation 9 discarded" in rig.logs.at("warning")[-1]
    assert not any("secret-value" in line for line in rig.logs)


async def test_refusal_says_why_a_served_route_is_refused_while_a_reload_waits(
    nursery: trio.Nursery,
) -> None:
    rig = Rig(
        nursery,
        srv=FakeServer([tool("a"), tool("b")]),
        gone=FakeServer([tool("x")]),
        slow=FakeServer([tool("s")]),
    )
    session, _out = await rig.attached({"srv": stdio("srv"), "gone": stdio("gone")})
    gen = session.registry
    assert [session.refusal(r) for r in gen.tool_routes.values()] == [None, None, None]
    # A change excludes a and drops `gone`, and waits for a server slow to start.
    rig.net.servers["slow"].start_gate = gate = trio.Event()
    done = trio.Event()

    async def change() -> None:
        await rig.apply(session, {"srv": stdio("srv", excludeTools=["a"]), "slow": stdio("slow")})
        done.set()

    nursery.start_soon(change)
    await settle()
    assert session.registry is gen  # still served
    routes = gen.tool_routes
    refused = {name: session.refusal(route) for name, route in routes.items()}
    assert refused == {
        "srv__a": "hidden by policy (excluded by excludeTools); still listed until the reload ends",
        "srv__b": None,
        "gone__x": (
            "server 'gone' is no longer this session's (removed, disabled or replaced in its "
            "settings); still listed until the reload ends"
        ),
    }
    # What it says is what a call does: refused exactly where it gives a reason.
    allowed = {n for n, r in routes.items() if session.catalog.allows(r) is None}
    assert allowed == {"srv__a", "gone__x"}
    gate.set()
    with trio.fail_after(WAIT):
        await done.wait()
    assert [session.refusal(r) for r in session.registry.tool_routes.values()] == [None, None]


# -- issue 29 item 7: a URI no current server claims is never forwarded ----------------------------


async def test_a_uri_no_current_server_lists_or_matches_is_not_forwarded(
    nursery: trio.Nursery,
) -> None:
    rig = Rig(
        nursery,
        docs=FakeServer(
            [tool("a")],
            resources=[{"uri": "file:///docs/a.md", "name": "a"}],
            resource_templates=[{"uriTemplate": "file:///docs/{name}", "name": "doc"}],
        ),
        off=FakeServer([tool("b")], resources=[{"uri": "file:///off/b.md", "name": "b"}]),
    )
    session, out = await rig.attached({"docs": stdio("docs"), "off": stdio("off")})
    # Listed, and matched by a template: forwarded to the server that claims it.
    assert request(session, out, "1", "resources/read", uri="file:///docs/a.md") is None
    assert request(session, out, "2", "resources/read", uri="file:///docs/other") is None
    assert forwarded(rig, "docs", "resources/read") == [
        {"uri": "file:///docs/a.md"},
        {"uri": "file:///docs/other"},
    ]
    # `off` is disabled: `docs` is now the only server with resources, and is not asked.
    await rig.apply(session, {"docs": stdio("docs")})
    await settle()
    for rid, method, uri in [
        ("3", "resources/read", "file:///off/b.md"),
        ("4", "resources/subscribe", "file:///off/b.md"),
        ("5", "resources/read", "file:///nobody/lists/this"),
    ]:
        answer = request(session, out, rid, method, uri=uri)
        assert answer is not None and answer["error"]["code"] == -32002, answer
        assert uri in answer["error"]["data"]["reason"]
        assert answer["error"]["data"]["uri"] == uri
    assert len(forwarded(rig, "docs", "resources/read")) == 2
    assert forwarded(rig, "docs", "resources/subscribe") == []
