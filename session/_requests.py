"""The client's messages (`Requests`): one line at a time, the era check (P1), and one handler
per method (`_HANDLERS`), each typed by session/_params.py first; the backlog kept until the first
generation, and the page walks (cursors) of this session.

It is the top of a session's objects: it reads the `Catalog` (what is served), forwards through
the `Flights` and answers through the `ClientLink`, each given at construction; none of them
calls it (the `Session` replays the backlog when its catalog says so).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from time import perf_counter
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
)
from mcpool.protocol._headers import HEADER_MISMATCH, header_params, param_header_mismatch

from . import _params
from ._catalog import Catalog
from ._cursors import CursorBook, CursorError
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
from ._flights import LOG_LEVELS, Flights
from ._link import ClientLink, PhaseEvent, SessionLog, closing_line
from ._login_notice import login_needed_text
from ._names import exposed_name
from ._toolsearch import (
    CALL_TOOL,
    DEFAULT_RESULTS,
    SEARCH_TOOL,
    SessionSearch,
    ToolSearchSettings,
)

NO_SEARCH = ToolSearchSettings("off")
SEARCH_TOOLS = frozenset({SEARCH_TOOL, CALL_TOOL})


def _encoded_size(value: Any) -> int:
    return len(_encoder.encode(value))


SERVER_INFO: dict[str, Any] = {"name": "mcpool", "version": __version__}

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


class Requests:
    """One session's handling of what its client sends."""

    __slots__ = (
        "_log",
        "_sid",
        "_walks",
        "backlog",
        "catalog",
        "cursors",
        "flights",
        "link",
        "page_size",
        "search",
    )

    def __init__(
        self,
        sid: str,
        link: ClientLink,
        catalog: Catalog,
        flights: Flights,
        *,
        cursors: CursorBook[tuple[dict[str, Any], ...]],
        page_size: int,
        log: SessionLog,
        tool_search: ToolSearchSettings = NO_SEARCH,
    ) -> None:
        self._sid = sid
        self.link = link
        # mcpool's own tool search, for clients without one (issue 31; session/_toolsearch.py).
        self.search = SessionSearch(tool_search)
        self.catalog = catalog
        self.flights = flights
        # The daemon's book of listed lists, shared by its sessions (pages are cached on
        # shared lists).
        self.cursors = cursors
        self.page_size = page_size
        self._log = log
        # Messages before the first generation, each with the batch it came in (if any).
        self.backlog: list[tuple[Message, Batch | None]] = []
        self._walks: tuple[int, ...] = ()  # numbers of the lists this session's cursors name

    def answer_openers(self) -> None:
        """The servers are leased: an initialize (or a 2026-07-28 server/discover) waiting in
        the backlog is answered now, the rest waits for the first generation."""
        backlog, self.backlog = self.backlog, []
        link = self.link
        outer = link.batch
        try:
            for msg, batch in backlog:
                if msg.method in OPENERS:
                    link.batch = batch
                    self._handle(msg)
                else:
                    self.backlog.append((msg, batch))
        finally:
            link.batch = outer

    def replay_backlog(self) -> None:
        """The first generation is published: what waited for it is served, in order."""
        backlog, self.backlog = self.backlog, []
        link = self.link
        outer = link.batch
        try:
            for msg, batch in backlog:
                link.batch = batch
                self._handle(msg)
        finally:
            link.batch = outer

    def backlog_lines(self, closing: McpoolError) -> list[bytes]:
        """The closing session's answers to the requests still in the backlog."""
        lines = []
        for msg, batch in self.backlog:
            if msg.is_request:
                line = closing_line(closing, msg.id, batch)
                if line is not None:
                    lines.append(line)
        self.backlog.clear()
        return lines

    def send_result(self, msg: Message, result: dict[str, Any]) -> None:
        """Answer a request mcpool serves itself, shaped for the session's era."""
        method = msg.method if isinstance(msg.method, str) else ""
        if self.link.era is MODERN:
            result = modern_result(method, result, SERVER_INFO)
        self.link.reply(response(request_id(msg), result))

    def handle_line(self, line: bytes) -> None:
        link = self.link
        if self.catalog.ready and link.era is HANDSHAKE and link.request_headers is None:
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
                flights = self.flights
                if (
                    plain.method == "tools/call"
                    and plain.jsonrpc == "2.0"
                    and client_id not in flights.inflight
                    and client_id not in flights.listens
                ):
                    try:
                        if self._call_direct(client_id, plain.params):
                            return
                    except McpoolError as exc:
                        link.send_error(client_id, exc)
                        return
                    except Exception as exc:
                        self._internal_error("tools/call", client_id, exc)
                        return
        try:
            decoded = decode(line)
        except McpoolError as exc:
            self.link.send_error(None, exc)
            return
        if isinstance(decoded, list):
            # A 2025-03-26 batch: its answers go back together, as one array.
            batch = Batch(sum(1 for m in decoded if m.method is not UNSET and m.id is not UNSET))
            try:
                for msg in decoded:
                    member = msg.method is not UNSET and msg.id is not UNSET
                    link.batch = batch if member else None
                    self.handle_message(msg)
            finally:
                link.batch = None
        elif self.catalog.ready:
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
        flights = self.flights
        if (
            plain.method != "tools/list"
            or plain.jsonrpc != "2.0"
            or client_id in flights.inflight
            or client_id in flights.listens
        ):
            return False
        cursor = plain.params.cursor
        agg = self.catalog.registry.agg
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
        self.link.answer_page(client_id, page)
        return True

    def handle_message(self, msg: Message) -> None:
        if msg.jsonrpc != "2.0":
            msg_id = msg.id if msg.id is not UNSET else None
            self.link.reply(
                error_response(
                    msg_id,
                    INVALID_REQUEST,
                    'jsonrpc must be "2.0"',
                    {"reason": "not a JSON-RPC 2.0 message"},
                ),
            )
            return
        if not self.catalog.ready and not (
            msg.method == "ping" or (msg.method in OPENERS and self.catalog.views_known)
        ):
            # The client's first message says what it speaks (a handshake-era client's is its
            # initialize; any other is modern, such as a 2026-07-28 request of an HTTP session
            # of its own), which decides the connection of a dual-era server its session
            # leases (issue 29 item 1): told before the servers are leased.
            self.catalog.opener_arrived(self._handshake_version_of(msg))
            self.backlog.append((msg, self.link.batch))
            return
        self._handle(msg)

    def _handle(self, msg: Message) -> None:
        method = msg.method
        try:
            if method is UNSET:
                self.flights.client_response(msg)
                return
            if msg.id is UNSET:
                self._notification(method, msg.params)
                return
            entry = _HANDLERS.get(method)
            if entry is None:
                raise MethodNotFound(method, f"mcpool does not serve {method}")
            if self.flights.in_use(msg.id):
                raise InvalidRequest(
                    f"request id {msg.id!r} is already used by a request in flight "
                    "(ids must be unique among a session's open requests)",
                    id=msg.id,
                )
            handler, kind = entry
            if (
                kind is _params.ToolsCall
                and self.link.era is HANDSHAKE
                and self._tools_call_direct(msg)
            ):
                return
            p = decode_params(msg.params)
            if self.link.era is not HANDSHAKE:
                self._check_era(method, p)
            handler(self, msg, p, _params.typed(p, kind))
        except McpoolError as exc:
            if msg.is_request:
                self.link.send_error(msg.id, exc)
            else:
                self.link.drop(f"a malformed {method or 'response'}", exc.reason)
        except Exception as exc:
            self._internal_error(method, msg.id if msg.is_request else UNSET, exc)

    def _internal_error(self, method: str | UnsetType, msg_id: Any, exc: Exception) -> None:
        """A bug, not bad input: logged with its traceback; the request (`msg_id`, UNSET for
        anything else) still gets an answer and the session goes on."""
        trace = "".join(traceback.format_exception(exc)).rstrip()
        self._log(f"session {self._sid}: internal error handling {method}\n{trace}")
        if msg_id is not UNSET:
            self.link.send_error(
                msg_id,
                McpoolError(f"internal error in mcpool while handling {method}: {exc!r}"),
            )

    def _check_era(self, method: str, p: dict[str, Any]) -> None:
        """P1: decide the era on the first request; check every modern request's envelope."""
        if self.link.era is None:
            if not opens_modern(method, p):
                return  # initialize decides on handshake; anything else is served as it is
            env = check_envelope(p)  # a malformed one is refused and decides nothing
            self.link.era = MODERN
            self.catalog.opener_arrived(None)
            # No handshake to wait for: list_changed may flow as soon as a stream listens.
            self.link.move(PhaseEvent.SPOKE_MODERN)
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
        self.link.protocol_version = env.version
        self.link.client_capabilities = env.capabilities
        if env.client_info is not None and env.client_info != self.link.client_info:
            self.link.client_info = env.client_info
            self.catalog.update_name_budget()
            self.flights.client_said()
        if env.log_level != self.link.log_level:
            # Logging is opted into per request in this era; no level means no log messages.
            self.link.log_level = env.log_level
            if env.log_level is not None:
                self._apply_log_level(env.log_level)
        strip_envelope(p)

    def _notification(self, method: str, params: Raw | UnsetType) -> None:
        """A client's notification; a malformed one raises McpoolError (dropped by _handle)."""
        if method == "notifications/initialized":
            # Out of order (before our initialize result) is ignored, per the handshake rules.
            if self.link.initialize_answered:
                self.link.move(PhaseEvent.CLIENT_INITIALIZED)
                # What was said before the handshake is not said then: a server waiting for
                # the user's login is told now.
                for view in self.catalog.views.values():
                    entry = view.handle.entry if view.handle is not None else None
                    if entry is not None and entry.state is EntryState.NEEDS_LOGIN:
                        self.flights.tell_login_needed(view.name)
                self.catalog.tell_changes()
        elif method == "notifications/cancelled":
            c = _params.cancelled(params)
            rid = c.requestId
            if rid is UNSET:
                return  # a task's cancel names no request; mcpool forwards no tasks
            if rid in self.flights.listens:
                self._close_listen(rid)
                return
            self.flights.cancelled(rid, c.reason or "cancelled by the client")
        elif method == "notifications/progress":
            token = _params.progress(params).progressToken
            self.flights.progress_from_client(method, params, token)

    def _handshake_version_of(self, msg: Message) -> str | None:
        """The revision an opener in the backlog negotiates (None: a 2026-07-28 opener, or
        params that do not say)."""
        if msg.method != "initialize" or msg.params is UNSET:
            return None
        try:
            t = _params.initialize_decoder.decode(msg.params)
        except (msgspec.DecodeError, RecursionError):
            return None  # (answered as malformed when it is handled)
        return negotiate(t.protocolVersion)

    def _initialize(self, msg: Message, p: dict[str, Any], t: _params.Initialize) -> None:
        self.link.era = HANDSHAKE
        version = negotiate(t.protocolVersion)
        self.catalog.opener_arrived(version)
        self.link.protocol_version = version
        self.link.client_capabilities = t.capabilities or {}
        self.link.client_info = t.clientInfo or {}
        self.flights.client_said()
        # Before the answer: the client's first tools/list must already fit its name limit (and
        # nothing is notified, as the handshake is not complete yet).
        self.catalog.update_name_budget()
        result: dict[str, Any] = {
            "protocolVersion": version,
            "capabilities": SERVER_CAPABILITIES,
            "serverInfo": {"name": "mcpool", "version": __version__},
        }
        instructions = self.catalog.instructions()
        if instructions:
            result["instructions"] = instructions
        self.link.reply(response(request_id(msg), result))
        self.link.move(PhaseEvent.INITIALIZE_ANSWERED)

    def _discover(self, msg: Message, p: dict[str, Any], t: _params.Plain) -> None:
        """2026-07-28: the session's aggregated capabilities and instructions."""
        if self.link.era is not MODERN:
            raise MethodNotFound(
                "server/discover",
                "server/discover belongs to protocol 2026-07-28; this session used initialize",
            )
        # Answered at once, as initialize is (L6): before the first generation, with the
        # instructions of the servers already up.
        instructions = self.catalog.instructions()
        result = discover_result(SERVER_CAPABILITIES, instructions, SERVER_INFO)
        self.link.reply(response(request_id(msg), result))

    def _listen(self, msg: Message, p: dict[str, Any], t: _params.Listen) -> None:
        """2026-07-28: a stream carrying this session's list_changed and resources/updated.

        Acknowledged at once; answered only when it ends (the session closing answers it with
        SESSION_CLOSING). The client ends it with notifications/cancelled naming it, and gets
        no answer then. Resource URIs count as subscriptions (P6). Never part of a batch.
        """
        if self.link.era is not MODERN:
            raise MethodNotFound(
                "subscriptions/listen",
                "subscriptions/listen belongs to protocol 2026-07-28; this session used "
                "initialize (use resources/subscribe and the notifications it sends)",
            )
        if self.link.batch is not None:
            raise InvalidRequest(
                "subscriptions/listen cannot be part of a batch: its answer comes only when "
                "the stream ends, and the batch would wait for it"
            )
        honored = honored_filter(p.get("notifications"))
        listen_id = request_id(msg)
        kinds = frozenset(kind for kind, flag in LIST_FLAGS.items() if honored.get(flag))
        uris = frozenset(honored.get("resourceSubscriptions", ()))
        listen = self.flights.listens[listen_id] = _Listen(kinds, uris)
        # Acknowledged once every upstream this stream subscribed has answered: a client that
        # changes a resource right after the acknowledgment must hear of it (the upstream was
        # not listening yet when the acknowledgment went at once).
        waiting = 1  # this function's own share, dropped below: replies may come synchronously

        def subscribed(_reply: Message | None) -> None:
            nonlocal waiting
            waiting -= 1
            if waiting == 0 and self.flights.listens.get(listen_id) is listen:
                self.link.send(
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
        listen = self.flights.listens.pop(listen_id, None)
        if listen is None:
            return
        flights = self.flights
        held = {uri for other in flights.listens.values() for uri in other.uris}
        held |= flights.subscriptions
        for uri in listen.uris - held:
            self._let_go_uri(uri)

    def _ping(self, msg: Message, p: dict[str, Any], t: _params.Plain) -> None:
        self.send_result(msg, {})

    def _list(
        self,
        msg: Message,
        t: _params.ListPage,
        kind: str,
        field: str,
        served: tuple[dict[str, Any], ...] | None = None,
    ) -> None:
        """A page of the generation's list of `kind`, or of `served` (the session's own: not
        cached on the shared aggregate)."""
        gen = self.catalog.registry
        items: tuple[dict[str, Any], ...] = getattr(gen, kind) if served is None else served
        cursor = t.cursor
        # A walk goes on on the list it began on (issue 29 item 6): a cursor names that list.
        own = served is not None
        served, offset = (items, 0) if cursor is None else self._walk(cursor)
        modern = self.link.era is MODERN
        size = self.page_size
        number = self._walk_number(served) if offset + size < len(served) else 0
        # Each page of the current list is encoded once per aggregate, era (a modern one
        # carries more), page size, offset and list number (the one its next cursor names).
        cacheable = (
            not own
            and served is items
            and (offset == 0 or (size > 0 and offset % size == 0 and offset < len(items)))
        )
        key = (kind, modern, size, offset, number)
        if cacheable:
            cached = gen.encoded.get(key)
            if cached is not None:
                self.link.answer_page(request_id(msg), cached)
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
        self.link.answer_page(request_id(msg), encoded)

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

    def _tools_list(self, msg: Message, p: dict[str, Any], t: _params.ListPage) -> None:
        tools = self.catalog.registry.tools
        if self.search_on(tools):
            listed = self.search.listed(tools)
            spared = self.search.definition_bytes(tools, _encoded_size) - _encoded_size(listed)
            self.search.spared_bytes += max(0, spared)
            self._list(msg, t, "tools", "tools", served=listed)
            return
        self._list(msg, t, "tools", "tools")

    def search_on(self, tools: tuple[dict[str, Any], ...]) -> bool:
        """Whether this session is served mcpool's search instead of `tools` now."""
        name = self.link.client_info.get("name")
        return self.search.on(name if isinstance(name, str) else None, tools, _encoded_size)

    def _prompts_list(self, msg: Message, p: dict[str, Any], t: _params.ListPage) -> None:
        self._list(msg, t, "prompts", "prompts")

    def _resources_list(self, msg: Message, p: dict[str, Any], t: _params.ListPage) -> None:
        self._list(msg, t, "resources", "resources")

    def _templates_list(self, msg: Message, p: dict[str, Any], t: _params.ListPage) -> None:
        self._list(msg, t, "resource_templates", "resourceTemplates")

    def _unknown_tool_text(self, name: str) -> str:
        # A server that waits for the user's login has listed nothing yet: a call of a name in
        # its prefix says what to do rather than only that the name is unknown.
        for view in self.catalog.views.values():
            entry = view.handle.entry if view.handle is not None else None
            if (
                name.startswith(f"{view.name}__")
                and entry is not None
                and entry.state is EntryState.NEEDS_LOGIN
            ):
                return f"Unknown tool: {name}: {login_needed_text(view.name)}"
            budget = self.catalog.name_budget
            for upstream in view.key.held:
                if exposed_name(view.name, upstream, prefix=view.prefix, budget=budget) == name:
                    return (
                        f"Tool held: server '{view.name}' changed the definition of '{upstream}' "
                        "since it was pinned, and the change is not approved: see `daemonctl "
                        f"changes`, then `daemonctl approve {view.name} {upstream}` to serve it"
                    )
        return f"Unknown tool: {name} (no server of this session exposes it)"

    def _tools_call(self, msg: Message, p: dict[str, Any], t: _params.ToolsCall) -> None:
        gen = self.catalog.registry
        name = t.name
        if name in SEARCH_TOOLS and self.search_on(gen.tools):
            if name == SEARCH_TOOL:
                self._search_tools(msg, t, gen.tools)
                return
            # CALL_TOOL: the tool it names, called as the client would call it (the same
            # routing, policy, limits and errors).
            inner = _params.search_call(t.arguments)
            if inner.name in SEARCH_TOOLS:
                raise InvalidParams(f"{CALL_TOOL} calls a found tool, not {inner.name}")
            p = {"name": inner.name, "arguments": inner.arguments or {}}
            if t.meta is not None:
                p["_meta"] = msgspec.to_builtins(t.meta)
            t = _params.ToolsCall(name=inner.name, arguments=inner.arguments, meta=t.meta)
            name = inner.name
        route = self.catalog.allows(gen.tool_route(name))
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
        if self.link.request_headers is not None:
            self._check_param_headers(name, p.get("arguments"), self.link.request_headers)
        p["name"] = route.upstream_name
        self.flights.forward(msg, route.view, "tools/call", p, t.meta)

    def _search_tools(
        self, msg: Message, t: _params.ToolsCall, tools: tuple[dict[str, Any], ...]
    ) -> None:
        """mcpool's search: the best matches of the query among the tools the session is
        served (what it may not see is not there), each whole; for a client that re-lists,
        they also join its list (bounded) and it is told the list changed."""
        asked = _params.search_query(t.arguments)
        found = self.search.find(tools, asked.query, asked.limit or DEFAULT_RESULTS)
        self.send_result(
            msg,
            {
                "content": [{"type": "text", "text": _encoder.encode({"tools": found}).decode()}],
            },
        )
        names = [n for t in found if isinstance(n := t.get("name"), str)]
        if names and not self.catalog.client_lists_once() and self.search.join(names):
            self.catalog.tell_changed(("tools",))

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
        if raw is UNSET or self.link.request_headers is not None:
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
        gen = self.catalog.registry
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
            or self.catalog.views.get(view.name) is not view
            or not view.key.allows(upstream_name)
        ):
            return False
        entry = handle.entry
        upstream = entry.upstream
        if upstream is None or upstream.era == MODERN or not upstream.alive or entry.turns.on:
            return False
        call.name = upstream_name
        flights = self.flights
        encoded = _encoder.encode(call)
        flight = _InFlight(
            flights,
            client_id,
            handle,
            entry,
            upstream,
            self.link.batch,
            watch=None
            if flights.tape is None
            else (perf_counter(), view.name, "tools/call", upstream_name, len(encoded)),
        )
        handle.in_flight += 1
        flights.inflight[client_id] = flight
        try:
            flight.uid = upstream.send_checked("tools/call", encoded, flight)
        except BaseException:
            flight.finish()  # whatever failed, the request is not in flight
            raise
        return True

    def _check_param_headers(self, name: str, arguments: Any, headers: dict[str, str]) -> None:
        """2026-07-28 over HTTP: the Mcp-Param-* headers must agree with the arguments for the
        tool's `x-mcp-header` annotations, as this session lists the tool (-32020, HTTP 400)."""
        tool = next((t for t in self.catalog.registry.tools if t.get("name") == name), None)
        annotated = header_params(tool.get("inputSchema")) if tool is not None else {}
        if isinstance(annotated, str):
            return  # screened out when listed; nothing here to check against
        why = param_header_mismatch(annotated, arguments, headers)
        if why is not None:
            raise McpoolError(why, message="Header mismatch", code=HEADER_MISMATCH)

    def _prompts_get(self, msg: Message, p: dict[str, Any], t: _params.PromptsGet) -> None:
        name = t.name
        route = self.catalog.allows(self.catalog.registry.prompt_route(name))
        if route is None:
            raise InvalidParams(
                f"unknown prompt: {name}: no server of this session exposes it",
                message=f"Unknown prompt: {name}",
                prompt=name,
            )
        p["name"] = route.upstream_name
        self.flights.forward(msg, route.view, "prompts/get", p, t.meta)

    def _resources_read(self, msg: Message, p: dict[str, Any], t: _params.ResourceUri) -> None:
        self.flights.forward(msg, self.catalog.resource_view(t.uri), "resources/read", p, t.meta)

    def _subscribe(self, msg: Message, p: dict[str, Any], t: _params.ResourceUri) -> None:
        """P6: the upstream is subscribed once per URI, however many sessions ask."""
        uri = t.uri
        view = self.catalog.resource_view(uri)
        assert view.handle is not None
        self.flights.subscriptions.add(uri)
        if view.handle.entry.subscribe(view.handle, uri):
            self.flights.forward(msg, view, "resources/subscribe", p, t.meta)
        else:
            self.send_result(msg, {})

    def _unsubscribe(self, msg: Message, p: dict[str, Any], t: _params.ResourceUri) -> None:
        uri = t.uri
        view = self.catalog.resource_view(uri)
        assert view.handle is not None
        self.flights.subscriptions.discard(uri)
        was_subscribed = uri in view.handle.subscriptions
        if was_subscribed and view.handle.entry.unsubscribe(view.handle, uri):
            self.flights.forward(msg, view, "resources/unsubscribe", p, t.meta)
        else:
            self.send_result(msg, {})

    def _hold_uri(self, uri: str, on_reply: Callable[[Message], None] = _ignore_reply) -> bool:
        """A listen stream's resource: subscribe the upstream if no session had it (P6).
        True when a subscribe went to the upstream: `on_reply` gets its answer (once)."""
        try:
            view = self.catalog.resource_view(uri)
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
            view = self.catalog.resource_view(uri)
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
            route = self.catalog.allows(self.catalog.registry.prompt_route(ref.name))
            if route is None:
                raise InvalidParams(
                    f"unknown prompt: {ref.name}: no server of this session exposes it",
                    prompt=ref.name,
                )
            p["ref"] = {**p["ref"], "name": route.upstream_name}
            self.flights.forward(msg, route.view, "completion/complete", p, t.meta)
        else:
            view = self.catalog.resource_view(ref.uri)
            self.flights.forward(msg, view, "completion/complete", p, t.meta)

    def _set_level(self, msg: Message, p: dict[str, Any], t: _params.SetLevel) -> None:
        level = t.level
        if level not in LOG_LEVELS:
            raise InvalidParams(f"unknown log level: {level}", levels=list(LOG_LEVELS))
        self.link.log_level = level
        self._apply_log_level(level)
        self.send_result(msg, {})

    def _apply_log_level(self, level: str) -> None:
        for view in self.catalog.registry.views:
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


_HANDLERS: dict[str, tuple[Callable[[Requests, Message, dict[str, Any], Any], None], type]] = {
    "initialize": (Requests._initialize, _params.Initialize),
    "server/discover": (Requests._discover, _params.Plain),
    "subscriptions/listen": (Requests._listen, _params.Listen),
    "ping": (Requests._ping, _params.Plain),
    "tools/list": (Requests._tools_list, _params.ListPage),
    "tools/call": (Requests._tools_call, _params.ToolsCall),
    "prompts/list": (Requests._prompts_list, _params.ListPage),
    "prompts/get": (Requests._prompts_get, _params.PromptsGet),
    "resources/list": (Requests._resources_list, _params.ListPage),
    "resources/templates/list": (Requests._templates_list, _params.ListPage),
    "resources/read": (Requests._resources_read, _params.ResourceUri),
    "resources/subscribe": (Requests._subscribe, _params.ResourceUri),
    "resources/unsubscribe": (Requests._unsubscribe, _params.ResourceUri),
    "completion/complete": (Requests._complete, _params.Complete),
    "logging/setLevel": (Requests._set_level, _params.SetLevel),
}
