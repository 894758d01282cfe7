"""A scripted fake model API on 127.0.0.1 for running real agent clients (Claude Code, Codex,
gemini-cli, Qwen Code, Copilot CLI, opencode, Cline CLI) through mcpool without any network.

One HTTP server speaks the four wire formats those clients use:

  Anthropic Messages      POST .../v1/messages (streaming SSE or JSON), .../count_tokens
                          (Claude Code)
  OpenAI Responses        POST .../responses (streaming SSE, as Codex reads it)
  Gemini                  POST .../models/M:generateContent | :streamGenerateContent | :countTokens
                          (gemini-cli)
  OpenAI chat completions POST .../chat/completions (streaming SSE or JSON): Qwen Code, and
                          Copilot CLI, opencode and Cline with an OpenAI-compatible provider

Each request is decoded into a protocol-neutral `Turn` (the tool names offered, the tool results
in the conversation so far), a `Script` decides the reply (`ToolCall` or `Text`), and the reply
is encoded back in the request's format. Every request is recorded. Anything else a client asks
(model lists, telemetry, quota checks) gets a harmless empty answer, and a request without the
script's tool (title generation, next-speaker checks) gets a short text.

The server is also the clients' HTTP(S) proxy (the tests point HTTPS_PROXY and friends at it):
a `CONNECT host:port` or an absolute-URI request for anywhere else is refused at once (403) and
its target recorded in `refused`, so a client's telemetry and update checks reach nothing and
are not retried against a port that does not answer (Cline CLI retried a closed port for 7 s).

The server runs in a thread (ThreadingHTTPServer): the clients are separate processes and the
script's hooks may block (a barrier, a daemonctl call) without stalling the test's trio loop.
Responses use HTTP/1.0 framing (the connection closes after each), which every client accepts
for SSE and which keeps the server free of chunked encoding.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Json = dict[str, Any]

# The model's pause before each reply while a script waits for a client to re-list its tools:
# a client handles notifications/tools/list_changed asynchronously, so give it time to act.
RELIST_PAUSE = 1.0
# How a Responses tool inside a namespace is named in a Turn: OpenAI function names cannot
# contain it, so "namespace/name" splits back unambiguously.
NAMESPACE_SEP = "/"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Json
    call_id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:12]}")


@dataclass(frozen=True)
class Text:
    text: str


Reply = ToolCall | Text


@dataclass
class Turn:
    """What a request told the model, whatever its wire format."""

    api: str
    tools: list[str]
    results: list[str]  # the text of every tool result in the conversation, oldest first
    stream: bool
    model: str
    body: Json
    schemas: dict[str, Json] = field(default_factory=dict)  # each offered tool's input schema


@dataclass
class Recorded:
    method: str
    path: str
    body: Any
    turn: Turn | None
    reply: Reply | None


# --- the script ---------------------------------------------------------------------------


@dataclass
class Script:
    """First turn: call the tool whose name ends with `suffix`; then quote its result.

    The tool may reach the model four ways, and the script follows each as a model would:
    listed among the request's tools (called directly); deferred, named only in the prompt
    behind a search tool (Claude Code's ToolSearch, Qwen Code's `tool_search`: search for it
    first, then call it once the search put it in the tool list); deferred behind a meta-tool
    that calls it by name (Qwen Code's `tool_call`, after the search showed its schema); or not
    named at all, behind mcpool's own search (issue 31, for a client without one: a request
    offering `mcpool_search_tools`): ask it in words (`search_words`, by default the suffix's
    words, "__tool_17" -> "tool 17"), then call the tool the result names through
    `mcpool_call_tool`. `deferred`, `search` and `meta` record which.

    `on_first_result` runs once, before the model answers the request that carries the first
    result (the client is then mid-run, its session attached). With `changed_suffix`, the script
    checks that the client re-lists its tools after that hook changed the tool set upstream of
    the client: the model keeps calling the tool again, up to `relist_turns` times and pausing
    RELIST_PAUSE before each, until a request offers (or names) a tool ending with
    `changed_suffix`. `relisted` tells whether one did.

    The model makes one call per reply, so the n-th tool result of a conversation answers its
    n-th call: a request carrying n results gets call n + 1 (a client's retry of a request gets
    the same decision again, and side requests without the tool get a short text).
    """

    suffix: str
    arguments: Json
    changed_suffix: str | None = None
    on_first_result: Callable[[], None] | None = None
    relist_turns: int = 3
    exposed: str | None = None  # the tool's name as the client showed it to the model
    exposed_changed: str | None = None
    relisted: bool | None = None
    deferred: bool = False  # the tool was offered only by name, behind a search tool
    search: str | None = None  # the search tool the model used to find it
    meta: str | None = None  # the meta-tool the model called it through
    search_words: str | None = None  # the query for mcpool's search (None: the suffix's words)
    tool_lists: list[list[str]] = field(default_factory=list)
    _hook_done: bool = False
    _asked_in_words: bool = False  # the search was mcpool's: its call tool is the meta-tool
    _calls: list[str] = field(default_factory=list)  # "search" or "call", in call order
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def quote(self, result: str) -> str:
        return f"The tool answered: {result}"

    def decide(self, turn: Turn) -> Reply:
        with self._lock:
            return self._decide(turn)

    def _note(self, index: int, kind: str) -> None:
        self._calls[index : index + 1] = [kind]

    def _decide(self, turn: Turn) -> Reply:
        answered = len(turn.results)
        kinds = self._calls[:answered]
        results = [r for r, kind in zip(turn.results, kinds, strict=False) if kind == "call"]
        if not results:
            return self._first_call(turn, answered, searched="search" in kinds)
        self.tool_lists.append(list(turn.tools))
        first = results[0]
        if not self._hook_done:
            self._hook_done = True
            if self.on_first_result is not None:
                self.on_first_result()
        if self.changed_suffix is None:
            return Text(self.quote(first))
        changed = _ending_with(turn.tools, self.changed_suffix) or _mentioned(
            turn, self.changed_suffix
        )
        if changed is not None and self.relisted is None and len(results) > 1:
            self.relisted = True
            self.exposed_changed = changed
        if self.relisted or len(results) > self.relist_turns:
            if self.relisted is None:
                self.relisted = False
            return Text(self.quote(first))
        time.sleep(RELIST_PAUSE)
        # Call a tool both tool sets share so the conversation goes on whatever the client knows.
        again = self._call(turn, self.exposed or self.suffix)
        if again is None:
            return Text(self.quote(first))
        self._note(answered, "call")
        return again

    def _first_call(self, turn: Turn, answered: int, *, searched: bool) -> Reply:
        listed = _ending_with(turn.tools, self.suffix)
        name = listed or _mentioned(turn, self.suffix)
        if name is None:
            return self._ask_in_words(turn, answered, searched=searched)
        self.tool_lists.append(list(turn.tools))
        if listed is None:
            self.deferred = True
            search = _search_tool(turn)
            if not searched and search is not None:
                # Fetch the tool's schema first, as a model does with a deferred tool.
                self.search = search
                self._note(answered, "search")
                return ToolCall(search, {_search_argument(turn, search): f"select:{name}"})
        call = self._call(turn, name)
        if call is None:
            return Text("ok")
        if self.exposed is None:
            self.exposed = name
        self._note(answered, "call")
        return call

    def _ask_in_words(self, turn: Turn, answered: int, *, searched: bool) -> Reply:
        """The request names no such tool: ask mcpool's search for it, once, if it is offered."""
        search = _words_search_tool(turn)
        if searched or search is None:
            # A side request (a title, a summary), a client without the tool, or a search that
            # did not find it.
            return Text("ok")
        self.tool_lists.append(list(turn.tools))
        self.deferred = True
        self.search = search
        self._asked_in_words = True
        self._note(answered, "search")
        query = self.search_words or " ".join(re.findall(r"[A-Za-z]+|[0-9]+", self.suffix))
        return ToolCall(search, {_search_argument(turn, search): query})

    def _call(self, turn: Turn, name: str) -> ToolCall | None:
        """A call of `name` with the script's arguments: directly when the request lists it,
        else through the request's meta-tool; None when the request offers neither."""
        meta = self.meta or _meta_tool(turn)
        if meta is None and self._asked_in_words:
            meta = _words_meta_tool(turn)
        if name in turn.tools or meta is None:
            # Listed, or deferred where the client takes a direct call once it was searched.
            return ToolCall(name, self.arguments)
        if meta not in turn.tools:
            return None
        self.meta = meta
        name_field, arguments_field = _meta_fields(turn, meta)
        return ToolCall(meta, {name_field: name, arguments_field: self.arguments})


def _mentioned(turn: Turn, suffix: str) -> str | None:
    """A tool name ending with `suffix` that the request names outside its tool list (a
    deferred tool, listed by name in the system prompt or a search result)."""
    rest = "\n".join(_all_strings({k: v for k, v in turn.body.items() if k != "tools"}))
    match = re.search(r"[A-Za-z0-9_.\-]*" + re.escape(suffix) + r"\b", rest)
    return None if match is None else match.group(0)


def _all_strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _all_strings(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _all_strings(item)


def _folded(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


# What clients call the tool that finds a deferred tool, and the one that calls a deferred tool
# by name, folded (lowercase, no `_` or `-`): Claude Code's ToolSearch, Qwen Code's tool_search
# and tool_call. A client's new name for either is one entry here.
SEARCH_TOOLS = frozenset({"toolsearch", "searchtools"})
META_TOOLS = frozenset({"toolcall", "calltool"})


def _search_tool(turn: Turn) -> str | None:
    return next((n for n in turn.tools if _folded(n) in SEARCH_TOOLS), None)


def _meta_tool(turn: Turn) -> str | None:
    return next((n for n in turn.tools if _folded(n) in META_TOOLS), None)


# mcpool's own search and call tools (`mcpool_search_tools`, `mcpool_call_tool`), folded, as
# the ends of names: a client shows them under its own prefix or namespace
# (`mcp__mcpool/mcpool_search_tools` in Codex's Turn).
WORDS_SEARCH_END = "searchtools"
WORDS_META_END = "calltool"


def _words_search_tool(turn: Turn) -> str | None:
    return next((n for n in turn.tools if _folded(n).endswith(WORDS_SEARCH_END)), None)


def _words_meta_tool(turn: Turn) -> str | None:
    return next((n for n in turn.tools if _folded(n).endswith(WORDS_META_END)), None)


def _properties(turn: Turn, tool: str) -> tuple[dict[str, Json], list[str]]:
    schema = turn.schemas.get(tool) or {}
    properties = schema.get("properties")
    required = schema.get("required")
    return (
        properties if isinstance(properties, dict) else {},
        [r for r in required if isinstance(r, str)] if isinstance(required, list) else [],
    )


def _search_argument(turn: Turn, search: str) -> str:
    """The search tool's query field: its first required string property, else `query`."""
    properties, required = _properties(turn, search)
    for name in [*required, *properties]:
        if isinstance(properties.get(name), dict) and properties[name].get("type") == "string":
            return name
    return "query"


def _meta_fields(turn: Turn, meta: str) -> tuple[str, str]:
    """The meta-tool's (tool name field, arguments field): its string and object properties."""
    properties, required = _properties(turn, meta)
    order = [*required, *(p for p in properties if p not in required)]
    kinds = {p: properties[p].get("type") for p in order if isinstance(properties[p], dict)}
    name = next((p for p in order if kinds.get(p) == "string"), "name")
    arguments = next((p for p in order if kinds.get(p) == "object"), "arguments")
    return name, arguments


def _ending_with(names: list[str], suffix: str) -> str | None:
    for name in names:
        if name.endswith(suffix):
            return name
    return None


# --- decoding requests --------------------------------------------------------------------


def _strings(value: Any) -> Iterator[str]:
    """Every string and number in a JSON value; strings that are JSON documents are searched
    too."""
    if isinstance(value, str):
        if value[:1] in "[{":
            try:
                decoded = json.loads(value)
            except ValueError:
                yield value
                return
            yield from _strings(decoded)
            return
        yield value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield str(value)  # structured results ({"pid": 123}) quote their numbers too
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        texts = [value["text"]] if isinstance(value.get("text"), str) else []
        if texts:
            yield from texts
            return
        for key, item in value.items():
            if key not in ("type", "name", "id", "call_id", "tool_use_id", "tool_call_id"):
                yield from _strings(item)


def _result_text(value: Any) -> str:
    return " ".join(s for s in _strings(value) if s.strip())


def _schema(value: Any) -> Json:
    return value if isinstance(value, dict) else {}


def anthropic_turn(body: Json) -> Turn:
    offered = [t for t in body.get("tools") or [] if isinstance(t, dict) and "name" in t]
    tools = [t["name"] for t in offered]
    schemas = {t["name"]: _schema(t.get("input_schema")) for t in offered}
    results = []
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    results.append(_result_text(block.get("content")))
    stream, model = bool(body.get("stream")), str(body.get("model"))
    return Turn("anthropic", tools, results, stream, model, body, schemas)


def responses_turn(body: Json) -> Turn:
    tools: list[str] = []
    schemas: dict[str, Json] = {}
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        if "name" in tool:
            tools.append(tool["name"])
            schemas[tool["name"]] = _schema(tool.get("parameters"))
        # A namespace groups tools under one name (Codex: one per MCP server); the model
        # calls `name` within `namespace`. Recorded as "namespace/name".
        for inner in tool.get("tools") or []:
            if isinstance(inner, dict) and "name" in inner:
                name = f"{tool.get('name', '')}{NAMESPACE_SEP}{inner['name']}"
                tools.append(name)
                schemas[name] = _schema(inner.get("parameters"))
    results = [
        _result_text(item.get("output"))
        for item in body.get("input") or []
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]
    stream, model = bool(body.get("stream")), str(body.get("model"))
    return Turn("responses", tools, results, stream, model, body, schemas)


def gemini_turn(body: Json, model: str, stream: bool) -> Turn:
    declared = [
        decl
        for tool in body.get("tools") or []
        for decl in (tool.get("functionDeclarations") or [])
        if isinstance(decl, dict) and "name" in decl
    ]
    tools = [decl["name"] for decl in declared]
    schemas = {
        d["name"]: _schema(d.get("parametersJsonSchema") or d.get("parameters")) for d in declared
    }
    results = [
        _result_text(part["functionResponse"].get("response"))
        for content in body.get("contents") or []
        for part in content.get("parts") or []
        if isinstance(part, dict) and isinstance(part.get("functionResponse"), dict)
    ]
    return Turn("gemini", tools, results, stream, model, body, schemas)


def chat_turn(body: Json) -> Turn:
    functions = [
        t["function"]
        for t in body.get("tools") or []
        if isinstance(t, dict) and isinstance(t.get("function"), dict) and "name" in t["function"]
    ]
    tools = [f["name"] for f in functions]
    schemas = {f["name"]: _schema(f.get("parameters")) for f in functions}
    results = [
        _result_text(m.get("content"))
        for m in body.get("messages") or []
        if isinstance(m, dict) and m.get("role") == "tool"
    ]
    stream, model = bool(body.get("stream")), str(body.get("model"))
    return Turn("chat", tools, results, stream, model, body, schemas)


# --- encoding replies ---------------------------------------------------------------------

USAGE_ANTHROPIC = {"input_tokens": 10, "output_tokens": 5}


def _sse(event: str | None, data: Json | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def _event(kind: str, **fields: Any) -> bytes:
    """An SSE event named like its payload's "type" (Anthropic's and the Responses API's form)."""
    return _sse(kind, {"type": kind, **fields})


def anthropic_reply(turn: Turn, reply: Reply) -> tuple[str, list[bytes] | Json]:
    message_id = f"msg_{uuid.uuid4().hex[:12]}"
    if isinstance(reply, ToolCall):
        block: Json = {"type": "tool_use", "id": reply.call_id, "name": reply.name, "input": {}}
        stop = "tool_use"
    else:
        block = {"type": "text", "text": ""}
        stop = "end_turn"
    if not turn.stream:
        full = (
            {**block, "input": reply.arguments}
            if isinstance(reply, ToolCall)
            else {"type": "text", "text": reply.text}
        )
        return "json", {
            "id": message_id, "type": "message", "role": "assistant", "model": turn.model,
            "content": [full], "stop_reason": stop, "stop_sequence": None, "usage": USAGE_ANTHROPIC,
        }  # fmt: skip
    delta = (
        {"type": "input_json_delta", "partial_json": json.dumps(reply.arguments)}
        if isinstance(reply, ToolCall)
        else {"type": "text_delta", "text": reply.text}
    )
    start: Json = {
        "id": message_id, "type": "message", "role": "assistant", "model": turn.model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }  # fmt: skip
    stop_delta = {"stop_reason": stop, "stop_sequence": None}
    return "sse", [
        _event("message_start", message=start),
        _event("content_block_start", index=0, content_block=block),
        _event("content_block_delta", index=0, delta=delta),
        _event("content_block_stop", index=0),
        _event("message_delta", delta=stop_delta, usage={"output_tokens": 5}),
        _event("message_stop"),
    ]


def responses_reply(turn: Turn, reply: Reply) -> tuple[str, list[bytes] | Json]:
    response_id = f"resp_{uuid.uuid4().hex[:12]}"
    if isinstance(reply, ToolCall):
        namespace, _, name = reply.name.rpartition(NAMESPACE_SEP)
        item: Json = {
            "type": "function_call", "id": f"fc_{uuid.uuid4().hex[:12]}", "status": "completed",
            "call_id": reply.call_id, "name": name, "arguments": json.dumps(reply.arguments),
        }  # fmt: skip
        if namespace:
            item["namespace"] = namespace
    else:
        item = {
            "type": "message", "id": f"msg_{uuid.uuid4().hex[:12]}", "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
        }  # fmt: skip
    usage = {
        "input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15,
    }  # fmt: skip
    response = {
        "id": response_id, "object": "response", "status": "completed", "model": turn.model,
        "output": [item], "usage": usage,
    }  # fmt: skip
    if not turn.stream:
        return "json", response
    in_progress = {**response, "status": "in_progress", "output": []}
    events = [
        _event("response.created", response=in_progress),
        _event("response.output_item.added", output_index=0, item=item),
    ]
    if isinstance(reply, Text):
        text = {"item_id": item["id"], "output_index": 0, "content_index": 0}
        events.append(_event("response.output_text.delta", **text, delta=reply.text))
    events += [
        _event("response.output_item.done", output_index=0, item=item),
        _event("response.completed", response=response),
    ]
    return "sse", events


def gemini_reply(turn: Turn, reply: Reply) -> tuple[str, list[bytes] | Json]:
    if isinstance(reply, ToolCall):
        part: Json = {"functionCall": {"name": reply.name, "args": reply.arguments}}
    elif turn.body.get("generationConfig", {}).get("responseMimeType") == "application/json":
        # gemini-cli's side questions (next speaker, model routing) want JSON: answer them all.
        answer = {"reasoning": "done", "next_speaker": "user", "model_choice": "flash"}
        part = {"text": json.dumps(answer)}
    else:
        part = {"text": reply.text}
    response = {
        "candidates": [
            {"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}
        ],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
        "modelVersion": turn.model,
    }
    if turn.stream:
        return "sse", [_sse(None, response)]
    return "json", response


def chat_reply(turn: Turn, reply: Reply) -> tuple[str, list[bytes] | Json]:
    chunk_id = f"chatcmpl-{uuid.uuid4().hex[:12]}"
    base = {"id": chunk_id, "created": int(time.time()), "model": turn.model}
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    if isinstance(reply, ToolCall):
        call = {
            "id": reply.call_id, "type": "function",
            "function": {"name": reply.name, "arguments": json.dumps(reply.arguments)},
        }  # fmt: skip
        message: Json = {"role": "assistant", "content": None, "tool_calls": [call]}
        delta: Json = {"role": "assistant", "tool_calls": [{"index": 0, **call}]}
        finish = "tool_calls"
    else:
        message = {"role": "assistant", "content": reply.text}
        delta = {"role": "assistant", "content": reply.text}
        finish = "stop"
    if not turn.stream:
        return "json", {
            **base, "object": "chat.completion", "usage": usage,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }  # fmt: skip
    chunk = {**base, "object": "chat.completion.chunk"}
    return "sse", [
        _sse(None, {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
        _sse(None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}),
        _sse(None, {**chunk, "choices": [], "usage": usage}),
        _sse(None, "[DONE]"),
    ]


# --- the server ---------------------------------------------------------------------------


class FakeModel:
    """`with FakeModel(script) as model:` serves on model.url until the block ends."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[Recorded] = []
        self.refused: list[str] = []  # what a client tried to reach through the proxy
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FakeModel:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def record(self, entry: Recorded) -> None:
        with self._lock:
            self.requests.append(entry)

    def refuse(self, target: str) -> None:
        with self._lock:
            self.refused.append(target)

    def turns(self) -> list[Turn]:
        with self._lock:
            return [r.turn for r in self.requests if r.turn is not None]

    def summary(self) -> str:
        """One line per request, for assertion messages."""
        with self._lock:
            lines = []
            for r in self.requests:
                what = "" if r.turn is None else f" tools={r.turn.tools} results={r.turn.results}"
                lines.append(f"{r.method} {r.path}{what} -> {r.reply}")
            if self.refused:
                lines.append(f"refused through the proxy: {sorted(set(self.refused))}")
        return "\n".join(lines)

    def answer(self, method: str, path: str, body: Any) -> tuple[str, list[bytes] | Json]:
        route = path.split("?", 1)[0]
        turn: Turn | None = None
        if method == "POST" and isinstance(body, dict):
            if route.endswith("/count_tokens"):
                self.record(Recorded(method, path, body, None, None))
                return "json", {"input_tokens": 10}
            if route.endswith(":countTokens"):
                self.record(Recorded(method, path, body, None, None))
                return "json", {"totalTokens": 10}
            if route.endswith("/messages"):
                turn, encode = anthropic_turn(body), anthropic_reply
            elif route.endswith("/responses"):
                turn, encode = responses_turn(body), responses_reply
            elif route.endswith("/chat/completions"):
                turn, encode = chat_turn(body), chat_reply
            elif ":generateContent" in route or ":streamGenerateContent" in route:
                model = route.rsplit("/", 1)[-1].split(":", 1)[0]
                turn = gemini_turn(body, model, ":streamGenerateContent" in route)
                encode = gemini_reply
        if turn is None:
            self.record(Recorded(method, path, body, None, None))
            # Model lists (OpenAI's "data", Codex's "models"), telemetry, anything else.
            return "json", {"object": "list", "data": [], "models": []}
        reply = self.script.decide(turn)
        self.record(Recorded(method, path, body, turn, reply))
        return encode(turn, reply)


def _handler_for(model: FakeModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _refuse(self) -> None:
            model.refuse(self.path)
            self.send_response(403)
            self.send_header("Content-Length", "0")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

        def do_CONNECT(self) -> None:
            self._refuse()

        def _serve(self) -> None:
            if self.path.startswith(("http://", "https://")):
                self._refuse()  # a proxied request for another host
                return
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body: Any = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
            kind, payload = model.answer(self.command, self.path, body)
            self.send_response(200)
            if kind == "sse":
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()
                assert isinstance(payload, list)
                for event in payload:
                    self.wfile.write(event)
                    self.wfile.flush()
            else:
                data = json.dumps(payload).encode()
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass  # Every request is recorded; stderr stays for the clients' own output.

    return Handler
