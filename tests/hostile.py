"""Hypothesis strategies for hostile JSON-RPC input (issue 12), shared by the session fuzzer
(tests/session/test_fuzz.py) and the daemon fuzzer (tests/e2e/test_fuzz_daemon.py).

`lines(...)` draws what a client can put on the wire: messages of every method mcpool handles
with each field absent, well typed, or of a wrong type; ids that are objects, arrays, floats,
huge integers, booleans or null, drawn from a small pool too so that duplicates are common;
batches; responses to requests never sent; notifications for unknown ids; and raw bytes
(invalid UTF-8, deep nesting, long lines). `expected_answers` says which ids a line's requests
must be answered under, with mcpool's own decoder as the envelope oracle (the protocol fuzzer
checks that decoder on its own).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from hypothesis import strategies as st

from mcpool.protocol import (
    META_CLIENT_CAPABILITIES,
    META_LOG_LEVEL,
    META_PROTOCOL_VERSION,
    MODERN_VERSION,
    McpoolError,
    decode,
)

LEVELS = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
# Any JSON value, kept small: the shape is what matters, not the size.
junk = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
_small_ids = st.sampled_from([1, 2, "a", "mcpool-1", "mcpool-2", 0, ""])
ids = st.one_of(
    _small_ids,
    _small_ids,  # twice: duplicate ids are the interesting case
    st.integers(-(2**63), 2**63),
    st.integers(2**64, 2**200),  # huge
    st.text(max_size=10),
    st.floats(allow_nan=False, allow_infinity=False),
    st.none(),
    st.just({}),
    st.lists(st.integers(), max_size=2),
    st.booleans(),
)
tokens = st.one_of(st.integers(-5, 5), st.text(max_size=6), junk)
_envelope = st.fixed_dictionaries(
    {META_PROTOCOL_VERSION: st.sampled_from([MODERN_VERSION, "1999-01-01"]) | junk},
    optional={
        META_CLIENT_CAPABILITIES: st.just({}) | junk,
        META_LOG_LEVEL: st.sampled_from(LEVELS) | junk,
    },
)
metas = st.one_of(
    st.fixed_dictionaries({}, optional={"progressToken": tokens}),
    _envelope,
    junk,
)


def _fields(good: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Params with each field absent, well typed, or of any other type."""
    every = {**good, "_meta": metas}
    return st.fixed_dictionaries({}, optional={k: v | junk for k, v in every.items()})


def _methods(
    tools: list[str], prompts: list[str], uris: list[str]
) -> dict[str, st.SearchStrategy[dict[str, Any]]]:
    text = st.text(max_size=8)
    tool = st.sampled_from(tools) | text
    prompt = st.sampled_from(prompts) | text
    uri = st.sampled_from(uris) | text
    cursor = st.sampled_from(["bzo1", "bzotMQ", "eDox", "o:1", ""]) | text
    return {
        "initialize": _fields(
            {
                "protocolVersion": st.sampled_from(["2025-03-26", "2025-06-18", "9999"]),
                "capabilities": st.just({}) | st.just({"sampling": {}, "roots": {}}),
                "clientInfo": st.just({"name": "fuzz", "version": "0"}),
            }
        ),
        "ping": _fields({}),
        "server/discover": _fields({}),
        "tools/list": _fields({"cursor": cursor}),
        "prompts/list": _fields({"cursor": cursor}),
        "resources/list": _fields({"cursor": cursor}),
        "resources/templates/list": _fields({"cursor": cursor}),
        "tools/call": _fields(
            {"name": tool, "arguments": st.dictionaries(st.sampled_from(["text", "x"]), junk)}
        ),
        "prompts/get": _fields({"name": prompt, "arguments": st.dictionaries(text, text)}),
        "resources/read": _fields({"uri": uri}),
        "resources/subscribe": _fields({"uri": uri}),
        "resources/unsubscribe": _fields({"uri": uri}),
        "completion/complete": _fields(
            {
                "ref": st.one_of(
                    st.builds(lambda n: {"type": "ref/prompt", "name": n}, prompt),
                    st.builds(lambda u: {"type": "ref/resource", "uri": u}, uri),
                    st.fixed_dictionaries({"type": junk, "name": junk, "uri": junk}),
                ),
                "argument": st.fixed_dictionaries({"name": text | junk, "value": text | junk}),
            }
        ),
        "logging/setLevel": _fields({"level": st.sampled_from(LEVELS) | text}),
        "subscriptions/listen": _fields(
            {
                "notifications": st.fixed_dictionaries(
                    {},
                    optional={
                        "toolsListChanged": st.booleans() | junk,
                        "resourceSubscriptions": st.lists(uri, max_size=2) | junk,
                    },
                )
            }
        ),
        "no/such/method": _fields({}),
    }


def _notifications(uris: list[str]) -> dict[str, st.SearchStrategy[dict[str, Any]]]:
    return {
        "notifications/initialized": _fields({}),
        "notifications/cancelled": _fields({"requestId": ids, "reason": st.text(max_size=8)}),
        "notifications/progress": _fields(
            {"progressToken": tokens, "progress": st.integers(0, 9), "total": st.integers(0, 9)}
        ),
        "notifications/roots/list_changed": _fields({}),
        "notifications/no/such": _fields({}),
    }


@st.composite
def messages(
    draw: st.DrawFn, tools: list[str], prompts: list[str], uris: list[str]
) -> dict[str, Any]:
    """One JSON-RPC object: a request, a notification, a response, or a broken envelope."""
    shape = draw(st.sampled_from(["request"] * 3 + ["notification"] * 2 + ["response", "broken"]))
    message: dict[str, Any] = {"jsonrpc": "2.0"}
    if shape == "request":
        method, params = draw(st.sampled_from(sorted(_methods(tools, prompts, uris).items())))
        message.update(id=draw(ids), method=method)
    elif shape == "notification":
        kinds = sorted(_notifications(uris).items())
        cancel = [k for k in kinds if k[0] == "notifications/cancelled"]
        method, params = draw(st.sampled_from(kinds + cancel * 2))  # the one that killed it
        message["method"] = method
    elif shape == "response":
        message["id"] = draw(ids)
        if draw(st.booleans()):
            message["result"] = draw(junk)
        else:
            message["error"] = draw(
                st.fixed_dictionaries({"code": st.integers(-33000, 0), "message": st.text()}) | junk
            )
        return message
    else:
        # Members of the wrong type or missing: the envelope itself is hostile.
        message = draw(
            st.fixed_dictionaries(
                {},
                optional={"jsonrpc": st.just("2.0") | junk, "id": ids, "method": junk},
            )
        )
        return message
    choice = draw(st.sampled_from(["params", "params", "params", "junk", "absent"]))
    if choice == "params":
        message["params"] = draw(params)
    elif choice == "junk":
        message["params"] = draw(junk)
    return message


_raw = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"\xff\xfe\xfd", b'{"jsonrpc":"2.0","id":"\xc3\x28","method":"ping"}', b"[]"]),
    st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n),  # deep nesting
    st.integers(1, 3000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.integers(1000, 50_000).map(
        lambda n: (
            b'{"jsonrpc":"2.0","id":"long","method":"ping","params":{"pad":"' + b"x" * n + b'"}}'
        )
    ),
)


def encode(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


@st.composite
def lines(
    draw: st.DrawFn,
    tools: list[str],
    prompts: list[str],
    uris: list[str],
) -> bytes:
    """One line a hostile client sends (no newline): a message, a batch, or raw bytes."""
    kind = draw(st.sampled_from(["message", "message", "message", "batch", "raw"]))
    if kind == "message":
        return encode(draw(messages(tools, prompts, uris)))
    if kind == "batch":
        return encode(draw(st.lists(messages(tools, prompts, uris), min_size=1, max_size=4)))
    raw: bytes = draw(_raw)
    return raw.replace(b"\n", b" ")


def expected_answers(line: bytes, *, framed: bool = False) -> tuple[Counter[Any], int, set[Any]]:
    """(ids that must each be answered, how many times; null-id errors due; ids cancelled).

    A line that does not decode earns one error with a null id; a decoded one, one answer per
    request. A request named by a notifications/cancelled may go unanswered (the spec's rule).
    `framed`: the line came through the daemon's framer, which skips blank lines.
    """
    if framed and (not line or line.isspace()):
        return Counter(), 0, set()
    try:
        decoded = decode(line)
    except McpoolError:
        return Counter(), 1, set()
    members = decoded if isinstance(decoded, list) else [decoded]
    want: Counter[Any] = Counter()
    cancelled: set[Any] = set()
    for m in members:
        if m.is_request:
            want[_key(m.id)] += 1
        elif m.method == "notifications/cancelled":
            try:
                rid = json.loads(bytes(m.params)).get("requestId")  # type: ignore[arg-type]
            except (TypeError, ValueError, AttributeError):
                continue
            cancelled.add(_key(rid))
    return want, 0, cancelled


def _key(value: Any) -> Any:
    """A hashable, type-exact key for an id (1 and True, 1 and "1" stay apart)."""
    return (type(value).__name__, json.dumps(value, sort_keys=True))


def answers_in(data: bytes) -> list[dict[str, Any]]:
    """Every response in what the session wrote (batch arrays flattened)."""
    out: list[dict[str, Any]] = []
    for line in data.splitlines():
        if not line.strip():
            continue
        value = json.loads(line)
        for item in value if isinstance(value, list) else [value]:
            if "method" not in item and ("result" in item or "error" in item):
                out.append(item)
    return out


key = _key
