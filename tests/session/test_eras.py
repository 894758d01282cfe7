"""The client side of the protocol eras (session/_eras.py, and the session serving both eras).

Pure pieces first (plain def tests), then a Session on a real Pool over fake upstreams, spoken
to line by line as a 2026-07-28 client and as handshake-era ones: no sockets, no processes.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from fakes import FakeNet, FakeServer, FakeWriter, desired, make_pool, stdio, tool

from mcpool.protocol import (
    META_CLIENT_CAPABILITIES,
    META_CLIENT_INFO,
    META_LOG_LEVEL,
    META_PROTOCOL_VERSION,
    META_SERVER_INFO,
    META_SUBSCRIPTION_ID,
    InvalidParams,
)
from mcpool.session import Session
from mcpool.session._eras import (
    Batch,
    InputRequired,
    UnsupportedVersion,
    check_envelope,
    discover_result,
    handshake_result,
    honored_filter,
    modern_result,
    opens_modern,
    plan_for,
    strip_envelope,
    translate_error,
    translate_result,
)

ENVELOPE = {
    META_PROTOCOL_VERSION: "2026-07-28",
    META_CLIENT_CAPABILITIES: {},
    META_CLIENT_INFO: {"name": "t", "version": "1"},
}

# -- pure pieces ---------------------------------------------------------------------------------


def test_the_first_request_decides_the_era() -> None:
    assert opens_modern("server/discover", {})
    assert opens_modern("tools/list", {"_meta": ENVELOPE})
    assert not opens_modern("tools/list", {"_meta": {"progressToken": 1}})
    assert not opens_modern("tools/list", {})
    # initialize never opens the modern era, even stamped (as in the SDK's server).
    assert not opens_modern("initialize", {"_meta": ENVELOPE})


def test_a_valid_envelope_is_read() -> None:
    env = check_envelope({"_meta": {**ENVELOPE, META_LOG_LEVEL: "debug"}})
    assert env.version == "2026-07-28"
    assert env.capabilities == {}
    assert env.client_info == {"name": "t", "version": "1"}
    assert env.log_level == "debug"


@pytest.mark.parametrize(
    "meta",
    [
        None,
        "x",
        {META_PROTOCOL_VERSION: "2026-07-28"},
        {META_CLIENT_CAPABILITIES: {}},
        {**ENVELOPE, META_PROTOCOL_VERSION: 20260728},
        {**ENVELOPE, META_CLIENT_CAPABILITIES: []},
        {**ENVELOPE, META_CLIENT_INFO: "me"},
        {**ENVELOPE, META_LOG_LEVEL: "loud"},
    ],
)
def test_a_malformed_envelope_is_invalid_params(meta: Any) -> None:
    params = {} if meta is None else {"_meta": meta}
    with pytest.raises(InvalidParams) as caught:
        check_envelope(params)
    assert caught.value.code == -32602


def test_an_unknown_version_is_unsupported_and_names_what_is() -> None:
    with pytest.raises(UnsupportedVersion) as caught:
        check_envelope({"_meta": {**ENVELOPE, META_PROTOCOL_VERSION: "2099-01-01"}})
    assert caught.value.code == -32022
    assert caught.value.data["supported"] == ["2026-07-28"]
    assert caught.value.data["requested"] == "2099-01-01"


def test_the_envelope_is_stripped_before_a_request_goes_anywhere() -> None:
    params: dict[str, Any] = {"name": "x", "_meta": {**ENVELOPE, "progressToken": 7}}
    strip_envelope(params)
    assert params == {"name": "x", "_meta": {"progressToken": 7}}
    params = {"name": "x", "_meta": dict(ENVELOPE)}
    strip_envelope(params)
    assert params == {"name": "x"}


def test_modern_results_get_result_type_and_lists_get_private_cache_hints() -> None:
    assert modern_result("tools/call", {"content": []}) == {
        "content": [],
        "resultType": "complete",
    }
    listed = modern_result("tools/list", {"tools": []}, {"name": "mcpool", "version": "0"})
    assert listed["ttlMs"] == 0
    assert listed["cacheScope"] == "private"
    assert listed["resultType"] == "complete"
    assert listed["_meta"] == {META_SERVER_INFO: {"name": "mcpool", "version": "0"}}
    # What an upstream already said is kept.
    assert modern_result("tools/call", {"resultType": "input_required"})["resultType"] == (
        "input_required"
    )


def test_handshake_results_lose_every_modern_field() -> None:
    result = {
        "content": [],
        "resultType": "complete",
        "ttlMs": 5,
        "cacheScope": "public",
        "_meta": {META_SERVER_INFO: {"name": "up"}, "x/y": 1},
    }
    assert handshake_result(result) == {"content": [], "_meta": {"x/y": 1}}
    assert handshake_result({"_meta": {META_SERVER_INFO: {}}}) == {}


def test_discover_answers_capabilities_instructions_versions_and_cache_hints() -> None:
    caps = {"tools": {"listChanged": True}}
    result = discover_result(caps, "use the tools", {"name": "mcpool", "version": "0"})
    assert result["supportedVersions"] == ["2026-07-28"]
    assert result["capabilities"] is caps
    assert result["instructions"] == "use the tools"
    assert result["resultType"] == "complete"
    assert result["cacheScope"] == "private"
    assert "instructions" not in discover_result(caps, None, {})


def test_a_listen_filter_is_honored_as_asked() -> None:
    assert honored_filter({"toolsListChanged": True, "promptsListChanged": False}) == {
        "toolsListChanged": True
    }
    honored = honored_filter({"resourceSubscriptions": ["a://1", "a://1", "b://2"]})
    assert honored == {"resourceSubscriptions": ["a://1", "b://2"]}
    with pytest.raises(InvalidParams):
        honored_filter(None)
    with pytest.raises(InvalidParams):
        honored_filter({"resourceSubscriptions": "a://1"})


def test_no_plan_when_both_sides_speak_the_handshake_era() -> None:
    assert plan_for("tools/call", session_modern=False, upstream_modern=False) is None
    assert plan_for("tools/call", session_modern=True, upstream_modern=True, wrap=True) is not None


def test_a_modern_result_without_result_type_reaches_a_modern_session_as_complete() -> None:
    # 2026-07-28 (basic/index, SEP-2322): a result MUST carry resultType and a client MUST read
    # its absence as "complete"; mcpool is the client of the one and the server of the other.
    # The conformance client scenario sep-2322-client-request-state's test_mrtr_no_result_type.
    plan = plan_for("tools/call", session_modern=True, upstream_modern=True)
    assert plan is not None
    out = _decoded(translate_result(b'{"content":[{"type":"text","text":"ok"}]}', plan))
    assert out == {"content": [{"type": "text", "text": "ok"}], "resultType": "complete"}
    # One that has it goes back as it came, byte for byte (and input_required stays so).
    for raw in (
        b'{"content":[],"resultType":"complete"}',
        b'{"resultType":"input_required","inputRequests":{}}',
    ):
        assert translate_result(raw, plan) is raw


def _decoded(raw: bytes) -> Any:
    return json.loads(raw)


def test_results_cross_eras_both_ways() -> None:
    to_modern = plan_for("resources/read", session_modern=True, upstream_modern=False)
    assert to_modern is not None
    out = _decoded(translate_result(b'{"contents":[]}', to_modern))
    assert out == {"contents": [], "resultType": "complete", "ttlMs": 0, "cacheScope": "private"}
    to_handshake = plan_for("tools/call", session_modern=False, upstream_modern=True)
    assert to_handshake is not None
    raw = (
        b'{"content":[],"resultType":"complete","_meta":{"io.modelcontextprotocol/serverInfo":{}}}'
    )
    assert _decoded(translate_result(raw, to_handshake)) == {"content": []}


def test_wrapped_structured_output_is_wrapped_for_both_eras() -> None:
    for session_modern in (False, True):
        plan = plan_for(
            "tools/call", session_modern=session_modern, upstream_modern=True, wrap=True
        )
        assert plan is not None
        out = _decoded(translate_result(b'{"content":[],"structuredContent":[1,2]}', plan))
        assert out["structuredContent"] == {"result": [1, 2]}


def test_input_required_cannot_reach_a_handshake_era_client() -> None:
    plan = plan_for("tools/call", session_modern=False, upstream_modern=True)
    assert plan is not None
    with pytest.raises(InputRequired):
        translate_result(b'{"resultType":"input_required","inputRequests":{}}', plan)


def test_resource_not_found_codes_cross_eras() -> None:
    modern = plan_for("resources/read", session_modern=True, upstream_modern=False)
    legacy = plan_for("resources/read", session_modern=False, upstream_modern=True)
    assert modern is not None
    assert legacy is not None
    old = b'{"code":-32002,"message":"Resource not found"}'
    new = b'{"code":-32602,"message":"Unknown resource"}'
    assert _decoded(translate_error(old, modern, session_modern=True))["code"] == -32602
    assert _decoded(translate_error(new, legacy, session_modern=False))["code"] == -32002
    other = plan_for("tools/call", session_modern=True, upstream_modern=False)
    assert other is not None
    assert translate_error(old, other, session_modern=True) == old


def test_a_batch_answers_once_all_its_requests_are_answered() -> None:
    batch = Batch(2)
    assert batch.add(b'{"id":"b"}\n') is None
    assert batch.add(b'{"id":1}\n') == b'[{"id":"b"},{"id":1}]\n'


def test_a_batch_with_a_dropped_member_completes_and_an_all_dropped_one_sends_nothing() -> None:
    batch = Batch(3)
    assert batch.add(b'{"id":1}\n') is None
    assert batch.drop() is None
    assert batch.add(b'{"id":1}\n') == b'[{"id":1},{"id":1}]\n'  # a duplicate id counts too
    empty = Batch(1)
    assert empty.drop() is None


# -- a Session serving both eras -----------------------------------------------------------------


class Rig:
    def __init__(self, nursery: trio.Nursery, **servers: FakeServer) -> None:
        self.nursery = nursery
        self.net = FakeNet(**servers)
        self.pool = make_pool(nursery, self.net)

    async def session(self, sid: str = "s1") -> tuple[Session, FakeWriter]:
        out = FakeWriter()
        session = Session(sid, name=sid, cwd=None, pool=self.pool, out=out)
        self.nursery.start_soon(session.run_notifier)
        await session.apply_settings({"srv": desired("srv", stdio())}, 1)
        return session, out


def send(session: Session, obj: Any) -> None:
    session.handle_line(json.dumps(obj).encode())


def modern(method: str, msg_id: Any = 1, **params: Any) -> dict[str, Any]:
    meta = {**ENVELOPE, **params.pop("_meta", {})}
    return {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": {**params, "_meta": meta}}


def answer(out: FakeWriter, msg_id: Any) -> dict[str, Any]:
    (found,) = [f for f in out.frames if f.get("id") == msg_id and "method" not in f]
    return found


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


async def test_a_2026_session_discovers_lists_and_calls_in_its_era(nursery: trio.Nursery) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")], instructions="be kind"))
    session, out = await rig.session()
    send(session, modern("server/discover", "d"))
    found = answer(out, "d")["result"]
    assert session.era == "modern"
    assert found["supportedVersions"] == ["2026-07-28"]
    assert found["capabilities"]["tools"] == {"listChanged": True}
    assert found["instructions"] == session.registry.instructions()
    assert "be kind" in found["instructions"]
    assert found["resultType"] == "complete"
    assert found["_meta"][META_SERVER_INFO]["name"] == "mcpool"

    send(session, modern("tools/list", "l"))
    listed = answer(out, "l")["result"]
    assert [t["name"] for t in listed["tools"]] == ["srv__a"]
    assert (listed["resultType"], listed["ttlMs"], listed["cacheScope"]) == (
        "complete",
        0,
        "private",
    )

    send(session, modern("tools/call", "c", name="srv__a", arguments={}, _meta={"x/y": 1}))
    upstream = rig.net.servers["srv"].current
    uid, method, params = upstream.sent[-1]
    assert method == "tools/call"
    # The envelope never reaches a handshake-era upstream; other _meta keys do.
    assert params == {"name": "a", "arguments": {}, "_meta": {"x/y": 1}}
    upstream.reply(uid, {"content": [{"type": "text", "text": "ok"}]})
    assert answer(out, "c")["result"] == {
        "content": [{"type": "text", "text": "ok"}],
        "resultType": "complete",
    }


async def test_a_2026_session_refuses_bad_envelopes_and_initialize(nursery: trio.Nursery) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")]))
    session, out = await rig.session()
    # A malformed envelope on the opening request is refused and decides nothing.
    send(session, {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}})
    assert answer(out, 1)["error"]["code"] == -32602
    assert session.era is None
    send(session, modern("server/discover", 2))
    assert session.era == "modern"
    bad = modern("tools/list", 3)
    del bad["params"]["_meta"][META_CLIENT_CAPABILITIES]
    send(session, bad)
    assert answer(out, 3)["error"]["code"] == -32602
    send(session, modern("tools/list", 4, _meta={META_PROTOCOL_VERSION: "2030-01-01"}))
    assert answer(out, 4)["error"]["code"] == -32022
    init = {
        "jsonrpc": "2.0",
        "id": 5,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {}},
    }
    send(session, init)
    refused = answer(out, 5)["error"]
    assert refused["code"] == -32022
    assert refused["data"]["supported"] == ["2026-07-28"]


async def test_list_changed_rides_the_listen_stream_stamped_with_its_id(
    nursery: trio.Nursery,
) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")]))
    session, out = await rig.session()
    send(session, modern("server/discover", "d"))
    send(session, modern("subscriptions/listen", "L", notifications={"toolsListChanged": True}))
    ack = out.frames[-1]
    assert ack == {
        "jsonrpc": "2.0",
        "method": "notifications/subscriptions/acknowledged",
        "params": {
            "notifications": {"toolsListChanged": True},
            "_meta": {META_SUBSCRIPTION_ID: "L"},
        },
    }
    assert [f for f in out.frames if f.get("id") == "L"] == []  # answered only when it ends
    rig.net.servers["srv"].tools.append(tool("b"))
    rig.net.servers["srv"].current.list_changed()
    await settle()
    changed = [f for f in out.frames if f.get("method") == "notifications/tools/list_changed"]
    assert changed == [
        {
            "jsonrpc": "2.0",
            "method": "notifications/tools/list_changed",
            "params": {"_meta": {META_SUBSCRIPTION_ID: "L"}},
        }
    ]
    # Closed by the client: nothing more on it.
    send(
        session,
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "L"}},
    )
    assert session.listens == {}
    out.frames.clear()
    rig.net.servers["srv"].tools.append(tool("c"))
    rig.net.servers["srv"].current.list_changed()
    await settle()
    assert out.notifications("tools") == []


async def test_a_2026_session_without_a_listen_stream_gets_no_unsolicited_list_changed(
    nursery: trio.Nursery,
) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")]))
    session, out = await rig.session()
    send(session, modern("server/discover", "d"))
    rig.net.servers["srv"].tools.append(tool("b"))
    rig.net.servers["srv"].current.list_changed()
    await settle()
    assert "srv__b" in session.registry.tool_routes
    assert out.notifications("tools") == []


async def test_listen_resources_are_reference_counted_subscriptions(nursery: trio.Nursery) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")], resources=[{"uri": "r://1", "name": "one"}]))
    session, out = await rig.session()
    send(session, modern("server/discover", "d"))
    filt = {"resourceSubscriptions": ["r://1"]}
    send(session, modern("subscriptions/listen", "L", notifications=filt))
    upstream = rig.net.servers["srv"].current
    assert [(m, p) for _, m, p in upstream.sent] == [("resources/subscribe", {"uri": "r://1"})]
    upstream.events.on_notification(
        "notifications/resources/updated",
        msgspec.Raw(b'{"uri":"r://1","_meta":{"io.modelcontextprotocol/subscriptionId":"up-1"}}'),
    )
    assert out.frames[-1] == {
        "jsonrpc": "2.0",
        "method": "notifications/resources/updated",
        "params": {"uri": "r://1", "_meta": {META_SUBSCRIPTION_ID: "L"}},
    }
    send(
        session,
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "L"}},
    )
    assert upstream.sent[-1][1:] == ("resources/unsubscribe", {"uri": "r://1"})


async def test_a_handshake_session_is_unchanged_and_gets_no_modern_fields(
    nursery: trio.Nursery,
) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")]))
    session, out = await rig.session()
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {}},
    }
    send(session, init)
    send(session, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert session.era == "handshake"
    send(session, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert set(answer(out, 1)["result"]) == {"tools"}
    send(session, {"jsonrpc": "2.0", "id": 2, "method": "server/discover", "params": {}})
    assert answer(out, 2)["error"]["code"] == -32601


async def test_a_2025_03_26_batch_gets_one_array(nursery: trio.Nursery) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")]))
    session, out = await rig.session()
    send(
        session,
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {}},
        },
    )
    send(session, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    out.frames.clear()
    raw: list[bytes] = []
    out.write = raw.append  # type: ignore[method-assign]  # see the array itself, not its lines
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "srv__a"}},
        {"jsonrpc": "2.0", "id": 2, "method": "ping"},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}},
        {"jsonrpc": "2.0", "id": 3, "method": "no/such/method"},
    ]
    send(session, batch)
    assert raw == []  # the forwarded call is still out
    upstream = rig.net.servers["srv"].current
    uid = upstream.sent[-1][0]
    upstream.reply(uid, {"content": []})
    (line,) = raw
    answers = json.loads(line)
    assert isinstance(answers, list)
    assert sorted(a["id"] for a in answers) == [1, 2, 3]
    by_id = {a["id"]: a for a in answers}
    assert by_id[1]["result"] == {"content": []}
    assert by_id[2]["result"] == {}
    assert by_id[3]["error"]["code"] == -32601
    # Afterwards, single requests are answered alone again.
    send(session, {"jsonrpc": "2.0", "id": 4, "method": "ping"})
    assert json.loads(raw[-1]) == {"jsonrpc": "2.0", "id": 4, "result": {}}


async def test_methods_2026_07_28_removed_are_unknown_in_a_modern_session(
    nursery: trio.Nursery,
) -> None:
    rig = Rig(nursery, srv=FakeServer([tool("a")], resources=[{"uri": "r://1", "name": "one"}]))
    session, out = await rig.session()
    send(session, modern("ping", "first"))  # even as the request that opens the era
    assert answer(out, "first")["error"]["code"] == -32601
    for msg_id, (method, params) in enumerate(
        [
            ("ping", {}),
            ("logging/setLevel", {"level": "info"}),
            ("resources/subscribe", {"uri": "r://1"}),
        ]
    ):
        send(session, modern(method, msg_id, **params))
        assert answer(out, msg_id)["error"]["code"] == -32601, method
    send(session, modern("tools/list", "ok"))
    assert "result" in answer(out, "ok")
