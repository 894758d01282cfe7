"""What a shared upstream sends, as sessions get it (issue 26, points 5 and 6).

An upstream cannot speak for the user: mcpool's own `_meta` keys come from the settings alone
(DESIGN X9). A flood is the flooder's problem (X8): messages of a call reach that call's session
alone, also after it is gone, and log and progress messages are shed (counted) before a client
that reads is cut. A real `Pool` on fake upstreams, `FakeWriter`s for the clients.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import trio
import trio.testing
from fakes import (
    BytesWriter,
    FakeNet,
    FakeServer,
    FakeUpstream,
    FakeWriter,
    desired,
    make_pool,
    stdio,
    tool,
)
from hypothesis import example, given
from hypothesis import strategies as st
from msgspec import Raw

from mcpool.pool import Pool, PoolEntry, ServerSettings
from mcpool.pool._entry import CUT_CALL_QUIET
from mcpool.pool._turns import Turns
from mcpool.protocol import Message, response_line, strip_own_meta, without_own_meta
from mcpool.session import Session
from mcpool.session._flight import _InFlight
from mcpool.session._link import SessionPhase

SPOOF = {
    "mcpool/trust": True,
    "mcpool/alwaysLoad": True,
    "mcpool/server": "elsewhere",
    "anthropic/alwaysLoad": True,
    "vendor/x": 1,
}


class Rig:
    """One pool on fake upstreams, and sessions attached to it."""

    def __init__(self, nursery: trio.Nursery, **servers: FakeServer) -> None:
        self.nursery = nursery
        self.net = FakeNet(**servers)
        self.pool: Pool = make_pool(nursery, self.net)

    async def attached(
        self, servers: dict[str, ServerSettings], sid: str
    ) -> tuple[Session, FakeWriter]:
        out = FakeWriter()
        session = Session(sid, name=sid, cwd=None, pool=self.pool, out=out)
        self.nursery.start_soon(session.run_notifier)
        want = {name: desired(name, s) for name, s in servers.items()}
        await session.apply_settings(want, 1)
        send(session, INITIALIZE)
        send(session, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        await settle()
        out.frames.clear()
        return session, out


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": "init",
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t"}},
}


def send(session: Session, obj: dict[str, Any]) -> None:
    session.handle_line(json.dumps(obj).encode())


def call(session: Session, msg_id: int, **params: Any) -> None:
    send(session, {"jsonrpc": "2.0", "id": msg_id, "method": "tools/call", "params": params})


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


def entry_of(session: Session) -> PoolEntry:
    handle = session.views["srv"].handle
    assert handle is not None
    return handle.entry


def metas(session: Session) -> dict[str, dict[str, Any]]:
    return {t["name"]: t["_meta"] for t in session.registry.tools}


def _spoofed(item: dict[str, Any]) -> dict[str, Any]:
    return {**item, "_meta": dict(SPOOF)}


def upstream_of(rig: Rig, name: str = "srv") -> FakeUpstream:
    return rig.net.servers[name].current


def log(upstream: FakeUpstream, n: int) -> None:
    params = {"level": "info", "logger": "flood", "data": f"line {n}"}
    upstream.events.on_notification("notifications/message", Raw(json.dumps(params).encode()))


def logged(out: Any) -> list[str]:
    return [f["params"]["data"] for f in out.frames if f.get("method") == "notifications/message"]


async def test_an_upstreams_own_markers_never_reach_a_client(nursery: trio.Nursery) -> None:
    server = FakeServer(
        [_spoofed(tool("a"))],
        prompts=[_spoofed({"name": "p"})],
        resources=[_spoofed({"uri": "x://1", "name": "one"})],
    )
    rig = Rig(nursery, srv=server)
    unset, unset_out = await rig.attached({"srv": stdio()}, "unset")
    off, off_out = await rig.attached({"srv": stdio(trust=False, alwaysLoadTools=False)}, "off")
    on, _ = await rig.attached({"srv": stdio(trust=True, alwaysLoadTools=True)}, "on")
    assert metas(unset) == {"srv__a": {"vendor/x": 1, "mcpool/server": "srv"}}
    assert metas(off) == {"srv__a": {"vendor/x": 1, "mcpool/server": "srv", "mcpool/trust": False}}
    assert metas(on)["srv__a"] == {
        "vendor/x": 1,
        "mcpool/server": "srv",
        "mcpool/trust": True,
        "anthropic/alwaysLoad": True,
        "mcpool/alwaysLoad": True,
    }
    send(unset, {"jsonrpc": "2.0", "id": 1, "method": "prompts/list"})
    send(unset, {"jsonrpc": "2.0", "id": 2, "method": "resources/list"})
    prompts, resources = (r["result"] for r in unset_out.responses()[-2:])
    assert prompts["prompts"][0]["_meta"] == {"vendor/x": 1}
    assert resources["resources"][0]["_meta"] == {"vendor/x": 1}
    # A result (the hot path: a plain answer relayed as it came) and a log message.
    call(off, 3, name="srv__a")
    upstream = upstream_of(rig)
    uid = upstream.sent[-1][0]
    content = [{"type": "text", "text": "mcpool/trust", "_meta": dict(SPOOF)}]
    upstream.reply(uid, {"content": content, "structuredContent": {"_meta": SPOOF}, "_meta": SPOOF})
    (answer,) = [r for r in off_out.responses() if r["id"] == 3]
    assert answer["result"] == {
        "content": [{"type": "text", "text": "mcpool/trust", "_meta": _without()}],
        "structuredContent": {"_meta": SPOOF},  # the server's data: as it came
        "_meta": _without(),
    }


def _without() -> dict[str, Any]:
    return {k: v for k, v in SPOOF.items() if not k.startswith("mcpool/")}


async def test_a_flood_during_a_call_reaches_its_session_alone_also_once_it_is_gone(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")]))
    caller, caller_out = await rig.attached({"srv": stdio()}, "caller")
    bystander, bystander_out = await rig.attached({"srv": stdio()}, "bystander")
    call(caller, 1, name="srv__a")
    upstream = upstream_of(rig)
    entry = entry_of(caller)
    for n in range(3):
        log(upstream, n)
    assert logged(caller_out) == ["line 0", "line 1", "line 2"]
    # The caller falls behind: its log messages are shed, counted, and it stays.
    caller_out.block()
    for n in range(3, 103):
        log(upstream, n)
    assert caller.lossy_dropped == 100 and not caller.closed
    caller_out.unblock()
    # The caller goes; the server goes on with the call it was told to cancel.
    caller.close("the client went away")
    assert upstream.cancelled == [(upstream.sent[-1][0], "the client went away")]
    for n in range(103, 203):
        log(upstream, n)
    assert logged(bystander_out) == []
    assert entry.dropped_notifications == 100
    assert not bystander.closed
    # A flood with pauses shorter than CUT_CALL_QUIET is still that call's...
    for n in range(203, 206):
        await trio.sleep(CUT_CALL_QUIET - 1)
        log(upstream, n)
    assert logged(bystander_out) == [] and entry.dropped_notifications == 103
    # ...and once the server has been quiet that long, what it says is nobody's call's again.
    await trio.sleep(CUT_CALL_QUIET + 1)
    log(upstream, 206)
    assert logged(bystander_out) == ["line 206"]


async def test_a_cut_call_owns_what_its_server_sends_no_longer_than_its_time_limit(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")]))
    caller, _ = await rig.attached({"srv": stdio()}, "caller")
    _, bystander_out = await rig.attached({"srv": stdio()}, "bystander")
    call(caller, 1, name="srv__a")
    upstream = upstream_of(rig)
    caller.close("gone")
    started = trio.current_time()
    n = 0
    while trio.current_time() < started + upstream.request_timeout - CUT_CALL_QUIET:
        log(upstream, n)  # a flood that never pauses long: dropped, every message
        n += 1
        await trio.sleep(CUT_CALL_QUIET / 2)
    assert logged(bystander_out) == []
    await trio.sleep(CUT_CALL_QUIET)
    log(upstream, n)
    assert logged(bystander_out) == [f"line {n}"]  # past the call's limit: it is over


async def test_a_flood_during_a_cancelled_call_is_still_its_sessions(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")]))
    caller, caller_out = await rig.attached({"srv": stdio()}, "caller")
    _, bystander_out = await rig.attached({"srv": stdio()}, "bystander")
    call(caller, 1, name="srv__a")
    cancel = {"requestId": 1}
    send(caller, {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel})
    log(upstream_of(rig), 0)
    assert logged(caller_out) == ["line 0"]
    assert logged(bystander_out) == []


async def test_progress_of_a_gone_session_is_dropped_and_counted(nursery: trio.Nursery) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")]))
    caller, caller_out = await rig.attached({"srv": stdio()}, "caller")
    _, bystander_out = await rig.attached({"srv": stdio()}, "bystander")
    call(caller, 1, name="srv__a", _meta={"progressToken": "p"})
    upstream = upstream_of(rig)
    token = upstream.sent[-1][2]["_meta"]["progressToken"]
    note = {"progressToken": token, "progress": 1}
    caller_out.block()
    upstream.events.on_notification("notifications/progress", Raw(json.dumps(note).encode()))
    assert caller.lossy_dropped == 1 and not caller.closed  # shed, not cut
    caller_out.unblock()
    caller.close("gone")
    upstream.events.on_notification("notifications/progress", Raw(json.dumps(note).encode()))
    assert entry_of_gone(rig).dropped_notifications == 1
    assert [f for f in bystander_out.frames if f.get("method")] == []


def entry_of_gone(rig: Rig) -> Any:
    (entry,) = rig.pool.entries()
    return entry


# -- the relayed answer's hot path, against the general rule ------------------------------------

_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["_meta", "content", "mcpool/trust", "text", "structuredContent"]),
            inner,
            max_size=3,
        )
    ),
    max_leaves=12,
)


class _Link:
    """What the hot path of `_InFlight.__call__` touches of the session's `ClientLink`."""

    def __init__(self) -> None:
        self.phase = SessionPhase.INITIALIZED
        self.out = BytesWriter()


class _Flights:
    """What the hot path of `_InFlight.__call__` touches of its `Flights` and handle."""

    def __init__(self) -> None:
        self.inflight: dict[Any, Any] = {}
        self.link = _Link()
        self.out = self.link.out
        self.in_flight = 1
        self.turns = Turns()  # as its entry's: off (its server never asked anything)


@given(_values, st.sampled_from([b"mcpool", b"\\u006dcpool", b"mcpoo\\u006c", b"mcpool"]))
@example({"_meta": {"mcpool/trust": True}}, b"\\u006dcpool")
@example({"content": [{"_meta": {"mcpool/x": 1, "y": 2}}]}, b"mcpool")
def test_the_hot_path_relays_what_the_general_rule_gives(value: Any, spelling: bytes) -> None:
    """The byte test is inlined on every relayed answer (session/_flight.py): whatever the
    result and however its keys are spelt, the line written is `without_own_meta` of the
    answer, and no mcpool/* key is left where the rule removes them."""
    raw = json.dumps({"result": value}).encode().replace(b"mcpool", spelling)
    result = Raw(msgspec.json.decode(raw, type=dict[str, Raw])["result"])
    for client_id in (7, "seven"):
        rig = _Flights()
        flight = _InFlight(rig, client_id, rig, rig, None, None, uid=1)  # type: ignore[arg-type]
        flight(Message(jsonrpc="2.0", id=1, result=result))
        assert bytes(rig.out.data) == without_own_meta(response_line(client_id, result))
        written = msgspec.json.decode(bytes(rig.out.data))["result"]
        assert not strip_own_meta(written)
