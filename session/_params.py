"""Typed params of every message mcpool itself looks at, decoded once at the session boundary.

Theory of operation: a client (or an upstream) controls every byte of a message, so nothing in
the session reads a field it has not typed first. A request's params are decoded once into a
dict (what is forwarded: members mcpool does not know must reach the upstream untouched) and
then converted into the method's Struct below (what mcpool reads: `name`, `uri`, `cursor`,
`_meta.progressToken`, ...). A wrong type becomes `InvalidParams` naming the field
(`params.name`, `params._meta.progressToken`) in its data, answered to the sender; a bad
notification is dropped (the session logs it). Pass-through payloads (`arguments`, a prompt's
`arguments`) are only checked to be objects, as the MCP schema says, and stay as they came.

A handshake-era session's common tools/call skips the dict: its params decode straight into
`PlainToolsCall`, which types the same members and is what gets forwarded (members it does not
know make it fail to decode, and the general path above serves the call).

Notifications that are never forwarded as a whole (notifications/cancelled, a client's
notifications/progress) are decoded straight from their raw params with the module-level
decoders here, without the intermediate dict.

Ids: JSON-RPC ids reaching the session are `int | str` (the envelope decoder refuses objects,
arrays, floats and null on requests); request ids named inside params (`requestId`) and
progress tokens are typed the same way (MCP: `RequestId` and `ProgressToken` are string or
integer), so every one of them is hashable and comparable.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import UNSET, Raw, Struct, UnsetType, field

from mcpool.protocol import InvalidParams

from ._toolsearch import MAX_QUERY_CHARS, MAX_RESULTS

RequestId = int | str
ProgressToken = int | str


class RequestMeta(Struct, gc=False):
    """The `_meta` members mcpool reads; every other member is forwarded as it came."""

    progressToken: ProgressToken | UnsetType = UNSET  # the wire names, camelCase


# -- requests ------------------------------------------------------------------------------------


class Plain(Struct, gc=False):
    """A request whose params mcpool reads nothing from beyond `_meta` (ping, discover)."""

    meta: RequestMeta | None = field(default=None, name="_meta")


class Initialize(Struct, gc=False):
    protocolVersion: str | None = None
    capabilities: dict[str, Any] | None = None
    clientInfo: dict[str, Any] | None = None
    meta: RequestMeta | None = field(default=None, name="_meta")


initialize_decoder = msgspec.json.Decoder(Initialize)


class ListPage(Struct, gc=False):
    """tools/list, prompts/list, resources/list, resources/templates/list."""

    cursor: str | None = None
    meta: RequestMeta | None = field(default=None, name="_meta")


class ToolsCall(Struct, gc=False):
    name: str
    arguments: dict[str, Any] | None = None
    meta: RequestMeta | None = field(default=None, name="_meta")


class PlainToolsCall(Struct, forbid_unknown_fields=True, omit_defaults=True, gc=False):
    """The common tools/call params, typed straight from their bytes and re-encoded from this
    Struct (the hot path: `Requests._tools_call_direct`): only these members, each as
    `ToolsCall` reads it; `_meta` decoded whole, since it is forwarded as it came. Anything
    else (another member, a wrong type) does not decode, and the general path serves it.
    gc=False: JSON values cannot refer back to the Struct."""

    name: str
    arguments: dict[str, Any] | UnsetType | None = UNSET
    meta: dict[str, Any] | UnsetType | None = field(default=UNSET, name="_meta")


class PlainCallLine(Struct, forbid_unknown_fields=True, gc=False):
    """A whole request line whose params are `PlainToolsCall`, typed in one decode (envelope
    and params together: `Requests.handle_line`'s direct call). It accepts only what
    `decode` accepts as a request: a string `jsonrpc` and `method` (the caller serves only
    "2.0" and tools/call: strings compared there cost less than Literal types here), an int or
    string id, params; any other member (`result`, `error`, one nobody knows) or type makes it
    fail, and the line is decoded the general way."""

    jsonrpc: str
    id: int | str
    method: str
    params: PlainToolsCall


class PlainListParams(Struct, forbid_unknown_fields=True, frozen=True, gc=False):
    """tools/list params with a cursor or none (`ListPage` without `_meta`): what
    `PlainListLine` accepts."""

    cursor: str | None = None


class PlainListLine(Struct, forbid_unknown_fields=True, gc=False):
    """A whole tools/list request line whose params are `PlainListParams` (or absent), typed
    in one decode (`Requests._tools_page_direct`), on the terms of `PlainCallLine`."""

    jsonrpc: str
    id: int | str
    method: str
    params: PlainListParams = PlainListParams()


class PromptsGet(Struct, gc=False):
    name: str
    arguments: dict[str, Any] | None = None
    meta: RequestMeta | None = field(default=None, name="_meta")


class ResourceUri(Struct, gc=False):
    """resources/read, resources/subscribe, resources/unsubscribe."""

    uri: str
    meta: RequestMeta | None = field(default=None, name="_meta")


class PromptRef(Struct, tag_field="type", tag="ref/prompt", gc=False):
    name: str


class ResourceRef(Struct, tag_field="type", tag="ref/resource", gc=False):
    uri: str


class CompleteArgument(Struct, gc=False):
    name: str
    value: str


class Complete(Struct, gc=False):
    ref: PromptRef | ResourceRef
    argument: CompleteArgument
    meta: RequestMeta | None = field(default=None, name="_meta")


class SetLevel(Struct, gc=False):
    level: str
    meta: RequestMeta | None = field(default=None, name="_meta")


class ListenFilter(Struct, gc=False):
    toolsListChanged: bool | None = None
    promptsListChanged: bool | None = None
    resourcesListChanged: bool | None = None
    resourceSubscriptions: list[str] | None = None


class Listen(Struct, gc=False):
    notifications: ListenFilter
    meta: RequestMeta | None = field(default=None, name="_meta")


# -- notifications -------------------------------------------------------------------------------


class Cancelled(Struct, gc=False):
    """notifications/cancelled: `requestId` may be absent (a task cancel names none)."""

    requestId: RequestId | UnsetType = UNSET
    reason: str | None = None


class Progress(Struct, gc=False):
    progressToken: ProgressToken
    progress: float
    total: float | None = None
    message: str | None = None


class LogMessage(Struct, gc=False):
    """An upstream's notifications/message: the level decides who hears it."""

    level: str


class ResourceUpdated(Struct, gc=False):
    """An upstream's notifications/resources/updated."""

    uri: str
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class RelayedRequest(Struct, gc=False):
    """An upstream's request relayed to a client: only its progress token is read."""

    meta: RequestMeta | None = field(default=None, name="_meta")


class ErrorMember(Struct, gc=False):
    """A JSON-RPC error object as relayed (verbatim once it is one): a client's answer to a
    relayed request, or an upstream's answer to a forwarded one."""

    code: int
    message: str


T = TypeVar("T")

plain_tools_call_decoder = msgspec.json.Decoder(PlainToolsCall)
plain_call_line_decoder = msgspec.json.Decoder(PlainCallLine)
plain_list_line_decoder = msgspec.json.Decoder(PlainListLine)
_cancelled_decoder = msgspec.json.Decoder(Cancelled)
_progress_decoder = msgspec.json.Decoder(Progress)
_log_decoder = msgspec.json.Decoder(LogMessage)
_updated_decoder = msgspec.json.Decoder(ResourceUpdated)
_relayed_decoder = msgspec.json.Decoder(RelayedRequest)
_error_decoder = msgspec.json.Decoder(ErrorMember)
_object_decoder = msgspec.json.Decoder(dict[str, Any])

_PATH = re.compile(r" - at `\$([^`]*)`$")


def _invalid(exc: msgspec.ValidationError, prefix: str = "params") -> InvalidParams:
    """msgspec's "Expected `str`, got `int` - at `$.name`" as an error naming `params.name`."""
    text = str(exc)
    match = _PATH.search(text)
    where = prefix + (match.group(1) if match else "")
    problem = text[: match.start()] if match else text
    return InvalidParams(f"{where}: {problem}", field=where)


class SearchQuery(Struct, gc=False, forbid_unknown_fields=False):
    """mcpool_search_tools's arguments (session/_toolsearch.py)."""

    query: Annotated[str, msgspec.Meta(max_length=MAX_QUERY_CHARS * 4)]
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_RESULTS)] | None = None


class SearchCall(Struct, gc=False):
    """mcpool_call_tool's arguments: a found tool's exposed name and its own arguments."""

    name: str
    arguments: dict[str, Any] | None = None


def search_query(arguments: dict[str, Any] | None) -> SearchQuery:
    return _arguments(arguments, SearchQuery)


def search_call(arguments: dict[str, Any] | None) -> SearchCall:
    return _arguments(arguments, SearchCall)


def _arguments(arguments: dict[str, Any] | None, kind: type[T]) -> T:
    try:
        return msgspec.convert(arguments or {}, kind)
    except msgspec.ValidationError as exc:
        raise _invalid(exc, "params.arguments") from None


def typed(params: dict[str, Any], kind: type[T]) -> T:
    """A request's decoded params as `kind`; InvalidParams names the first bad field."""
    try:
        return msgspec.convert(params, kind)
    except msgspec.ValidationError as exc:
        raise _invalid(exc) from None


def _decode(raw: Raw | UnsetType, decoder: msgspec.json.Decoder[T]) -> T:
    try:
        return decoder.decode(b"{}" if raw is UNSET else raw)  # absent params: no members
    except msgspec.ValidationError as exc:
        raise _invalid(exc) from None
    except msgspec.DecodeError as exc:
        raise InvalidParams(f"params: {exc}", field="params") from None
    except RecursionError:
        raise InvalidParams("params: nesting is deeper than the decoder allows") from None


def cancelled(raw: Raw | UnsetType) -> Cancelled:
    return _decode(raw, _cancelled_decoder)


def progress(raw: Raw | UnsetType) -> Progress:
    return _decode(raw, _progress_decoder)


def log_message(raw: Raw | UnsetType) -> LogMessage:
    return _decode(raw, _log_decoder)


def resource_updated(raw: Raw | UnsetType) -> ResourceUpdated:
    return _decode(raw, _updated_decoder)


def relayed_request(raw: Raw | UnsetType) -> RelayedRequest:
    return _decode(raw, _relayed_decoder)


def malformed_answer(result: Raw | UnsetType, error: Raw | UnsetType) -> str | None:
    """What is wrong with an answer about to be relayed; None when it can go as it is (a
    result that is an object, or an error object with an integer code and a message)."""
    try:
        if error is not UNSET:
            _error_decoder.decode(error)
        elif result is not UNSET:
            _object_decoder.decode(result)
    except msgspec.ValidationError as exc:
        return str(_invalid(exc, "error" if error is not UNSET else "result").reason)
    except (msgspec.DecodeError, RecursionError) as exc:
        return f"unreadable answer: {exc}"
    return None


def error_code(error: Raw) -> int | None:
    """An error object's code, for the ledger; None when it has none."""
    try:
        return _error_decoder.decode(error).code
    except (msgspec.DecodeError, RecursionError):  # (ValidationError is a DecodeError)
        return None


def malformed_error(error: Raw) -> str | None:
    """What is wrong with an error object about to be relayed; None when it is one."""
    return malformed_answer(UNSET, error)


__all__ = [
    "Cancelled",
    "Complete",
    "Initialize",
    "ListPage",
    "Listen",
    "Plain",
    "PlainToolsCall",
    "ProgressToken",
    "PromptRef",
    "PromptsGet",
    "RequestId",
    "RequestMeta",
    "ResourceRef",
    "ResourceUri",
    "SetLevel",
    "ToolsCall",
    "cancelled",
    "log_message",
    "malformed_answer",
    "malformed_error",
    "progress",
    "relayed_request",
    "resource_updated",
    "typed",
]
