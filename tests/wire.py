"""A small streamable HTTP MCP server of the tests' own, on a real loopback socket (trio,
HTTP/1.1 with `Connection: close`): what HTTP upstream tests run against (issue 15)."""

from __future__ import annotations

import functools
import json
from typing import Any

import trio

CHALLENGE = 'Bearer resource_metadata="http://127.0.0.1/.well-known/oauth-protected-resource"'
SAY = {"name": "say", "inputSchema": {"type": "object"}}


class WireServer:
    """A streamable HTTP MCP server: JSON for most requests; `tools/call` answers on an SSE
    stream that first carries a log message naming the call's `text` argument. `poll`: the call's
    stream sends only a priming event and ends; the answer comes on the GET that resumes it."""

    def __init__(
        self,
        *,
        unauthorized: bool = False,
        poll: bool = False,
        tools: list[Any] | None = None,
        modern: bool = False,
        refuse_discover: int = 0,
    ) -> None:
        self.unauthorized = unauthorized
        self.poll = poll
        self.tools = [SAY] if tools is None else tools
        # modern: answers server/discover (2026-07-28) as well as initialize, and a tool call
        # without inputResponses with an input_required result asking for an elicitation.
        self.modern = modern
        self.envelopes: list[Any] = []  # modern: each tools/call's `_meta` envelope
        # modern: the first `refuse_discover` server/discover requests get a 400 with -32022
        # naming 2026-07-28 as supported (a modern server the client must ask again).
        self.refuse_discover = refuse_discover
        self.posts: list[tuple[dict[str, str], Any]] = []  # every POST's headers and body
        self.port = 0
        self.gets: list[dict[str, str]] = []
        self.parked: list[Any] = []  # poll: the ids of calls whose stream ended unanswered

    async def serve(self, nursery: trio.Nursery) -> None:
        serve = functools.partial(trio.serve_tcp, self._connection, 0, host="127.0.0.1")
        listeners = await nursery.start(serve)
        self.port = listeners[0].socket.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    async def _connection(self, stream: trio.SocketStream) -> None:
        async with stream:
            method, headers, body = await _read_request(stream)
            if self.unauthorized:
                await _send(stream, 401, b"", {"www-authenticate": CHALLENGE})
            elif method == "GET":
                await self._get(stream, headers)
            elif method == "DELETE":
                await _send(stream, 200, b"")
            else:
                msg = json.loads(body)
                self.posts.append((headers, msg))
                await self._post(stream, msg)

    async def _post(self, stream: trio.SocketStream, msg: dict[str, Any]) -> None:
        rid, method = msg.get("id"), msg.get("method")
        if rid is None:
            await _send(stream, 202, b"")
        elif method == "server/discover" and self.modern and self.refuse_discover:
            self.refuse_discover -= 1
            requested = msg["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"]
            error = {
                "code": -32022,
                "message": "Unsupported protocol version",
                "data": {"supported": ["2026-07-28"], "requested": requested},
            }
            body = json.dumps({"jsonrpc": "2.0", "id": rid, "error": error}).encode()
            await _send(stream, 400, body, {"content-type": "application/json"})
        elif method == "server/discover" and self.modern:
            result = {
                "supportedVersions": ["2025-11-25", "2026-07-28"],
                "capabilities": {"tools": {}},
                "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "wire", "version": "1"}},
            }
            await _send_json(stream, {"jsonrpc": "2.0", "id": rid, "result": result})
        elif method == "tools/call" and self.modern:
            params = msg["params"]
            self.envelopes.append(params.get("_meta"))
            if "inputResponses" not in params:
                ask = {
                    "method": "elicitation/create",
                    "params": {
                        "mode": "form",
                        "message": "your name?",
                        "requestedSchema": {
                            "type": "object",
                            "properties": {"name": {"type": "string"}},
                        },
                    },
                }
                result = {
                    "resultType": "input_required",
                    "inputRequests": {"who": ask},
                    "requestState": "state-1",
                }
            else:
                answer = params["inputResponses"]["who"]
                text = f"{answer['content']['name']} ({params.get('requestState')})"
                result = {"resultType": "complete", **_said(text)}
            await _send_json(stream, {"jsonrpc": "2.0", "id": rid, "result": result})
        elif method == "initialize":
            result = {
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {}, "logging": {}},
                "serverInfo": {"name": "wire", "version": "1"},
            }
            await _send_json(stream, {"jsonrpc": "2.0", "id": rid, "result": result})
        elif method == "tools/list":
            result = {"tools": self.tools}
            await _send_json(stream, {"jsonrpc": "2.0", "id": rid, "result": result})
        elif method == "tools/call":
            text = msg["params"]["arguments"]["text"]
            log = {"level": "info", "logger": "wire", "data": text}
            events = [_event({"jsonrpc": "2.0", "method": "notifications/message", "params": log})]
            if self.poll:
                self.parked.append(rid)
                events = [b"id: ev-1\nretry: 200\ndata: \n\n"]
            else:
                events.append(_event({"jsonrpc": "2.0", "id": rid, "result": _said(text)}))
            await _send_sse(stream, events)
        else:
            error = {"code": -32601, "message": "Method not found"}
            await _send_json(stream, {"jsonrpc": "2.0", "id": rid, "error": error})

    async def _get(self, stream: trio.SocketStream, headers: dict[str, str]) -> None:
        self.gets.append(headers)
        if "last-event-id" not in headers or not self.parked:
            await _send(stream, 405, b"")
            return
        rid = self.parked.pop(0)
        answer = {"jsonrpc": "2.0", "id": rid, "result": _said("resumed")}
        await _send_sse(stream, [b"id: ev-2\n" + _event(answer)])


def _said(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}]}


def _event(msg: Any) -> bytes:
    return b"event: message\ndata: " + json.dumps(msg).encode() + b"\n\n"


async def _read_request(stream: trio.SocketStream) -> tuple[str, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some()
        if not chunk:
            raise EOFError("the client closed before a whole request")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        body += await stream.receive_some()
    return lines[0].split(" ")[0], headers, body


async def _send(
    stream: trio.SocketStream, status: int, body: bytes, headers: dict[str, str] | None = None
) -> None:
    head = [f"HTTP/1.1 {status} X", f"content-length: {len(body)}", "connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    await stream.send_all(("\r\n".join(head) + "\r\n\r\n").encode() + body)


async def _send_json(stream: trio.SocketStream, msg: Any) -> None:
    await _send(stream, 200, json.dumps(msg).encode(), {"content-type": "application/json"})


async def _send_sse(stream: trio.SocketStream, events: list[bytes]) -> None:
    head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
    await stream.send_all(head.encode() + b"".join(events))
