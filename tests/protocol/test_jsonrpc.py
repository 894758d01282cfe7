from __future__ import annotations

import contextlib
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec import UNSET, Raw

from mcpool.protocol import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    PARSE_ERROR,
    ErrorObject,
    ErrorResponse,
    InvalidParams,
    InvalidRequest,
    LocalProtocolError,
    Message,
    Notification,
    ParseError,
    Request,
    Response,
    decode,
    decode_params,
    encode,
    error_response,
    notification,
    request,
    request_line,
    response,
    response_line,
    split_result,
    to_raw,
)


def test_decode_request() -> None:
    msg = decode(b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":"c"}}')
    assert isinstance(msg, Message)
    assert msg.id == 1
    assert msg.method == "tools/list"
    assert msg.is_request
    assert not msg.is_notification
    assert not msg.is_response
    assert decode_params(msg.params) == {"cursor": "c"}


def test_decode_notification() -> None:
    msg = decode(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    assert isinstance(msg, Message)
    assert msg.is_notification
    assert not msg.is_request
    assert not msg.is_response
    assert msg.id is UNSET
    assert msg.params is UNSET
    assert decode_params(msg.params) == {}


def test_decode_result_and_error_responses() -> None:
    ok = decode(b'{"jsonrpc":"2.0","id":"a","result":{}}')
    assert isinstance(ok, Message)
    assert ok.is_response
    assert ok.id == "a"
    assert ok.error is UNSET
    err = decode(b'{"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"nope"}}')
    assert isinstance(err, Message)
    assert err.is_response
    assert err.result is UNSET


def test_null_id_error_response_is_kept_distinct_from_absent() -> None:
    msg = decode(b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}')
    assert isinstance(msg, Message)
    assert msg.id is None
    assert msg.is_response
    assert encode(msg) == (
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}\n'
    )


def test_unknown_members_are_ignored() -> None:
    msg = decode(b'{"jsonrpc":"2.0","id":1,"method":"ping","extra":{"deep":[1,2]}}')
    assert isinstance(msg, Message)
    assert msg.is_request


def test_raw_params_pass_through_byte_identical() -> None:
    params = b'{ "name" : "x",\t"arguments": {"b":[3, 2 ,1], "a":"\\u00e9"} }'
    line = b'{"jsonrpc":"2.0","id":9,"method":"tools/call","params":' + params + b"}"
    msg = decode(line)
    assert isinstance(msg, Message)
    assert isinstance(msg.params, Raw)
    assert bytes(msg.params) == params
    out = request(41, "tools/call", msg.params)
    assert out == b'{"jsonrpc":"2.0","id":41,"method":"tools/call","params":' + params + b"}\n"
    assert params in encode(Request("2.0", 41, "tools/call", msg.params))


def test_raw_result_pass_through_byte_identical() -> None:
    result = b'{"tools": [ {"name":"b"}, {"name":"a"} ] }'
    msg = decode(b'{"jsonrpc":"2.0","id":5,"result":' + result + b"}")
    assert isinstance(msg, Message)
    assert isinstance(msg.result, Raw)
    assert response("client-1", msg.result) == (
        b'{"jsonrpc":"2.0","id":"client-1","result":' + result + b"}\n"
    )


def test_rewriting_the_id_of_a_decoded_message_keeps_the_rest() -> None:
    msg = decode(b'{"jsonrpc":"2.0","id":1,"method":"m","params":[1, 2]}')
    assert isinstance(msg, Message)
    msg.id = 1000
    assert encode(msg) == b'{"jsonrpc":"2.0","id":1000,"method":"m","params":[1, 2]}\n'


def test_batch() -> None:
    batch = decode(
        b'[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","method":"b"},'
        b'{"jsonrpc":"2.0","id":2,"result":1}]'
    )
    assert isinstance(batch, list)
    assert [m.is_request for m in batch] == [True, False, False]
    assert batch[1].is_notification
    assert batch[2].is_response


def test_empty_batch_is_invalid_request() -> None:
    with pytest.raises(InvalidRequest):
        decode(b"[]")


def test_batch_with_one_invalid_member_is_invalid_request() -> None:
    with pytest.raises(InvalidRequest):
        decode(b'[{"jsonrpc":"2.0","method":"a"}, {"jsonrpc":"1.0","method":"b"}]')
    with pytest.raises(InvalidRequest):
        decode(b'[{"jsonrpc":"2.0","method":"a"}, 5]')


@pytest.mark.parametrize(
    ("line", "offset"),
    [
        (b"{", 1),
        (b"", 0),
        (b'{"jsonrpc":"2.0",x', 17),
        (b'{"jsonrpc":"2.0","id":1} trailing', None),
        (b"not json", None),
        (b'{"jsonrpc":"2.0","method":"\xff"}', None),
        (
            b'{"jsonrpc":5, oops',
            None,
        ),  # a type error before the syntax error is still a parse error
        (b"5 x", None),
        (b'{"jsonrpc":"2.0","method":"m","params":' + b"[" * 100_000, None),
    ],
)
def test_malformed_json_is_parse_error(line: bytes, offset: int | None) -> None:
    with pytest.raises(ParseError) as info:
        decode(line)
    assert info.value.code == PARSE_ERROR
    assert "reason" in info.value.data
    if offset is not None:
        assert info.value.offset == offset


@pytest.mark.parametrize(
    "line",
    [
        b"5",
        b'"string"',
        b"null",
        b"true",
        b"[1, 2]",
        b"{}",
        b'{"id":1,"method":"m"}',  # jsonrpc missing
        b'{"jsonrpc":"1.0","id":1,"method":"m"}',
        b'{"jsonrpc":2.0,"id":1,"method":"m"}',
        b'{"jsonrpc":"2.0","id":1,"method":5}',
        b'{"jsonrpc":"2.0","id":1.5,"method":"m"}',
        b'{"jsonrpc":"2.0","id":true,"method":"m"}',
        b'{"jsonrpc":"2.0","id":[1],"method":"m"}',
        b'{"jsonrpc":"2.0","id":{},"method":"m"}',
        b'{"jsonrpc":"2.0","id":null,"method":"m"}',
        b'{"jsonrpc":"2.0","id":1,"method":"m","result":1}',
        b'{"jsonrpc":"2.0","method":"m","error":{}}',
        b'{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1,"message":"x"}}',
        b'{"jsonrpc":"2.0","id":1}',
        b'{"jsonrpc":"2.0","result":1}',
        b'{"jsonrpc":"2.0","id":null,"result":1}',
        b'{"jsonrpc":"2.0","error":{"code":1,"message":"x"}}',
        b'{"jsonrpc":"2.0"}',
    ],
)
def test_valid_json_that_is_not_jsonrpc_is_invalid_request(line: bytes) -> None:
    with pytest.raises(InvalidRequest) as info:
        decode(line)
    assert info.value.code == INVALID_REQUEST
    assert info.value.data["reason"]


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc":"2.0","method":"m","params":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"a":' * 100_000 + b"1" + b"}" * 100_000,  # an unknown member is skipped recursively
    ],
)
def test_too_deep_valid_json_is_parse_error_not_recursion_error(line: bytes) -> None:
    # msgspec cannot parse it within the interpreter's recursion limit: for the peer, that is
    # a line we could not parse.
    with pytest.raises(ParseError):
        decode(line)


def test_encode_structs() -> None:
    assert encode(Request("2.0", 1, "ping")) == b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n'
    assert encode(Notification("2.0", "n")) == b'{"jsonrpc":"2.0","method":"n"}\n'
    assert encode(Response("2.0", "x", Raw(b"{}"))) == b'{"jsonrpc":"2.0","id":"x","result":{}}\n'
    assert encode(ErrorResponse("2.0", None, ErrorObject(-32600, "Invalid Request"))) == (
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request"}}\n'
    )
    assert encode({"jsonrpc": "2.0", "method": "n"}) == b'{"jsonrpc":"2.0","method":"n"}\n'
    assert encode([{"a": 1}]) == b'[{"a":1}]\n'


def test_jsonrpc_is_required_on_encode_structs() -> None:
    for cls in (Request, Notification, Response, ErrorResponse):
        with pytest.raises(TypeError):
            cls()
    # Not defaulted, so omit_defaults cannot drop it.
    assert b'"jsonrpc":"2.0"' in encode(Notification(jsonrpc="2.0", method="n"))


def test_encode_unencodable_is_local_protocol_error() -> None:
    with pytest.raises(LocalProtocolError):
        encode({"x": object()})
    with pytest.raises(LocalProtocolError):
        to_raw({1j})


def test_helpers() -> None:
    assert request(1, "tools/list") == b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}\n'
    assert request("r", "m", {"a": [1]}) == (
        b'{"jsonrpc":"2.0","id":"r","method":"m","params":{"a":[1]}}\n'
    )
    assert notification("notifications/tools/list_changed") == (
        b'{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}\n'
    )
    assert (
        notification("n", Raw(b'{"x" :1}')) == b'{"jsonrpc":"2.0","method":"n","params":{"x" :1}}\n'
    )
    assert response(2, None) == b'{"jsonrpc":"2.0","id":2,"result":null}\n'
    assert response(2, {"tools": []}) == b'{"jsonrpc":"2.0","id":2,"result":{"tools":[]}}\n'
    assert error_response(3, -32601, "Method not found") == (
        b'{"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"Method not found"}}\n'
    )
    assert error_response(None, -31004, "Message too large", {"reason": "r"}) == (
        b'{"jsonrpc":"2.0","id":null,"error":'
        b'{"code":-31004,"message":"Message too large","data":{"reason":"r"}}}\n'
    )


def test_helpers_output_decodes() -> None:
    for line in (
        request(1, "m", {"a": 1}),
        notification("n"),
        response("x", [1, 2]),
        error_response(None, -1, "m", {"reason": "r"}),
    ):
        assert isinstance(decode(line.rstrip(b"\n")), Message)


def test_to_raw() -> None:
    raw = to_raw({"a": [1, "b"]})
    assert isinstance(raw, Raw)
    assert bytes(raw) == b'{"a":[1,"b"]}'
    assert response(1, raw) == b'{"jsonrpc":"2.0","id":1,"result":{"a":[1,"b"]}}\n'


@pytest.mark.parametrize("raw", [b"[1]", b'"s"', b"1", b"null", b"{"])
def test_decode_params_rejects_non_objects(raw: bytes) -> None:
    with pytest.raises(InvalidParams) as info:
        decode_params(Raw(raw))
    assert info.value.code == INVALID_PARAMS


# Property tests --------------------------------------------------------------------------------

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
_raw = _json.map(to_raw)
_ids = st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.text()
_params = st.none().map(lambda _: UNSET) | st.dictionaries(st.text(max_size=8), _json).map(to_raw)

_requests = st.builds(Message, jsonrpc=st.just("2.0"), id=_ids, method=st.text(), params=_params)
_notifications = st.builds(Message, jsonrpc=st.just("2.0"), method=st.text(), params=_params)
_results = st.builds(Message, jsonrpc=st.just("2.0"), id=_ids, result=_raw)
_errors = st.builds(
    Message,
    jsonrpc=st.just("2.0"),
    id=_ids | st.none(),
    error=st.builds(ErrorObject, code=st.integers(-(2**31), 2**31), message=st.text()).map(to_raw),
)
_messages = _requests | _notifications | _results | _errors


@given(_messages)
def test_decode_encode_round_trip(msg: Message) -> None:
    line = encode(msg)
    assert line.endswith(b"\n")
    assert b"\n" not in line[:-1]  # one message per line: strings escape newlines
    assert decode(line[:-1]) == msg


@given(st.lists(_messages, min_size=1, max_size=5))
def test_batch_round_trip(msgs: list[Message]) -> None:
    assert decode(encode(msgs)) == msgs


@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_protocol_errors(line: bytes) -> None:
    with contextlib.suppress(ParseError, InvalidRequest):
        decode(line)


def _mutations() -> st.SearchStrategy[bytes]:
    def mutate(args: tuple[bytes, int, bytes]) -> bytes:
        line, at, insert = args
        at %= len(line) + 1
        return line[:at] + insert + line[at + 1 :]

    return st.tuples(_messages.map(encode), st.integers(0, 500), st.binary(max_size=3)).map(mutate)


@given(_mutations())
def test_mutated_valid_lines_raise_only_protocol_errors(line: bytes) -> None:
    try:
        result: Any = decode(line)
    except (ParseError, InvalidRequest):
        return
    assert isinstance(result, Message | list)


def test_decode_accepts_what_msgspec_considers_json_only() -> None:
    # A sanity anchor for the property above: our ParseError mirrors msgspec's own verdict.
    with pytest.raises(msgspec.DecodeError):
        msgspec.json.decode(b"{")
    with pytest.raises(ParseError):
        decode(b"{")


# -- lines put together from already encoded parts (the relay's hot path) ----------------------


@pytest.mark.parametrize("method", ["tools/call", "x", 'we"ird\\méthod\n', ""])
@pytest.mark.parametrize(
    "params", [b"{}", b'{"name":"echo","arguments":{"text":"\\u00e9"}}', b"[1]"]
)
@pytest.mark.parametrize("uid", [0, 1, 2**53, -1])
def test_request_line_is_what_request_encodes(uid: int, method: str, params: bytes) -> None:
    assert request_line(uid, method, params) == request(uid, method, Raw(params))
    assert request_line(uid, method, Raw(params)) == request(uid, method, Raw(params))


def test_request_line_methods_beyond_the_cache_are_still_encoded() -> None:
    for i in range(300):
        method = f"m/{i}"
        assert request_line(i, method, b"{}") == request(i, method, Raw(b"{}"))


@pytest.mark.parametrize("msg_id", [0, 7, -3, 2**63, "a", "", 'q"u\\o\u2028te', "é"])
@pytest.mark.parametrize("result", [b"{}", b'{"content":[{"type":"text","text":"x"}]}'])
def test_response_line_is_what_response_encodes(msg_id: int | str, result: bytes) -> None:
    assert response_line(msg_id, result) == response(msg_id, Raw(result))
    assert response_line(msg_id, Raw(result)) == response(msg_id, Raw(result))
    assert decode(response_line(msg_id, result).rstrip(b"\n")).id == msg_id


def _envelopes() -> list[tuple[bytes, bool]]:
    """Every combination of the envelope's members, and whether JSON-RPC 2.0 accepts it."""
    cases = []
    for version in ('"2.0"', '"1.0"'):
        for msg_id in (None, "null", "1", '"s"'):
            for method in (None, '"m"'):
                for result in (None, "1"):
                    for error in (None, '{"code":1,"message":"x"}'):
                        members = {"jsonrpc": version, "id": msg_id, "method": method}
                        members |= {"result": result, "error": error}
                        line = ",".join(f'"{k}":{v}' for k, v in members.items() if v is not None)
                        if version != '"2.0"':
                            ok = False
                        elif method is not None:  # a request or a notification
                            ok = result is None and error is None and msg_id != "null"
                        else:  # a response: one of result and error, an id (null: errors only)
                            ok = (result is None) != (error is None) and msg_id is not None
                            ok = ok and not (result is not None and msg_id == "null")
                        cases.append((("{" + line + "}").encode(), ok))
    return cases


@pytest.mark.parametrize(("line", "valid"), _envelopes())
def test_decode_accepts_exactly_the_valid_envelopes(line: bytes, valid: bool) -> None:
    if valid:
        msg = decode(line)
        assert isinstance(msg, Message)
        assert msg.is_request or msg.is_notification or msg.is_response
        assert [m.id for m in decode(b"[" + line + b"]")] == [msg.id]  # in a batch alike
    else:
        with pytest.raises(InvalidRequest):
            decode(line)
        with pytest.raises(InvalidRequest):
            decode(b"[" + line + b"]")


# -- split_result: a result response cut at its envelope, by position alone --------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)
_members = st.lists(
    st.sampled_from(["jsonrpc", "id", "result", "error", "extra", "id2"]), min_size=1, max_size=5
)


def _member(name: str, uid: int, result: Any) -> bytes:
    value: Any = {
        "jsonrpc": "2.0",
        "id": uid,
        "result": result,
        "error": {"code": 1, "message": "m"},
        "extra": [1],
        "id2": uid + 1,
    }[name]
    key = "id" if name == "id2" else name
    return msgspec.json.encode(key) + b":" + msgspec.json.encode(value)


@given(_members, st.integers(min_value=0, max_value=2**40), _json_values, st.booleans())
def test_a_split_result_that_parses_is_the_whole_lines_result(
    names: list[str], uid: int, result: Any, spaced: bool
) -> None:
    """Whenever `split_result` cuts a line and the cut parses as one value, the line is a
    result response with exactly that id and result: the caller's fallback (decoding the
    whole line) is only needed when the cut does not parse."""
    sep = b", " if spaced else b","
    line = b"{" + sep.join(_member(n, uid, result) for n in names) + b"}"
    split = split_result(line)
    if split is None:
        return
    try:
        cut = msgspec.json.decode(split[1])
    except msgspec.DecodeError:
        return
    whole = msgspec.json.decode(line)
    assert whole == {"jsonrpc": "2.0", "id": split[0], "result": cut}


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b'{"jsonrpc":"2.0","id":7,"result":{"a":1}}', (7, b'{"a":1}')),
        (b'{"result":[1,2],"jsonrpc":"2.0","id":12}\n', (12, b"[1,2]")),
        (b'{"jsonrpc":"2.0","id":"7","result":{}}', None),  # not an id of ours
        (b'{"jsonrpc":"2.0","id":07,"result":{}}', None),  # not a JSON number
        (b'{"jsonrpc":"2.0","id":-1,"result":{}}', None),
        (b'{"jsonrpc":"2.0","id":7,"result":}', None),
        (b'{"jsonrpc":"2.0","method":"x"}', None),
        (b"", None),
    ],
)
def test_split_result_cuts_only_the_sdks_compact_envelopes(
    line: bytes, expected: tuple[int, bytes] | None
) -> None:
    split = split_result(line)
    assert (None if split is None else (split[0], bytes(split[1]))) == expected
