"""An upstream that asks its client for input during a tool call: a small `mcp` SDK 2.x server.

Its tools take a parameter filled by a resolver (`Resolve`): the SDK asks the client with an
`elicitation/create` or a `sampling/createMessage` in the era the connection speaks: a
server-to-client request in the middle of the call on a handshake-era connection, an
`input_required` result answered by the client's retry on a 2026-07-28 one.

`--handshake` makes it a handshake-era server: it never opens the modern era (the SDK decides a
connection's era from its first request; here no request opens it; over HTTP a request naming a
modern protocol version gets a JSON-RPC error), so mcpool's `server/discover` probe fails and it
speaks `initialize`. `--http PORT`: streamable HTTP on 127.0.0.1:PORT/mcp instead of stdio.

Tools: `ask_name` (elicits a name), `ask_model` (samples the client's model), `ask_both` (elicits
a name, then samples the model about it: two rounds).
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import mcp_types as types
from mcp.server import runner, streamable_http_manager
from mcp.server.mcpserver import Elicit, MCPServer, Resolve, Sample
from pydantic import BaseModel

server = MCPServer("sdk-asking", instructions="asks its client for input")


class Name(BaseModel):
    name: str


def want_name() -> Elicit[Name]:
    return Elicit("your name?", Name)


def want_answer() -> Sample:
    question = types.TextContent(type="text", text="what is the capital of France?")
    return Sample([types.SamplingMessage(role="user", content=question)], max_tokens=20)


def want_greeting(name: Annotated[Name, Resolve(want_name)]) -> Sample:
    text = types.TextContent(type="text", text=f"greet {name.name}")
    return Sample([types.SamplingMessage(role="user", content=text)], max_tokens=20)


def _text(result: types.CreateMessageResult) -> str:
    content = result.content
    return content.text if isinstance(content, types.TextContent) else repr(content)


@server.tool()
def ask_name(name: Annotated[Name, Resolve(want_name)]) -> str:
    """Elicit the user's name."""
    return f"hello {name.name}"


@server.tool()
def ask_model(answer: Annotated[types.CreateMessageResult, Resolve(want_answer)]) -> str:
    """Sample the client's model."""
    return f"model says {_text(answer)}"


@server.tool()
def ask_both(
    name: Annotated[Name, Resolve(want_name)],
    greeting: Annotated[types.CreateMessageResult, Resolve(want_greeting)],
) -> str:
    """Elicit a name, then sample the model about it."""
    return f"{name.name}: {_text(greeting)}"


async def _no_modern_era(app: Any, security: Any, json_response: Any, *args: Any) -> None:
    """Stands in for the SDK's modern HTTP entry: every modern request is refused."""
    _scope, _receive, send = args[-3:]
    body = json.dumps(
        {"jsonrpc": "2.0", "id": None, "error": {"code": -32601, "message": "handshake only"}}
    ).encode()
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body})


if __name__ == "__main__":
    if "--handshake" in sys.argv:
        runner._has_modern_envelope = lambda params: False  # type: ignore[attr-defined]
        streamable_http_manager.handle_modern_request = _no_modern_era  # type: ignore[assignment]
    if "--http" in sys.argv:
        port = int(sys.argv[sys.argv.index("--http") + 1])
        server.run("streamable-http", host="127.0.0.1", port=port)
    else:
        server.run("stdio")
