"""A 2026-07-28 session's call held across input rounds (issue 18), through a real `Session` on
fake upstreams (tests/fakes.py): a handshake-era upstream asks for input mid-call; the session's
call is answered `input_required`, the retry's answers reach the upstream, and the rules on
`requestState`, timeouts, closing and attribution (P5) hold."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing
from fakes import (
    FakeNet,
    FakeServer,
    FakeUpstream,
    FakeWriter,
    LogLines,
    desired,
    make_pool,
    stdio,
    tool,
)
from msgspec import Raw

from mcpool.protocol import Message
from mcpool.session import Session
from mcpool.session._input import INPUT_RETRY_TIMEOUT, MAX_HELD_CALLS

CAPS = {"sampling": {}, "elicitation": {}}
ELICIT = {"message": "your name?", "requestedSchema": {"type": "object"}}
NAME = {"action": "accept", "content": {"name": "Ada"}}


def envelope(caps: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": CAPS if caps is None else caps,
    }


class Recording(FakeUpstream):
    """A fake upstream that keeps what the session answers to its own requests."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answers: list[tuple[Any, Any]] = []
        self.refusals: list[tuple[Any, int, str]] = []
        self.related_request: Any = None  # as an HTTP upstream knows it (the stream's request)

    def respond(self, msg_id: Any, result: Any) -> None:
        self.answers.append((msg_id, result))

    def respond_error(self, msg_id: Any, code: int, message: str, data: Any = None) -> None:
        self.refusals.append((msg_id, code, message))

    def ask(
        self,
        msg_id: Any,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        on_stream_of: int | None = None,
    ) -> None:
        """Send a request to the client; `on_stream_of`: on the stream of that call (HTTP)."""
        raw = Raw(json.dumps(params).encode()) if params is not None else None
        msg = Message(jsonrpc="2.0", id=msg_id, method=method, **({"params": raw} if raw else {}))
        self.related_request = None if on_stream_of is None else self._pending[on_stream_of]
        try:
            self.events.on_server_request(self, msg)  # type: ignore[arg-type]
        finally:
            self.related_request = None


class RecordingNet(FakeNet):
    def factory(self, identity: Any, events: Any, **kwargs: Any) -> FakeUpstream:
        server = self.servers.setdefault(identity.name, FakeServer())
        upstream = Recording(server, identity, events, roots=kwargs.get("roots", ()))
        server.upstreams.append(upstream)
        return upstream


class Client:
    def __init__(self, session: Session, out: FakeWriter) -> None:
        self.session, self.out = session, out

    def call(
        self, rid: Any, tool_name: str = "srv__a", caps: dict[str, Any] | None = None, **extra: Any
    ) -> None:
        params = {"name": tool_name, "arguments": {"x": 1}, "_meta": envelope(caps), **extra}
        line = {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}
        self.session.handle_line(json.dumps(line).encode())

    def answer(self, rid: Any) -> dict[str, Any]:
        (frame,) = [f for f in self.out.responses() if f["id"] == rid]
        return frame


async def attached(
    nursery: trio.Nursery, *names: str, spawn: bool = True
) -> tuple[RecordingNet, list[Client]]:
    net = RecordingNet(srv=FakeServer([tool("a"), tool("b")]))
    pool = make_pool(nursery, net)
    clients = []
    for name in names or ("one",):
        out = FakeWriter()
        session = Session(name, name=name, cwd=None, pool=pool, out=out, log=LogLines())
        if spawn:
            session.spawn = nursery.start_soon
        else:
            nursery.start_soon(session.run_notifier)
        await session.apply_settings({"srv": desired("srv", stdio())}, 1)
        clients.append(Client(session, out))
    await trio.testing.wait_all_tasks_blocked()
    return net, clients


def upstream_of(net: FakeNet) -> Recording:
    upstream = net.servers["srv"].current
    assert isinstance(upstream, Recording)
    return upstream


async def asked(nursery: trio.Nursery) -> tuple[Any, Recording, int]:
    """One attached client whose call 1 the upstream (request `uid`) answers by eliciting
    (its request 70): the state most of these tests start from."""
    net, (client,) = await attached(nursery)
    client.call(1)
    up = upstream_of(net)
    ((uid, _, _),) = up.sent
    up.ask(70, "elicitation/create", ELICIT)
    return client, up, uid


async def test_an_upstream_request_mid_call_is_answered_through_input_required(
    nursery: trio.Nursery,
) -> None:
    client, up, uid = await asked(nursery)
    result = client.answer(1)["result"]
    assert result["resultType"] == "input_required"
    assert result["inputRequests"] == {
        "elicitation-1": {"method": "elicitation/create", "params": ELICIT}
    }
    assert not up.cancelled  # the upstream's call stays open for the retry
    client.call(2, inputResponses={"elicitation-1": NAME}, requestState=result["requestState"])
    assert up.answers == [(70, NAME)]
    assert len(up.sent) == 1  # the retry is not sent again: the call goes on
    # A second round: the upstream samples now.
    up.ask(71, "sampling/createMessage", {"messages": [], "maxTokens": 5})
    second = client.answer(2)["result"]
    assert list(second["inputRequests"]) == ["sampling-2"]
    assert second["requestState"] != result["requestState"]
    sampled = {"role": "assistant", "content": {"type": "text", "text": "Paris"}, "model": "m"}
    client.call(3, inputResponses={"sampling-2": sampled}, requestState=second["requestState"])
    assert up.answers[-1] == (71, sampled)
    up.reply(uid, {"content": [{"type": "text", "text": "done"}]})
    final = client.answer(3)["result"]
    assert final["content"][0]["text"] == "done"
    assert final["resultType"] == "complete"
    assert not client.session.flights._holding


async def test_an_answer_that_comes_before_the_retry_is_the_retrys(
    nursery: trio.Nursery,
) -> None:
    client, up, uid = await asked(nursery)
    state = client.answer(1)["result"]["requestState"]
    up.reply(uid, {"content": [{"type": "text", "text": "gave up asking"}]})
    assert [r[0] for r in up.refusals] == [70]  # its request is moot: the call ended
    client.call(2, inputResponses={"elicitation-1": NAME}, requestState=state)
    assert client.answer(2)["result"]["content"][0]["text"] == "gave up asking"
    assert up.answers == []


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"requestState": "mcpool.forged"}, "unknown"),
        ({"tool_name": "srv__b"}, "mismatch"),
    ],
)
async def test_a_forged_or_misplaced_state_is_rejected_and_the_call_still_waits(
    nursery: trio.Nursery, change: dict[str, Any], why: str
) -> None:
    client, up, _uid = await asked(nursery)
    state = client.answer(1)["result"]["requestState"]
    tool_name = change.get("tool_name", "srv__a")
    bad_state = change.get("requestState", state)
    client.call(2, tool_name, inputResponses={"elicitation-1": NAME}, requestState=bad_state)
    error = client.answer(2)["error"]
    assert error["code"] == -32602
    assert error["data"]["requestState"] == why
    assert up.answers == [] and not up.cancelled
    client.call(3, inputResponses={"elicitation-1": NAME}, requestState=state)
    assert up.answers == [(70, NAME)]


async def test_a_foreign_state_never_reaches_a_handshake_era_server(nursery: trio.Nursery) -> None:
    net, (client,) = await attached(nursery)
    client.call(1, requestState="someone-elses", inputResponses={})
    assert client.answer(1)["error"]["data"]["requestState"] == "unknown"
    assert upstream_of(net).sent == []


async def test_a_state_is_good_for_one_retry_and_for_its_own_session_only(
    nursery: trio.Nursery,
) -> None:
    net, (one, other) = await attached(nursery, "one", "other")
    one.call(1)
    up = upstream_of(net)
    up.ask(70, "elicitation/create", ELICIT)
    state = one.answer(1)["result"]["requestState"]
    other.call(1, inputResponses={"elicitation-1": NAME}, requestState=state)
    assert other.answer(1)["error"]["data"]["requestState"] == "unknown"
    one.call(2, inputResponses={"elicitation-1": NAME}, requestState=state)
    one.call(3, inputResponses={"elicitation-1": NAME}, requestState=state)
    assert one.answer(3)["error"]["data"]["requestState"] == "unknown"
    assert up.answers == [(70, NAME)]


async def test_a_retry_that_never_comes_ends_the_upstreams_request_and_call(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    client, up, uid = await asked(nursery)
    state = client.answer(1)["result"]["requestState"]
    await trio.sleep(INPUT_RETRY_TIMEOUT - 1)
    assert not up.refusals and not up.cancelled
    await trio.sleep(2)
    assert [r[0] for r in up.refusals] == [70]
    assert [c[0] for c in up.cancelled] == [uid]
    assert not client.session.flights._holding
    client.call(2, inputResponses={"elicitation-1": NAME}, requestState=state)
    assert client.answer(2)["error"]["data"]["requestState"] == "unknown"


async def test_a_session_that_closes_lets_go_of_its_held_calls(nursery: trio.Nursery) -> None:
    client, up, uid = await asked(nursery)
    client.session.close("the client disconnected")
    assert [(r[0], r[1]) for r in up.refusals] == [(70, -31007)]
    assert [c[0] for c in up.cancelled] == [uid]


async def test_a_cancelled_retry_cancels_the_held_call(nursery: trio.Nursery) -> None:
    client, up, uid = await asked(nursery)
    state = client.answer(1)["result"]["requestState"]
    client.call(2, inputResponses={"elicitation-1": NAME}, requestState=state)
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}}
    client.session.handle_line(json.dumps(cancel).encode())
    assert [c[0] for c in up.cancelled] == [uid]
    assert not client.session.flights._holding and not client.session.inflight


async def test_input_the_client_cannot_give_is_refused_to_the_upstream(
    nursery: trio.Nursery,
) -> None:
    net, (client,) = await attached(nursery)
    client.call(1, caps={"sampling": {}})  # no elicitation declared on this request
    up = upstream_of(net)
    up.ask(70, "elicitation/create", ELICIT)
    ((rid, _, message),) = up.refusals
    assert rid == 70 and "no elicitation capability" in message
    assert client.out.responses() == []  # the call goes on: the upstream decides what next
    # The call's own envelope decides, not a later request's.
    listing = {"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": {"_meta": envelope()}}
    client.session.handle_line(json.dumps(listing).encode())
    assert "elicitation" in client.session.client_capabilities
    up.ask(71, "elicitation/create", ELICIT)
    assert [r[0] for r in up.refusals] == [70, 71]


async def test_a_request_no_single_call_owns_is_refused(nursery: trio.Nursery) -> None:
    net, (client,) = await attached(nursery)
    client.call(1)
    client.call(2)
    up = upstream_of(net)
    up.ask(70, "elicitation/create", ELICIT)
    ((_, _, message),) = up.refusals
    assert "cannot tell which call" in message
    assert client.out.responses() == []
    # The stream it came on names the call (HTTP upstreams): that call is asked.
    up.ask(71, "elicitation/create", ELICIT, on_stream_of=up.sent[1][0])
    (answer,) = client.out.responses()
    assert answer["id"] == 2 and answer["result"]["resultType"] == "input_required"


async def test_without_a_task_to_bound_the_wait_the_session_refuses(
    nursery: trio.Nursery,
) -> None:
    net, (client,) = await attached(nursery, spawn=False)
    client.call(1)
    up = upstream_of(net)
    up.ask(70, "elicitation/create", ELICIT)
    ((_, _, message),) = up.refusals
    assert "no task to bound a wait for its retry" in message


async def test_held_calls_are_bounded_per_session(nursery: trio.Nursery) -> None:
    net = RecordingNet(srv=FakeServer([tool("a")]))
    pool = make_pool(nursery, net)
    out = FakeWriter()
    session = Session("s", name="s", cwd=None, pool=pool, out=out, log=LogLines())
    session.spawn = nursery.start_soon
    await session.apply_settings({"srv": desired("srv", stdio())}, 1)
    await trio.testing.wait_all_tasks_blocked()
    client = Client(session, out)
    up = upstream_of(net)
    for n in range(MAX_HELD_CALLS + 1):
        client.call(n)
        up.ask(100 + n, "elicitation/create", ELICIT, on_stream_of=up.sent[-1][0])
    assert len(session.flights._holding) == MAX_HELD_CALLS
    ((rid, _, message),) = up.refusals
    assert rid == 100 + MAX_HELD_CALLS and "calls waiting for its input" in message
