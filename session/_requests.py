"""The client's messages: one line at a time, the era check (P1), and one handler per method
(`_HANDLERS`), each typed by session/_params.py first.

A room of `Session` (session/_session.py): the rooms form one chain of base classes,
_core <- _forwarding <- _generations <- _requests <- _session, each using only what the rooms
below it define.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import msgspec
from msgspec import UNSET, Raw, UnsetType

from mcpool import __version__
from mcpool.pool import EntryState
from mcpool.protocol import (
    INVALID_REQUEST,
    META_SUBSCRIPTION_ID,
    InvalidParams,
    InvalidRequest,
    McpoolError,
    Message,
    MethodNotFound,
    decode,
    decode_params,
    error_response,
    negotiate,
    notification,
    response,
    response_line,
    response_parts,
)
from mcpool.protocol._headers import HEADER_MISMATCH, header_params, param_header_mismatch

from . import _params
from ._core import SERVER_INFO
from ._cursors import CursorError
from ._eras import (
    HANDSHAKE,
    LIST_FLAGS,
    MODERN,
    OPENERS,
    Batch,
    check_envelope,
    discover_result,
    honored_filter,
    initialize_refused,
    modern_result,
    opens_modern,
    strip_envelope,
)
from ._flight import _encoder, _InFlight, _Listen, request_id
from ._forwarding import LOG_LEVELS
from ._generations import SessionGenerations
from ._login_notice import login_needed_text

SERVER_CAPABILITIES: dict[str, Any] = {
    "tools": {"listChanged": True},
    "prompts": {"listChanged": True},
    "resources": {"listChanged": True, "subscribe": True},
    "logging": {},
    "completions": {},
}


# Methods 2026-07-28 removed (its changelog): unknown methods in a modern session, on every
# transport (`initialize` has its own answer, `initialize_refused`).
_REMOVED_AT_MODERN = frozenset(
    {"ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"}
)


_TOOLS_LIST = b'"tools/list"'  # in a line that may be one (`_tools_page_direct` decides)

# Lists a session walks at once (their cursors are its own): the newest are kept.
MAX_WALKS = 8


def _ignore_reply(msg: Message) -> None:
    pass


class SessionRequests(SessionGenerations):
    __slots__ = ()  # SessionCore holds the slots

    def handle_line(self, line: bytes) -> None:
        if self.ready and self.era is HANDSHAKE and self.request_headers is None:
            # The hot path, a handshake-era session's common tools/call: the whole line typed
            # in one decode (`PlainCallLine`, envelope and params together) and forwarded by
            # `_call_direct`, as `_handle` would have it forwarded. Anything else (another
            # shape, an id in use, a call the direct path declines) is decoded below, the
            # general way, and served by `_handle` as before.
            try:
                plain = _params.plain_call_line_decoder.decode(line)
            except (msgspec.DecodeError, RecursionError):  # ValidationError included
                # Not a plain call. The other request of the many: a page of tools/list,
                # served from the cache (every session re-reads every page after a change).
                if _TOOLS_LIST in line and self._tools_page_direct(line):
                    return
            else:
                client_id = plain.id
                if (
                    plain.method == "tools/call"
                    and plain.jsonrpc == "2.0"
                    and client_id not in self.inflight
                    and client_id not in self.listens
                ):
                    try:
                        if self._call_direct(client_id, plain.params):
                            return
                    except McpoolError as exc:
                        self.send_error(client_id, exc)
                        return
                    except Exception as exc:
                        self._internal_error("tools/call", client_id, exc)
                        return
        try:
            decoded = decode(line)
        except McpoolError as exc:
            self.send_error(None, exc)
            return
        if isinstance(decoded, list):
            # A 2025-03-26 batch: its answers go back together, as one array.
            batch = Batch(sum(1 for m in decoded if m.method is not UNSET and m.id is not UNSET))
            try:
                for msg in decoded:
                    self._batch = batch if msg.method is not UNSET and msg.id is not UNSET else None
                    self.handle_message(msg)
            finally:
                self._batch = None
        elif self.ready:
            # `handle_message`, inlined for a ready session (every call): `decode` already
            # refused anything but "2.0" in jsonrpc.
            self._handle(decoded)
        else:
            self.handle_message(decoded)

    def _tools_page_direct(self, line: bytes) -> bool:
        """A handshake-era session's tools/list line answered from the page cache, as `_list`
        would answer it, in one decode and three frames; False, having changed nothing, for
        anything else (another shape, an id in use, a cursor not issued, a page not cached
        yet), which the general path then serves."""
        try:
            plain = _params.plain_list_line_decoder.decode(line)
        except (msgspec.DecodeError, RecursionError):  # ValidationError included
            return False
        client_id = plain.id
        if (
            plain.method != "tools/list"
            or plain.jsonrpc != "2.0"
            or client_id in self.inflight
            or client_id in self.listens
        ):
            return False
        cursor = plain.params.cursor
        agg = self.registry.agg
        tools = agg.tools
        if cursor is None:
            offset = 0
        else:
            found = self.cursors.lookup(cursor)
            if found is None or found[0] is not tools or found[2] not in self._walks:
                return False
            offset = found[1]
        size = self.page_size
        number = self._walk_number(tools) if offset + size < len(tools) else 0
        page = agg.encoded.get(("tools", False, size, offset, number))
        if page is None:
            return False
        self._answer_page(client_id, page)
        return True

    def handle_message(self, msg: Message) -> None:
        if msg.jsonrpc != "2.0":
            msg_id = msg.id if msg.id is not UNSET else None
            self.reply(
                msg_id,
                error_response(
                    msg_id,
                    INVALID_REQUEST,
                    'jsonrpc must be "2.0"',
                    {"reason": "not a JSON-RPC 2.0 message"},
                ),
            )
            return
        if not self.ready and not (
            msg.method == "ping" or (msg.method in OPENERS and self._views_known)
        ):
            self._backlog.append((msg, self._batch))
            return
        self._handle(msg)

    def _handle(self, msg: Message) -> None:
        method = msg.method
        try:
            if method is UNSET:
                self._client_response(msg)
                return
            if msg.id is UNSET:
                self._notification(method, msg.params)
                return
            entry = _HANDLERS.get(method)
            if entry is None:
                raise MethodNotFound(method, f"mcpool does not serve {method}")
            if msg.id in self.inflight or msg.id in self.listens:
                raise InvalidRequest(
                    f"request id {msg.id!r} is already used by a request in flight "
                    "(ids must be unique among a session's open requests)",
                    id=msg.id,
                )
            handler, kind = entry
            if kind is _params.ToolsCall and self.era is HANDSHAKE and self._tools_call_direct(msg):
                return
            p = decode_params(msg.params)
            if self.era is not HANDSHAKE:
                self._check_era(method, p)
            handler(self, msg, p, _params.typed(p, kind))
        except McpoolError as exc:
            if msg.is_request:
                self.send_error(msg.id, exc)
            else:
                self._drop(f"a malformed {method or 'response'}", exc.reason)
        except Exception as exc:
            self._internal_error(method, msg.id if msg.is_request else UNSET, exc)

    def _internal_error(self, method: str | UnsetType, msg_id: Any, exc: Exception) -> None:
        """A bug, not bad input: logged with its traceback; the request (`msg_id`, UNSET for
        anything else) still gets an answer and the session goes on."""
        trace = "".join(traceback.format_exception(exc)).rstrip()
        self._log(f"session {self.id}: internal error handling {method}\n{trace}")
        if msg_id is not UNSET:
            self.send_error(
                msg_id,
                McpoolError(f"internal error in mcpool while handling {method}: {exc!r}"),
            )

    def _check_era(self, method: str, p: dict[str, Any]) -> None:
        """P1: decide the era on the first request; check every modern request's envelope."""
        if self.era is None:
            if not opens_modern(method, p):
                return  # initialize decides on handshake; anything else is served as it is
            env = check_envelope(p)  # a malformed one is refused and decides nothing
            self.era = MODERN
            # No handshake to wait for: list_changed may flow as soon as a stream listens.
            self.initialize_answered = self.initialized = True
        elif method == "initialize":
            raise initialize_refused(p)
        else:
            env = check_envelope(p)
        if method in _REMOVED_AT_MODERN:
            raise MethodNotFound(method, f"{method} is not part of protocol {env.version}")
        answers = p.get("inputResponses", {})
        if not isinstance(answers, dict) or not all(isinstance(a, dict) for a in answers.values()):
            # MRTR "Error Handling": a retry's inputResponses is an InputResponses object, each
            # of its answers a result object (sampling, elicitation or roots).
            raise InvalidParams("params.inputResponses must be an object of result objects")
        self.protocol_version = env.version
        self.client_capabilities = env.capabilities
        if env.client_info is not None and env.client_info != self.client_info:
            self.client_info = env.client_info
            self._update_name_budget()
        if env.log_level != self.log_level:
            # Logging is opted into per request in this era; no level means no log messages.
            self.log_level = env.log_level
            if env.log_level is not None:
                self._apply_log_level(env.log_level)
        strip_envelope(p)

    def _notification(self, method: str, params: Raw | UnsetType) -> None:
        """A client's notification; a malformed one raises McpoolError (dropped by _handle)."""
        if method == "notifications/initialized":
            # Out of order (before our initialize result) is ignored, per the handshake rules.
            if self.initialize_answered:
                self.initialized = True
                # What was said before the handshake is not said then: a server waiting for
                # the user's login is told now.
                for view in self.views.values():
                    entry = view.handle.entry if view.handle is not None else None
                    if entry is not None and entry.state is EntryState.NEEDS_LOGIN:
                        self.tell_login_needed(view.name)
        elif method == "notifications/cancelled":
            c = _params.cancelled(params)
            rid = c.requestId
            if rid is UNSET:
                return  # a task's cancel names no request; mcpool forwards no tasks
            if rid in self.listens:
                self._close_listen(rid)
                return
            flight = self.inflight.get(rid)
            if flight is None and rid in self._parked:
                batch = self._parked.pop(rid).batch
                whole = batch.drop() if batch is not None else None
                if whole is not None:
                    self.send(whole)
            if flight is not None:
                why = c.reason or "cancelled by the client"
                if flight.held is not None:  # a retry waiting on a held call: it ends too
                    self._let_go_held(flight, "the client cancelled the call", why)
                flight.cut(why)
                flight.finish()
                if flight.batch is not None:
                    # A cancelled request gets no answer; its batch must not wait for one.
                    whole = flight.batch.drop()
                    if whole is not None:
                        self.send(whole)
        elif method == "notifications/progress":
            # Progress the client reports on a request an upstream sent it (P5).
            token = _params.progress(params).progressToken
            for relay in self.relayed.values():
                if relay.progress_token is not None and relay.progress_token == token:
                    relay.upstream.send_notification(method, params)
                    break

    def _initialize(self, msg: Message, p: dict[str, Any], t: _params.Initialize) -> None:
        self.era = HANDSHAKE
        version = negotiate(t.protocolVersion)
        self.protocol_version = version
        self.client_capabilities = t.capabilities or {}
        self.client_info = t.clientInfo or {}
        # Before the answer: the client's first tools/list must already fit its name limit (and
        # nothing is notified, as the handshake is not complete yet).
        self._update_name_budget()
        result: dict[str, Any] = {
            "protocolVersion": version,
            "capabilities": SERVER_CAPABILITIES,
            "serverInfo": {"name": "mcpool", "version": __version__},
        }
        instructions = self.registry.instructions() if self.ready else self._instructions_so_far()
        if instructions:
            result["instructions"] = instructions
        self.reply(request_id(msg), response(request_id(msg), result))
        self.initialize_answered = True

    def _instructions_so_far(self) -> str | None:
        """Before the first generation (L6): the instructions of the servers already up, as
        `RegistryGeneration.instructions` joins them (a late server's cannot follow: the
        protocol has no notification for them)."""
        parts = []
        for view in self.views.values():
            text = view.projection().instructions
            if text:
                parts.append(f"## {view.name}\n{text.strip()}")
        return "\n\n".join(parts) if parts else None

    def _discover(self, msg: Message, p: dict[str, Any], t: _params.Plain) -> None:
        """2026-07-28: the session's aggregated capabilities and instructions."""
        if self.era is not MODERN:
            raise MethodNotFound(
                "server/discover",
                "server/discover belongs to protocol 2026-07-28; this session used initialize",
            )
        # Answered at once, as initialize is (L6): before the first generation, with the
        # instructions of the servers already up.
        instructions = self.registry.instructions() if self.ready else self._instructions_so_far()
        result = discover_result(SERVER_CAPABILITIES, instructions, SERVER_INFO)
        self.reply(request_id(msg), response(request_id(msg), result))

    def _listen(self, msg: Message, p: dict[str, Any], t: _params.Listen) -> None:
        """2026-07-28: a stream carrying this session's list_changed and resources/updated.

        Acknowledged at once; answered only when it ends (the session closing answers it with
        SESSION_CLOSING). The client ends it with notifications/cancelled naming it, and gets
        no answer then. Resource URIs count as subscriptions (P6). Never part of a batch.
        """
        if self.era is not MODERN:
            raise MethodNotFound(
                "subscriptions/listen",
                "subscriptions/listen belongs to protocol 2026-07-28; this session used "
                "initialize (use resources/subscribe and the notifications it sends)",
            )
        if self._batch is not None:
            raise InvalidRequest(
                "subscriptions/listen cannot be part of a batch: its answer comes only when "
                "the stream ends, and the batch would wait for it"
            )
        honored = honored_filter(p.get("notifications"))
        listen_id = request_id(msg)
        kinds = frozenset(kind for kind, flag in LIST_FLAGS.items() if honored.get(flag))
        uris = frozenset(honored.get("resourceSubscriptions", ()))
        listen = self.listens[listen_id] = _Listen(kinds, uris)
        # Acknowledged once every upstream this stream subscribed has answered: a client that
        # changes a resource right after the acknowledgment must hear of it (the upstream was
        # not listening yet when the acknowledgment went at once).
        waiting = 1  # this function's own share, dropped below: replies may come synchronously

        def subscribed(_reply: Message | None) -> None:
            nonlocal waiting
            waiting -= 1
            if waiting == 0 and self.listens.get(listen_id) is listen:
                self.send(
                    notification(
                        "notifications/subscriptions/acknowledged",
                        {"notifications": honored, "_meta": {META_SUBSCRIPTION_ID: listen_id}},
                    )
                )

        for uri in uris:
            waiting += 1
            if not self._hold_uri(uri, subscribed):
                waiting -= 1
        subscribed(None)

    def _close_listen(self, listen_id: Any) -> None:
        listen = self.listens.pop(listen_id, None)
        if listen is None:
            return
        held = {uri for other in self.listens.values() for uri in other.uris} | self.subscriptions
        for uri in listen.uris - held:
            self._let_go_uri(uri)

    def _ping(self, msg: Message, p: dict[str, Any], t: _params.Plain) -> None:
        self.send_result(msg, {})

    def _list(self, msg: Message, t: _params.ListPage, kind: str, field: str) -> None:
        gen = self.registry
        items: tuple[dict[str, Any], ...] = getattr(gen, kind)
        cursor = t.cursor
        # A walk goes on on the list it began on (issue 29 item 6): a cursor names that list.
        served, offset = (items, 0) if cursor is None else self._walk(cursor)
        modern = self.era is MODERN
        size = self.page_size
        number = self._walk_number(served) if offset + size < len(served) else 0
        # Each page of the current list is encoded once per aggregate, era (a modern one
        # carries more), page size, offset and list number (the one its next cursor names).
        cacheable = served is items and (
            offset == 0 or (size > 0 and offset % size == 0 and offset < len(items))
        )
        key = (kind, modern, size, offset, number)
        if cacheable:
            cached = gen.encoded.get(key)
            if cached is not None:
                self._answer_page(request_id(msg), cached)
                return
        page = served[offset : offset + size]
        result: dict[str, Any] = {field: page}
        if number:
            # Pages are cached on the shared aggregate: no per-session value in them.
            result["nextCursor"] = self.cursors.cursor_at(number, offset + size)
        if modern:
            result = modern_result("tools/list", result, SERVER_INFO)  # every list is cacheable
        encoded = _encoder.encode(result)
        if cacheable:
            gen.encoded[key] = encoded
        self._answer_page(request_id(msg), encoded)

    def _walk(self, cursor: object) -> tuple[tuple[dict[str, Any], ...], int]:
        """The list a cursor of this session's was cut from, and its next page's offset."""
        try:
            served, offset, number = self.cursors.page(cursor)
        except CursorError as exc:
            raise InvalidParams(str(exc)) from None
        if number not in self._walks:
            raise InvalidParams(
                f"cursor {str(cursor)[:64]!r} is not one of this session's lists: list again "
                "from the start"
            )
        return served, offset

    def _walk_number(self, served: tuple[dict[str, Any], ...]) -> int:
        """The number of a list this session walks (its next cursor names it)."""
        number = self.cursors.number(served)
        walks = self._walks
        if number not in walks:
            self._walks = (*walks[1 - MAX_WALKS :], number)
        return number

    def _answer_page(self, rid: Any, page: bytes) -> None:
        """The answer with `page` as its result, written around the page's bytes: no copy of
        them (55 KB a page, and every session re-reads every page after a change; issue 17).
        A batch member's joins its batch whole."""
        if self._batch is None:
            self.send_parts(response_parts(rid, page))
        else:
            self.reply(rid, response_line(rid, page))

    def _tools_list(self, msg: Message, p: dict[str, Any], t: _params.ListPage) -> None:
        self._list(msg, t, "tools", "tools")

    def _prompts_list(self, msg: Message, p: dict[str, Any], t: _params.ListPage) -> None:
        self._list(msg, t, "prompts", "prompts")

    def _resources_list(self, msg: Message, p: dict[str, Any], t: _params.ListPage) -> None:
        self._list(msg, t, "resources", "resources")

    def _templates_list(self, msg: Message, p: dict[str, Any], t: _params.ListPage) -> None:
        self._list(msg, t, "resource_templates", "resourceTemplates")

    def _unknown_tool_text(self, name: str) -> str:
        # A server that waits for the user's login has listed nothing yet: a call of a name in
        # its prefix says what to do rather than only that the name is unknown.
        for view in self.views.values():
            entry = view.handle.entry if view.handle is not None else None
            if (
                name.startswith(f"{view.name}__")
                and entry is not None
                and entry.state is EntryState.NEEDS_LOGIN
            ):
                return f"Unknown tool: {name}: {login_needed_text(view.name)}"
        return f"Unknown tool: {name} (no server of this session exposes it)"

    def _tools_call(self, msg: Message, p: dict[str, Any], t: _params.ToolsCall) -> None:
        gen = self.registry
        name = t.name
        route = self._allows(gen.tool_route(name))
        if route is None:
            # A tool error, as the SDKs' own servers answer it: the model sees the text and can
            # pick another tool (a JSON-RPC error would surface as a client failure instead).
            self.send_result(
                msg,
                {
                    "content": [
                        {
                            "type": "text",
                            "text": self._unknown_tool_text(name),
                        }
                    ],
                    "isError": True,
                },
            )
            return
        if self.request_headers is not None:
            self._check_param_headers(name, p.get("arguments"), self.request_headers)
        p["name"] = route.upstream_name
        self._forward(msg, route.view, "tools/call", p, t.meta)

    def _tools_call_direct(self, msg: Message) -> bool:
        """A handshake-era session's tools/call on the common path, forwarded as
        `_tools_call` and `_forward` would, in one frame instead of seven and one decode
        instead of two (the hot path: every call); False, having changed nothing, for anything
        else, which the general path then serves (and answers when it is wrong).

        The common path: params that decode as `_params.PlainToolsCall` (a string `name`,
        `arguments` an object or null, `_meta` an object without a progressToken, or null;
        nothing else), a tool this session may call, on a running handshake-era server, no
        Mcp-Param-* headers to check.
        """
        raw = msg.params
        if raw is UNSET or self.request_headers is not None:
            return False
        try:
            call = _params.plain_tools_call_decoder.decode(raw)
        except (msgspec.DecodeError, RecursionError):  # ValidationError included
            return False
        return self._call_direct(msg.id, call)

    def _call_direct(self, client_id: Any, call: _params.PlainToolsCall) -> bool:
        """`_tools_call_direct` of typed params (or `handle_line`'s of a typed line, whose id
        it checked is not in use): forwarded, or False, having changed nothing."""
        meta = call.meta
        if meta.__class__ is dict and "progressToken" in meta:
            return False
        gen = self.registry
        # `tool_route` and `_allows`, inlined.
        routes = gen.agg.tool_routes
        hit = (routes if routes.__class__ is dict else gen.agg.whole_tool_routes()).get(call.name)
        if hit is None:
            return False
        view = gen.views[hit[0]]
        handle = view.handle
        upstream_name = hit[1]
        if (
            handle is None
            or handle.released
            or self.views.get(view.name) is not view
            or not view.key.allows(upstream_name)
        ):
            return False
        entry = handle.entry
        upstream = entry.upstream
        if upstream is None or upstream.era == MODERN or not upstream.alive:
            return False
        call.name = upstream_name
        flight = _InFlight(self, client_id, handle, entry, upstream, self._batch)
        handle.in_flight += 1
        self.inflight[client_id] = flight
        try:
            flight.uid = upstream.send_checked("tools/call", _encoder.encode(call), flight)
        except BaseException:
            flight.finish()  # whatever failed, the request is not in flight
            raise
        return True

    def _check_param_headers(self, name: str, arguments: Any, headers: dict[str, str]) -> None:
        """2026-07-28 over HTTP: the Mcp-Param-* headers must agree with the arguments for the
        tool's `x-mcp-header` annotations, as this session lists the tool (-32020, HTTP 400)."""
        tool = next((t for t in self.registry.tools if t.get("name") == name), None)
        annotated = header_params(tool.get("inputSchema")) if tool is not None else {}
        if isinstance(annotated, str):
            return  # screened out when listed; nothing here to check against
        why = param_header_mismatch(annotated, arguments, headers)
        if why is not None:
            raise McpoolError(why, message="Header mismatch", code=HEADER_MISMATCH)

    def _prompts_get(self, msg: Message, p: dict[str, Any], t: _params.PromptsGet) -> None:
        name = t.name
        route = self._allows(self.registry.prompt_route(name))
        if route is None:
            raise InvalidParams(
                f"unknown prompt: {name}: no server of this session exposes it",
                message=f"Unknown prompt: {name}",
                prompt=name,
            )
        p["name"] = route.upstream_name
        self._forward(msg, route.view, "prompts/get", p, t.meta)

    def _resources_read(self, msg: Message, p: dict[str, Any], t: _params.ResourceUri) -> None:
        self._forward(msg, self._resource_view(t.uri), "resources/read", p, t.meta)

    def _subscribe(self, msg: Message, p: dict[str, Any], t: _params.ResourceUri) -> None:
        """P6: the upstream is subscribed once per URI, however many sessions ask."""
        uri = t.uri
        view = self._resource_view(uri)
        assert view.handle is not None
        self.subscriptions.add(uri)
        if view.handle.entry.subscribe(view.handle, uri):
            self._forward(msg, view, "resources/subscribe", p, t.meta)
        else:
            self.send_result(msg, {})

    def _unsubscribe(self, msg: Message, p: dict[str, Any], t: _params.ResourceUri) -> None:
        uri = t.uri
        view = self._resource_view(uri)
        assert view.handle is not None
        self.subscriptions.discard(uri)
        was_subscribed = uri in view.handle.subscriptions
        if was_subscribed and view.handle.entry.unsubscribe(view.handle, uri):
            self._forward(msg, view, "resources/unsubscribe", p, t.meta)
        else:
            self.send_result(msg, {})

    def _hold_uri(self, uri: str, on_reply: Callable[[Message], None] = _ignore_reply) -> bool:
        """A listen stream's resource: subscribe the upstream if no session had it (P6).
        True when a subscribe went to the upstream: `on_reply` gets its answer (once)."""
        try:
            view = self._resource_view(uri)
        except McpoolError:
            return False  # no server lists it: honored, and never fires
        handle = view.handle
        assert handle is not None
        upstream = handle.entry.upstream
        if handle.entry.subscribe(handle, uri) and upstream is not None and upstream.alive:
            upstream.send_request("resources/subscribe", _encoder.encode({"uri": uri}), on_reply)
            return True
        return False

    def _let_go_uri(self, uri: str) -> None:
        try:
            view = self._resource_view(uri)
        except McpoolError:
            return
        handle = view.handle
        assert handle is not None
        upstream = handle.entry.upstream
        if (
            uri in handle.subscriptions
            and handle.entry.unsubscribe(handle, uri)
            and upstream is not None
            and upstream.alive
        ):
            upstream.send_request(
                "resources/unsubscribe", _encoder.encode({"uri": uri}), _ignore_reply
            )

    def _complete(self, msg: Message, p: dict[str, Any], t: _params.Complete) -> None:
        ref = t.ref
        if isinstance(ref, _params.PromptRef):
            route = self._allows(self.registry.prompt_route(ref.name))
            if route is None:
                raise InvalidParams(
                    f"unknown prompt: {ref.name}: no server of this session exposes it",
                    prompt=ref.name,
                )
            p["ref"] = {**p["ref"], "name": route.upstream_name}
            self._forward(msg, route.view, "completion/complete", p, t.meta)
        else:
            view = self._resource_view(ref.uri)
            self._forward(msg, view, "completion/complete", p, t.meta)

    def _set_level(self, msg: Message, p: dict[str, Any], t: _params.SetLevel) -> None:
        level = t.level
        if level not in LOG_LEVELS:
            raise InvalidParams(f"unknown log level: {level}", levels=list(LOG_LEVELS))
        self.log_level = level
        self._apply_log_level(level)
        self.send_result(msg, {})

    def _apply_log_level(self, level: str) -> None:
        for view in self.registry.views:
            handle = view.handle
            if handle is None:
                continue
            entry = handle.entry
            before = entry.effective_log_level()
            handle.log_level = level
            after = entry.effective_log_level()
            # A shared upstream logs at the most verbose level any of its sessions asked for;
            # each session still receives only messages at or above its own level.
            if (
                after != before
                and entry.upstream is not None
                and "logging" in entry.snapshot.capabilities
            ):
                entry.upstream.send_request(
                    "logging/setLevel", _encoder.encode({"level": after}), _ignore_reply
                )


_HANDLERS: dict[
    str, tuple[Callable[[SessionRequests, Message, dict[str, Any], Any], None], type]
] = {
    "initialize": (SessionRequests._initialize, _params.Initialize),
    "server/discover": (SessionRequests._discover, _params.Plain),
    "subscriptions/listen": (SessionRequests._listen, _params.Listen),
    "ping": (SessionRequests._ping, _params.Plain),
    "tools/list": (SessionRequests._tools_list, _params.ListPage),
    "tools/call": (SessionRequests._tools_call, _params.ToolsCall),
    "prompts/list": (SessionRequests._prompts_list, _params.ListPage),
    "prompts/get": (SessionRequests._prompts_get, _params.PromptsGet),
    "resources/list": (SessionRequests._resources_list, _params.ListPage),
    "resources/templates/list": (SessionRequests._templates_list, _params.ListPage),
    "resources/read": (SessionRequests._resources_read, _params.ResourceUri),
    "resources/subscribe": (SessionRequests._subscribe, _params.ResourceUri),
    "resources/unsubscribe": (SessionRequests._unsubscribe, _params.ResourceUri),
    "completion/complete": (SessionRequests._complete, _params.Complete),
    "logging/setLevel": (SessionRequests._set_level, _params.SetLevel),
}
