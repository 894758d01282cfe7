"""Fuzzing the protocol layer with hypothesis (issue 9), beyond the properties that sit next to
the unit tests (test_framing, test_jsonrpc, test_canonical):

- framing: the framer against a reference model of the whole byte stream: same lines, fails at
  exactly the feed where a line (or the incomplete tail) first passes the limit, with that size,
  never buffers past the limit, and stays failed; framed arbitrary streams decode or raise only
  protocol errors;
- codec: every helper's output decodes to what it was given, and a decoded message re-encodes
  byte for byte (mcpool forwards params and results verbatim);
- canonical comparison: idempotent, bytes equal exactly when the canonical forms are, equal under
  the allowed permutations of realistic tool schemas, different under any other change.

Hypothesis deadlines are off (`deadline=None`): timing is no property here, and a slow example on
a loaded CI machine must not fail the run.
"""

from __future__ import annotations

import contextlib
import json
import random
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from msgspec import UNSET

from mcpool.protocol import (
    InvalidRequest,
    LineFramer,
    Message,
    MessageTooLarge,
    ParseError,
    canonical,
    canonical_bytes,
    decode,
    encode,
    error_response,
    notification,
    request,
    response,
    to_raw,
)

# -- framing -------------------------------------------------------------------------------------

_pieces = st.one_of(
    st.binary(max_size=60),
    st.binary(max_size=300).map(lambda b: b.replace(b"\n", b"x")),  # long runs without newline
    st.sampled_from([b"\n", b"\r\n", b"\r", b" \t", b"\n\n", b'{"jsonrpc":"2.0"}', b"\x00\xff"]),
)


@st.composite
def _streams(draw: st.DrawFn) -> tuple[list[bytes], int]:
    """(chunks, limit): a byte stream of mixed pieces, cut at arbitrary points."""
    stream = b"".join(draw(st.lists(_pieces, max_size=25)))
    cuts = sorted(draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    chunks, start = [], 0
    for cut in [*cuts, len(stream)]:
        chunks.append(stream[start:cut])
        start = cut
    return chunks, draw(st.integers(1, 120))


def _model(seen: bytes, limit: int) -> tuple[list[bytes], int | None]:
    """What a framer fed `seen` so far must have produced: (lines, size of the first line
    over the limit or None). A line's size counts its trailing \\r (see _framing)."""
    *complete, tail = seen.split(b"\n")
    for line in complete:
        if len(line) > limit:
            return [], len(line)
    if len(tail) > limit:
        return [], len(tail)
    lines = [line[:-1] if line.endswith(b"\r") else line for line in complete]
    return [line for line in lines if line and not line.isspace()], None


@settings(deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(_streams())
@example(([b"12345", b"6\nok\n"], 5))  # an oversize line completed across chunks
@example(([b"ok\r\n", b"\r\n  \n"], 2))  # CRLF and blank lines at the limit
def test_framer_matches_the_stream_model(case: tuple[list[bytes], int]) -> None:
    chunks, limit = case
    framer = LineFramer(limit)
    out: list[bytes] = []
    seen = b""
    for chunk in chunks:
        seen += chunk
        expected, too_large = _model(seen, limit)
        if too_large is not None:
            with pytest.raises(MessageTooLarge) as info:
                framer.feed(chunk)
            assert info.value.data["size"] == too_large
            assert info.value.data["limit"] == limit
            assert framer.pending() == 0  # nothing of the bad line is kept
            # Poisoned: the rest of that line must never be read as messages.
            with pytest.raises(MessageTooLarge):
                framer.feed(b"\n" + b'{"jsonrpc":"2.0","method":"x"}\n')
            return
        out += framer.feed(chunk)
        assert out == expected
        assert framer.pending() <= limit
        assert framer.pending() == len(seen) - (seen.rfind(b"\n") + 1)


@settings(deadline=None, max_examples=50)
@given(st.integers(1, 4096), st.integers(1, 8), st.binary(min_size=1, max_size=64))
def test_framer_memory_is_bounded_by_the_limit_for_endless_lines(
    limit: int, chunk_factor: int, pattern: bytes
) -> None:
    # A peer that never sends a newline: the framer fails once past the limit, holding at most
    # `limit` bytes before that, however the stream is chunked.
    framer = LineFramer(limit)
    chunk = (pattern.replace(b"\n", b"") or b"x") * chunk_factor
    fed = 0
    while fed + len(chunk) <= limit:
        assert framer.feed(chunk) == []
        fed += len(chunk)
        assert framer.pending() == fed
    with pytest.raises(MessageTooLarge):
        framer.feed(chunk)
    assert framer.pending() == 0


_messages = st.builds(
    lambda i, m, p: request(i, m, p),
    st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5),
    st.text(max_size=10),
    st.dictionaries(st.text(max_size=4), st.integers() | st.text(max_size=4), max_size=3),
)


@settings(deadline=None)
@given(
    st.lists(
        _messages
        | st.binary(max_size=40)
        | st.sampled_from([b"{", b"[]", b"[", b'{"jsonrpc":"2.0"}', b"null", b'"\\ud800"']),
        max_size=15,
    ),
    st.integers(1, 200),
)
def test_framed_arbitrary_streams_decode_or_raise_only_protocol_errors(
    pieces: list[bytes], limit: int
) -> None:
    framer = LineFramer(limit)
    try:
        lines = framer.feed(b"".join(pieces))
    except MessageTooLarge:
        return
    for line in lines:
        with contextlib.suppress(ParseError, InvalidRequest):
            decoded = decode(line)
            assert isinstance(decoded, Message | list)


# -- codec ---------------------------------------------------------------------------------------

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=15,
)
_objects = st.dictionaries(st.text(max_size=6), _json, max_size=5)
_ids = st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8)
_methods = st.text(max_size=20) | st.sampled_from(["tools/call", "tools/list", "initialize"])


def _plain(raw: Any) -> Any:
    return msgspec.json.decode(raw)


@settings(deadline=None)
@given(_ids, _methods, _objects)
def test_request_helper_round_trips(msg_id: Any, method: str, params: dict[str, Any]) -> None:
    line = request(msg_id, method, params)
    assert line.endswith(b"\n")
    assert b"\n" not in line[:-1]
    msg = decode(line[:-1])
    assert isinstance(msg, Message)
    assert (msg.id, msg.method, _plain(msg.params)) == (msg_id, method, params)
    assert msg.is_request


@settings(deadline=None)
@given(_methods, _objects | st.none())
def test_notification_helper_round_trips(method: str, params: dict[str, Any] | None) -> None:
    msg = decode(notification(method, UNSET if params is None else params)[:-1])
    assert isinstance(msg, Message)
    assert msg.is_notification
    assert msg.method == method
    assert (msg.params is UNSET) if params is None else (_plain(msg.params) == params)


@settings(deadline=None)
@given(_ids, _json)
def test_response_helper_round_trips(msg_id: Any, result: Any) -> None:
    msg = decode(response(msg_id, result)[:-1])
    assert isinstance(msg, Message)
    assert msg.is_response
    assert (msg.id, _plain(msg.result)) == (msg_id, result)


@settings(deadline=None)
@given(_ids | st.none(), st.integers(-(2**31), 2**31), st.text(), _json)
def test_error_helper_round_trips(msg_id: Any, code: int, text: str, data: Any) -> None:
    msg = decode(error_response(msg_id, code, text, data)[:-1])
    assert isinstance(msg, Message)
    assert msg.is_response
    assert msg.id == msg_id
    assert _plain(msg.error) == {"code": code, "message": text, "data": data}


@settings(deadline=None)
@given(_ids, _methods, _objects, _ids)
def test_forwarding_keeps_params_byte_identical(
    msg_id: Any, method: str, params: dict[str, Any], new_id: Any
) -> None:
    # Whitespace and key order as a client might send them: mcpool must not re-serialize.
    body = json.dumps(params, indent=1, sort_keys=True, ensure_ascii=False).encode()
    line = b'{"jsonrpc":"2.0","id":%s,"method":%s,"params":%s}' % (
        json.dumps(msg_id).encode(),
        json.dumps(method).encode(),
        body,
    )
    msg = decode(line)
    assert isinstance(msg, Message)
    assert bytes(msg.params) == body
    forwarded = encode(msgspec.structs.replace(msg, id=new_id))
    again = decode(forwarded[:-1])
    assert isinstance(again, Message)
    assert bytes(again.params) == body
    assert again.id == new_id


@settings(deadline=None)
@given(_ids, _methods, _objects)
def test_reencoding_a_decoded_message_is_byte_identical(
    msg_id: Any, method: str, params: dict[str, Any]
) -> None:
    line = request(msg_id, method, to_raw(params))
    msg = decode(line[:-1])
    assert encode(msg) == line


# -- canonical comparison ------------------------------------------------------------------------

_names = st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=6)
# No bools or floats where Python equality would blur the comparison (True == 1 == 1.0).
_leaf = st.none() | st.integers(-50, 50) | st.text(max_size=5)
_values = st.recursive(
    _leaf,
    lambda c: (
        st.lists(c, max_size=4)
        | st.dictionaries(
            st.sampled_from(["type", "required", "enum", "default", "x", "y"]), c, max_size=4
        )
    ),
    max_leaves=16,
)


@st.composite
def _schemas(draw: st.DrawFn, depth: int = 2) -> dict[str, Any]:
    """A JSON Schema object as tools declare them (properties, required, type, enum, default)."""
    props: dict[str, Any] = {}
    for name in draw(st.lists(_names, unique=True, max_size=4)):
        kind = draw(st.sampled_from(["string", "integer", "array", "object", "multi", "enum"]))
        if kind == "object" and depth:
            props[name] = draw(_schemas(depth - 1))
        elif kind == "array":
            props[name] = {
                "type": "array",
                "items": {"type": "string"},
                "default": draw(st.lists(_names, max_size=3)),
            }
        elif kind == "multi":
            props[name] = {
                "type": draw(
                    st.lists(
                        st.sampled_from(["string", "null", "number"]),
                        unique=True,
                        min_size=2,
                        max_size=3,
                    )
                )
            }
        elif kind == "enum":
            props[name] = {
                "type": "string",
                "enum": draw(st.lists(_names, unique=True, min_size=1, max_size=4)),
            }
        else:
            props[name] = {"type": kind, "description": draw(st.text(max_size=8))}
    required = draw(st.lists(st.sampled_from(sorted(props)), unique=True)) if props else []
    return {"type": "object", "properties": props, "required": required}


_tools = st.lists(
    st.builds(
        lambda n, d, s: {"name": n, "description": d, "inputSchema": s},
        _names,
        st.text(max_size=10),
        _schemas(),
    ),
    max_size=4,
    unique_by=lambda t: t["name"],
)

_SET_KEYWORDS = ("required", "type", "enum")


def _permute(value: Any, rnd: random.Random) -> Any:
    """An equivalent value: every object's key order shuffled, set-keyword string arrays too."""
    if isinstance(value, dict):
        keys = list(value)
        rnd.shuffle(keys)
        out = {}
        for key in keys:
            item = value[key]
            if (
                key in _SET_KEYWORDS
                and isinstance(item, list)
                and all(isinstance(x, str) for x in item)
            ):
                item = rnd.sample(item, len(item))
            else:
                item = _permute(item, rnd)
            out[key] = item
        return out
    if isinstance(value, list):
        return [_permute(v, rnd) for v in value]
    return value


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every location of a scalar leaf."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _paths(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _paths(v, (*path, i))]
    return [path]


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replace(value[head], rest, new)}
    copy = list(value)
    copy[head] = _replace(copy[head], rest, new)
    return copy


@settings(deadline=None)
@given(_values)
def test_canonical_is_idempotent(value: Any) -> None:
    once = canonical(value)
    assert canonical(once) == once
    assert canonical_bytes(once) == canonical_bytes(value)


@settings(deadline=None)
@given(_values, _values)
def test_canonical_bytes_are_equal_exactly_when_canonical_forms_are(a: Any, b: Any) -> None:
    assert (canonical_bytes(a) == canonical_bytes(b)) == (canonical(a) == canonical(b))


@settings(deadline=None)
@given(_tools, st.randoms(use_true_random=False))
def test_tool_lists_are_equal_under_allowed_permutations(
    tools: list[dict[str, Any]], rnd: random.Random
) -> None:
    # The list itself, as the registry compares it: its items' inputSchemas are schemas (S4);
    # the same arrays wrapped under an unknown key would be data.
    assert canonical_bytes(_permute(tools, rnd)) == canonical_bytes(tools)


@settings(deadline=None)
@given(_tools, st.data())
def test_tool_lists_differ_when_any_leaf_changes(
    tools: list[dict[str, Any]], data: st.DataObject
) -> None:
    paths = _paths(tools)
    if not paths:
        return
    path = data.draw(st.sampled_from(paths))
    old = tools
    for step in path:
        old = old[step]
    new = data.draw(_leaf.filter(lambda v: v != old or type(v) is not type(old)))
    # Even inside a set-like array: another member's value makes a duplicate, a different multiset.
    assert canonical_bytes(_replace(tools, path, new)) != canonical_bytes(tools)


@settings(deadline=None)
@given(_tools.filter(lambda t: len(t) >= 2), st.data())
def test_tool_order_is_significant(tools: list[dict[str, Any]], data: st.DataObject) -> None:
    i, j = data.draw(st.lists(st.integers(0, len(tools) - 1), min_size=2, max_size=2, unique=True))
    swapped = list(tools)
    swapped[i], swapped[j] = swapped[j], swapped[i]
    assert canonical_bytes(swapped) != canonical_bytes(tools)


@settings(deadline=None)
@given(
    st.sampled_from(_SET_KEYWORDS), st.lists(_names, min_size=1, max_size=4, unique=True), st.data()
)
def test_set_keyword_duplicates_and_members_are_significant(
    keyword: str, members: list[str], data: st.DataObject
) -> None:
    base = {keyword: members}
    dup = data.draw(st.sampled_from(members))
    assert canonical_bytes({keyword: [*members, dup]}) != canonical_bytes(base)
    assert canonical_bytes({keyword: members[1:]}) != canonical_bytes(base)
    # ...while under any other key, order alone is a difference once two members differ.
    if len(members) >= 2:
        assert canonical_bytes({"default": members[::-1]}) != canonical_bytes({"default": members})
