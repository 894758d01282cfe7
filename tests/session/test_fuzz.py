"""Fuzzing policy-key normalization with hypothesis (issue 9; DESIGN policy-key table), and a
session's message handling with hostile input (issue 12, at the end).

The example-based rules live in test_policy.py; here they hold for arbitrary settings: a key is
insensitive to order and duplicates in includeTools/excludeTools and to `foo(args)` spellings,
normalization is idempotent (a key rebuilt from its own canonical form is the same key), the
encoded form identifies the key exactly, and `allows` follows the table for every name.

Hypothesis deadlines are off (`deadline=None`): timing is no property here, and a slow example on
a loaded CI machine must not fail the run.
"""

from __future__ import annotations

import collections
import random
from typing import Any

import hostile
import msgspec
import trio
import trio.lowlevel
import trio.testing
from fakes import BytesWriter, FakeNet, FakeServer, LogLines, desired, make_pool, stdio, tool
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcpool.protocol import Message
from mcpool.session import PolicyKey, Session, normalize_include

_tool_names = st.text(
    st.characters(codec="ascii", categories=["L", "N"], include_characters="_-."),
    min_size=1,
    max_size=8,
)
# What people write in includeTools: plain names, gemini-cli's `name(args)`, stray spaces.
_include_items = st.one_of(
    _tool_names,
    st.builds(
        lambda n, a: f"{n}({a})", _tool_names, st.text(max_size=8).filter(lambda a: ")" not in a)
    ),
    st.builds(lambda n: f"  {n} ", _tool_names),
)
_absent = st.just(None)


@st.composite
def _policies(draw: st.DrawFn) -> dict[str, Any]:
    """Settings fields of one server's policy; None means the field is absent."""
    fields: dict[str, Any] = {}
    for key, strategy in (
        ("trust", st.booleans()),
        ("includeTools", st.lists(_include_items, max_size=6)),
        ("excludeTools", st.lists(_tool_names, max_size=6)),
        ("alwaysLoadTools", st.booleans()),
    ):
        value = draw(_absent | strategy)
        if value is not None:
            fields[key] = value
    return fields


def _key(fields: dict[str, Any]) -> PolicyKey:
    return PolicyKey.from_settings(stdio(**fields))


def _shuffled_with_duplicates(items: list[str], rnd: random.Random) -> list[str]:
    out = items + [rnd.choice(items) for _ in range(rnd.randint(0, 3))] if items else []
    rnd.shuffle(out)
    return out


@settings(deadline=None)
@given(_policies(), st.randoms(use_true_random=False))
def test_order_and_duplicates_never_change_the_key(
    fields: dict[str, Any], rnd: random.Random
) -> None:
    other = dict(fields)
    for name in ("includeTools", "excludeTools"):
        if name in other:
            other[name] = _shuffled_with_duplicates(other[name], rnd)
    a, b = _key(fields), _key(other)
    assert a == b
    assert hash(a) == hash(b)
    assert a.encoded() == b.encoded()


@settings(deadline=None)
@given(_policies())
def test_normalization_is_idempotent(fields: dict[str, Any]) -> None:
    key = _key(fields)
    canon = key.canonical()
    rebuilt: dict[str, Any] = {
        "excludeTools": canon["excludeTools"],
        "alwaysLoadTools": canon["alwaysLoadTools"],
    }
    if canon["trust"] is not None:
        rebuilt["trust"] = canon["trust"]
    if canon["includeTools"] is not None:
        rebuilt["includeTools"] = canon["includeTools"]
    again = _key(rebuilt)
    assert again == key
    assert again.encoded() == key.encoded()
    assert again.canonical() == canon


@settings(deadline=None)
@given(_include_items | st.text(max_size=12))
def test_include_name_normalization_is_idempotent(item: str) -> None:
    once = normalize_include(item)
    assert normalize_include(once) == once
    assert once == once.strip()


@settings(deadline=None)
@given(_tool_names, st.text(max_size=10).filter(lambda a: ")" not in a))
def test_include_with_arguments_is_the_bare_name(name: str, args: str) -> None:
    assert _key({"includeTools": [f"{name}({args})"]}) == _key({"includeTools": [name]})


@settings(deadline=None)
@given(_policies(), _policies())
def test_encoded_form_identifies_the_key(a: dict[str, Any], b: dict[str, Any]) -> None:
    ka, kb = _key(a), _key(b)
    assert (ka == kb) == (ka.encoded() == kb.encoded())


@settings(deadline=None)
@given(_policies(), st.lists(_tool_names, max_size=10))
def test_allows_follows_the_table(fields: dict[str, Any], names: list[str]) -> None:
    key = _key(fields)
    include = fields.get("includeTools")
    exclude = set(fields.get("excludeTools") or ())
    included = None if include is None else {normalize_include(n) for n in include}
    for name in [*names, *exclude, *(included or ())]:
        expected = name not in exclude and (included is None or name in included)
        assert key.allows(name) == expected, (name, fields)
        assert key.explain(name)[0] == expected


@settings(deadline=None)
@given(_policies())
def test_trust_stays_three_valued_and_always_load_two_valued(fields: dict[str, Any]) -> None:
    key = _key(fields)
    assert key.trust is fields.get("trust")  # None when absent, else the bool given
    assert key.always_load is (fields.get("alwaysLoadTools") is True)
    without_false_always_load = {
        k: v for k, v in fields.items() if not (k == "alwaysLoadTools" and v is False)
    }
    assert _key(without_false_always_load) == key
    without_empty_exclude = {
        k: v for k, v in fields.items() if not (k == "excludeTools" and v == [])
    }
    assert _key(without_empty_exclude) == key
    if "includeTools" not in fields:
        assert _key({**fields, "includeTools": []}) != key  # absent allows all, [] allows none


# -- hostile input through a real Session (issue 12) ---------------------------------------------

_TOOLS, _PROMPTS, _URIS = ["srv__a", "srv__crash"], ["srv__greet"], ["res://1"]

_upstream_steps = st.one_of(
    st.tuples(
        st.just("notify"),
        st.sampled_from(
            [
                "notifications/message",
                "notifications/progress",
                "notifications/resources/updated",
                "notifications/cancelled",
                "notifications/tools/list_changed",
                "notifications/whatever",
            ]
        ),
        hostile.junk
        | st.fixed_dictionaries(
            {},
            optional={
                "uri": hostile.junk,
                "level": hostile.junk,
                "requestId": hostile.ids,
                "progressToken": hostile.tokens,
            },
        ),
    ),
    st.tuples(
        st.just("ask"),
        st.sampled_from(["sampling/createMessage", "elicitation/create", "roots/list", "x/y"]),
        hostile.junk | st.fixed_dictionaries({}, optional={"_meta": hostile.metas}),
    ),
    st.tuples(st.just("answer"), st.integers(0, 3), hostile.junk, st.booleans()),
)
_client_steps = st.tuples(st.just("client"), hostile.lines(_TOOLS, _PROMPTS, _URIS))


@settings(
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    handshake=st.booleans(),
    early=st.lists(_client_steps, max_size=3),
    script=st.lists(_client_steps | _upstream_steps, max_size=14),
)
async def test_hostile_input_never_raises_and_every_request_is_answered(
    handshake: bool,
    early: list[tuple[Any, ...]],
    script: list[tuple[Any, ...]],
) -> None:
    """Whatever a client sends, and whatever its upstream sends meanwhile, the session never
    raises, never faults, and answers every request exactly once (a cancelled one at most
    once), each under the id it came with; a line that is not a message earns one error with
    a null id. The example ends with the session closing, which answers what is left."""
    sent: list[bytes] = []
    logs = LogLines()
    async with trio.open_nursery() as nursery:
        server = FakeServer(
            [tool("a"), tool("crash")],
            prompts=[{"name": "greet"}],
            resources=[{"uri": "res://1", "name": "r"}],
        )
        server.capabilities["logging"] = {}
        net = FakeNet(srv=server)
        pool = make_pool(nursery, net)
        out = BytesWriter()
        session = Session("s1", name="fuzz", cwd=None, pool=pool, out=out, log=logs)
        session.spawn = nursery.start_soon
        for _, line in early:  # before the session's first generation: the backlog
            sent.append(line)
            session.handle_line(line)
        await session.apply_settings({"srv": desired("srv", stdio())}, 1)
        if handshake:
            for line in (INITIALIZE_LINE, INITIALIZED_LINE):
                session.handle_line(line)
        upstream = server.current
        for step in script:
            if step[0] == "client":
                sent.append(step[1])
                session.handle_line(step[1])
            elif step[0] == "notify":
                upstream.events.on_notification(step[1], msgspec.Raw(hostile.encode(step[2])))
            elif step[0] == "ask":
                ask = Message(
                    jsonrpc="2.0", id=7, method=step[1], params=msgspec.Raw(hostile.encode(step[2]))
                )
                upstream.events.on_server_request(upstream, ask)  # type: ignore[arg-type]
            else:
                pending = sorted(upstream._pending)
                if pending:
                    uid = pending[step[1] % len(pending)]
                    payload = msgspec.Raw(hostile.encode(step[2]))
                    reply = upstream._pending.pop(uid)
                    if step[3]:
                        reply(Message(jsonrpc="2.0", id=uid, error=payload))
                    else:
                        reply(Message(jsonrpc="2.0", id=uid, result=payload))
        for uid in sorted(upstream._pending):
            if uid in upstream._pending:
                upstream.reply(uid, {"content": []})
        await trio.testing.wait_all_tasks_blocked()
        faulted = session.closed
        session.close("the example is over")
        nursery.cancel_scope.cancel()
    assert not faulted, (session.close_reason, logs)
    assert not [entry for entry in logs if "internal error" in entry], logs
    want: collections.Counter[Any] = collections.Counter()
    nulls, cancelled = 0, set()
    for line in sent:
        w, n, c = hostile.expected_answers(line)
        want += w
        nulls += n
        cancelled |= c
    answers = hostile.answers_in(bytes(out.data))
    if handshake:
        answers = [a for a in answers if a.get("id") != INITIALIZE_ID]
    got = collections.Counter(hostile.key(a["id"]) for a in answers if a["id"] is not None)
    assert sum(1 for a in answers if a["id"] is None) == nulls, answers
    for key in set(want) | set(got):
        if key in cancelled:
            assert got[key] <= want[key], (key, answers)
        else:
            assert got[key] == want[key], (key, want, answers)


INITIALIZE_ID = "fuzz-init"
INITIALIZE_LINE = hostile.encode(
    {
        "jsonrpc": "2.0",
        "id": INITIALIZE_ID,
        "method": "initialize",
        "params": {"protocolVersion": "2025-03-26", "capabilities": {"sampling": {}}},
    }
)
INITIALIZED_LINE = hostile.encode({"jsonrpc": "2.0", "method": "notifications/initialized"})
