"""JSON-RPC 2.0 envelopes on msgspec.

Theory of operation: every message of every session passes through `decode` and `encode`, so only
the envelope is decoded; `params`, `result` and `error` stay `msgspec.Raw` (a view of the input
bytes) until something must look inside, and are written back verbatim when forwarded. The
decoder and encoders are built once here.

`decode` is the one boundary where msgspec's exceptions become ours: a line that is not JSON raises
ParseError, valid JSON that is not a JSON-RPC message raises InvalidRequest, and nothing else
escapes. `params`/`result` contents are not validated here (DESIGN: keep them raw); `decode_params`
does that for the messages mcpool itself handles.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from msgspec import UNSET, Raw, Struct, UnsetType

from ._errors import ErrorObject, InvalidParams, InvalidRequest, LocalProtocolError, ParseError

__all__ = [
    "ErrorObject",
    "ErrorResponse",
    "JsonRpcId",
    "Message",
    "Notification",
    "Request",
    "Response",
    "decode",
    "decode_params",
    "decode_unchecked",
    "encode",
    "error_response",
    "notification",
    "request",
    "request_line",
    "response",
    "response_line",
    "split_result",
    "to_raw",
]

JsonRpcId = int | str

_VERSION = "2.0"


# gc=False: these hold only str, int and Raw (which references bytes), so they can never be part
# of a reference cycle; skipping GC tracking matters at one object per message.
class Message(Struct, omit_defaults=True, gc=False):
    """Decode-side envelope of any message; UNSET means the member was absent."""

    jsonrpc: str
    id: JsonRpcId | UnsetType | None = UNSET  # None is an explicit null
    method: str | UnsetType = UNSET
    params: Raw | UnsetType = UNSET
    result: Raw | UnsetType = UNSET
    error: Raw | UnsetType = UNSET

    @property
    def is_request(self) -> bool:
        return self.method is not UNSET and self.id is not UNSET

    @property
    def is_notification(self) -> bool:
        return self.method is not UNSET and self.id is UNSET

    @property
    def is_response(self) -> bool:
        return (
            self.method is UNSET
            and self.id is not UNSET
            and (self.result is not UNSET or self.error is not UNSET)
        )


# jsonrpc is required on the encode side: with omit_defaults a defaulted "2.0" would be dropped.
class Request(Struct, omit_defaults=True, gc=False):
    jsonrpc: str
    id: JsonRpcId
    method: str
    params: Raw | UnsetType = UNSET


class Notification(Struct, omit_defaults=True, gc=False):
    jsonrpc: str
    method: str
    params: Raw | UnsetType = UNSET


class Response(Struct, gc=False):
    jsonrpc: str
    id: JsonRpcId
    result: Raw


class ErrorResponse(Struct, gc=False):
    jsonrpc: str
    id: JsonRpcId | None
    error: ErrorObject


class RawErrorResponse(Struct, gc=False):
    """A relayed error: the peer's error object forwarded byte for byte under our id."""

    jsonrpc: str
    id: JsonRpcId | None
    error: Raw


# The helpers accept Raw or any value in params/result; msgspec writes Raw verbatim wherever it
# appears, so one struct with an Any field serves both without encoding twice.
class _RequestOut(Struct, omit_defaults=True):
    jsonrpc: str
    id: JsonRpcId
    method: str
    params: Any = UNSET


class _NotificationOut(Struct, omit_defaults=True):
    jsonrpc: str
    method: str
    params: Any = UNSET


class _ResponseOut(Struct):
    jsonrpc: str
    id: JsonRpcId
    result: Any


_decoder = msgspec.json.Decoder(Message | list[Message])
_decode = _decoder.decode
# The envelope decoder without `decode`'s checks, raising msgspec's own errors: for a hot path
# that accepts one exact shape it checks itself, and hands anything else (or any error) to
# `decode`, which decodes it again and says what is wrong.
decode_unchecked = _decode
_RESULT_IDS = frozenset({int, str})  # the id types a result response may carry (not null)
_any_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder()
_params_decoder = msgspec.json.Decoder(dict[str, Any])
_encoder = msgspec.json.Encoder()

_BYTE_OFFSET = re.compile(r"\(byte (\d+)\)")

# A result response as the SDKs write it compactly: Python's (members in declaration order) and
# TypeScript's (the result first), each with an id of ours (a non-negative int).
_RESULT_HEAD = b'{"jsonrpc":"2.0","id":'
_RESULT_KEY = b',"result":'
_RESULT_FIRST = b'{"result":'
_RESULT_TAIL = b',"jsonrpc":"2.0","id":'
_ID_DIGITS = 19  # at most: a 64-bit id
_BLANKS = b" \t\r\n"


def _our_id(digits: bytes) -> int | None:
    """`digits` as a JSON integer of ours: ASCII digits, no leading zero, no sign."""
    if not digits.isdigit() or not digits.isascii() or (len(digits) > 1 and digits[0] == 48):
        return None
    return int(digits)


def split_result(line: bytes) -> tuple[int, memoryview] | None:
    """The id and the result's bytes of a compact result response, found by position alone.

    Nothing is parsed: the result is not checked to be one JSON value. This is for a caller
    that parses the result itself (a list page, pool/_reuse.py) and, when that fails, decodes
    the whole line with `decode`: a line with other members than these three, or with blanks
    between them, is either not split (None) or split into a result that does not parse.
    """
    end = len(line)
    while end and line[end - 1] in _BLANKS:
        end -= 1
    if end < 2 or line[end - 1] != 125:  # "}"
        return None
    if line.startswith(_RESULT_HEAD):
        start = len(_RESULT_HEAD)
        key = line.find(_RESULT_KEY, start, start + _ID_DIGITS + len(_RESULT_KEY))
        if key < 0:
            return None
        uid = _our_id(line[start:key])
        body = key + len(_RESULT_KEY)
        if uid is None or body >= end - 1:
            return None
        return uid, memoryview(line)[body : end - 1]
    if line.startswith(_RESULT_FIRST):
        tail = line.rfind(_RESULT_TAIL, max(0, end - 1 - _ID_DIGITS - len(_RESULT_TAIL)), end - 1)
        if tail < len(_RESULT_FIRST) + 1:
            return None
        uid = _our_id(line[tail + len(_RESULT_TAIL) : end - 1])
        if uid is None:
            return None
        return uid, memoryview(line)[len(_RESULT_FIRST) : tail]
    return None


def decode(line: bytes) -> Message | list[Message]:
    """One line -> a Message, or a list of them for a (2025-03-26) batch.

    Raises ParseError (not JSON) or InvalidRequest (JSON, but not a JSON-RPC 2.0 message).
    """
    try:
        decoded = _decode(line)
    except msgspec.ValidationError as exc:
        # msgspec validates while it parses, so a type error can be reported before a syntax
        # error further on; JSON-RPC wants the parse error then. Re-parsing only on this error
        # path keeps the hot path to a single pass.
        _raise_if_malformed(line)
        raise InvalidRequest(f"not a JSON-RPC message: {exc}") from None
    except msgspec.DecodeError as exc:
        raise _parse_error(exc, line) from None
    except RecursionError:
        raise ParseError("JSON nesting is deeper than the decoder allows") from None
    if decoded.__class__ is Message:
        # The two shapes nearly every line has, accepted in one expression (`_check` accepts
        # them too, and says what is wrong with anything else): a request or notification, and
        # a result response with a usable id.
        if decoded.jsonrpc == _VERSION and decoded.result is UNSET and decoded.error is UNSET:
            if decoded.method is not UNSET and decoded.id is not None:
                return decoded
        elif (
            decoded.jsonrpc == _VERSION
            and decoded.method is UNSET
            and decoded.error is UNSET
            and decoded.id.__class__ in _RESULT_IDS
        ):
            return decoded
        _check(decoded)
        return decoded
    assert isinstance(decoded, list)
    if not decoded:
        raise InvalidRequest("empty batch")
    for message in decoded:
        _check(message)
    return decoded


def _check(message: Message) -> None:
    if message.jsonrpc != _VERSION:
        raise InvalidRequest(f"jsonrpc must be {_VERSION!r}, got {message.jsonrpc!r}")
    if message.method is not UNSET:
        if message.result is not UNSET or message.error is not UNSET:
            raise InvalidRequest("a message with a method cannot carry result or error")
        if message.id is None:
            raise InvalidRequest("a request id must not be null")
        return
    has_result = message.result is not UNSET
    if has_result == (message.error is not UNSET):
        raise InvalidRequest(
            "a response carries both result and error"
            if has_result
            else "neither a request (no method) nor a response (no result or error)"
        )
    if message.id is UNSET:
        raise InvalidRequest("a response has no id")
    if has_result and message.id is None:
        # JSON-RPC allows a null id only on an error about a request whose id was unreadable.
        raise InvalidRequest("a result response must have a non-null id")


def _raise_if_malformed(line: bytes) -> None:
    try:
        _any_decoder.decode(line)
    except msgspec.DecodeError as exc:
        raise _parse_error(exc, line) from None
    except RecursionError:
        raise ParseError("JSON nesting is deeper than the decoder allows") from None


def _parse_error(exc: msgspec.DecodeError, line: bytes) -> ParseError:
    text = str(exc)
    match = _BYTE_OFFSET.search(text)
    if match is not None:
        offset: int | None = int(match.group(1))
    elif "truncated" in text:
        offset = len(line)
    else:
        offset = None
    return ParseError(text, offset=offset)


def encode(msg: Any) -> bytes:
    """A message Struct (or a plain dict/list) -> one line of JSON, newline included."""
    try:
        return _encoder.encode(msg) + b"\n"
    except (TypeError, ValueError, msgspec.EncodeError) as exc:
        raise LocalProtocolError(f"cannot encode {type(msg).__name__}: {exc}") from None


def request(id: JsonRpcId, method: str, params: Any = UNSET) -> bytes:
    return encode(_RequestOut(_VERSION, id, method, params))


# The JSON strings of the methods mcpool sends upstream, encoded once. Bounded: a method it has
# not seen before is encoded each time once this is full.
_METHOD_JSON: dict[str, bytes] = {}
_METHOD_JSON_MAX = 256


def request_line(id: int, method: str, params: bytes | Raw) -> bytes:
    """`request(id, method, Raw(params))`, newline included, for params that are already one
    encoded JSON value (a forwarded request's): the bytes are put in place, not re-encoded."""
    encoded = _METHOD_JSON.get(method)
    if encoded is None:
        encoded = _encoder.encode(method)
        if len(_METHOD_JSON) < _METHOD_JSON_MAX:
            _METHOD_JSON[method] = encoded
    return b'{"jsonrpc":"2.0","id":%d,"method":%b,"params":%b}\n' % (id, encoded, params)


def response_line(id: JsonRpcId, result: bytes | Raw) -> bytes:
    """`response(id, Raw(result))`, newline included, for a result that is already one encoded
    JSON value (a relayed answer's): the bytes are put in place, not re-encoded."""
    if id.__class__ is int:
        return b'{"jsonrpc":"2.0","id":%d,"result":%b}\n' % (id, result)
    return b'{"jsonrpc":"2.0","id":%b,"result":%b}\n' % (_encoder.encode(id), result)


def response_parts(id: JsonRpcId, result: bytes) -> tuple[bytes, bytes, bytes]:
    """`response_line(id, result)` as three parts, the middle one `result` itself: for a writer
    that writes them without joining them (`FdWriter.write_parts`; a large cached result)."""
    return (_RESULT_HEAD + _encoder.encode(id) + _RESULT_KEY, result, b"}\n")


def notification(method: str, params: Any = UNSET) -> bytes:
    return encode(_NotificationOut(_VERSION, method, params))


def response(id: JsonRpcId, result: Any) -> bytes:
    return encode(_ResponseOut(_VERSION, id, result))


def error_response(
    id: JsonRpcId | None,
    code: int,
    message: str,
    data: Any = UNSET,
) -> bytes:
    return encode(ErrorResponse(_VERSION, id, ErrorObject(code, message, data)))


def decode_params(raw: Raw | UnsetType) -> dict[str, Any]:
    """Look inside params: absent -> {}; anything but a JSON object -> InvalidParams."""
    if raw is UNSET:
        return {}
    try:
        return _params_decoder.decode(raw)
    except msgspec.DecodeError as exc:  # ValidationError included
        raise InvalidParams(f"params must be a JSON object: {exc}") from None
    except RecursionError:
        raise InvalidParams("params nesting is deeper than the decoder allows") from None


def to_raw(value: Any) -> Raw:
    """Encode a value once, to be embedded verbatim in later messages."""
    try:
        return Raw(_encoder.encode(value))
    except (TypeError, ValueError, msgspec.EncodeError) as exc:
        raise LocalProtocolError(f"cannot encode {type(value).__name__}: {exc}") from None
