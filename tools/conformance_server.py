"""mcpool's own reference server for the MCP conformance suite's server scenarios.

The suite (`conformance server --url`) calls a fixed set of tools, resources and prompts
(`test_simple_text`, `test://static-text`, `test_simple_prompt`, ...) and checks the answers. The
servers it ships with are TypeScript; this one is ours, written on the `mcp` SDK's low-level
`Server`, which serves both eras on one endpoint: a handshake-era client (`initialize`, 2025-06-18
or 2025-11-25) gets server-to-client requests for sampling and elicitation mid-call, a 2026-07-28
client gets them as `input_required` results and retries with the answers.

It gives tools/conformance.sh a direct baseline where the checks pass, so that the same scenarios
run through `mcpool daemon --http` show what mcpool changes.

    python tools/conformance_server.py stdio
    python tools/conformance_server.py http PORT      (127.0.0.1 only, path /mcp)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import struct
import sys
import warnings
import zlib
from typing import Any, Literal

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http import EventStore
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

Ctx = ServerRequestContext[Any, Any]
LOGGER = "conformance-server"


def _png() -> str:
    """A 1x1 red PNG, built here rather than pasted in."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    raw = b"\x00\xff\x00\x00"  # filter byte, then one RGB pixel
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    return base64.b64encode(png).decode()


def _wav() -> str:
    """A tenth of a second of 8 kHz 8-bit silence."""
    samples = b"\x80" * 800
    header = b"RIFF" + struct.pack("<I", 36 + len(samples)) + b"WAVEfmt "
    header += struct.pack("<IHHIIHH", 16, 1, 1, 8000, 8000, 1, 8) + b"data"
    return base64.b64encode(header + struct.pack("<I", len(samples)) + samples).decode()


PNG = _png()
WAV = _wav()
EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


def text(value: str) -> types.TextContent:
    return types.TextContent(type="text", text=value)


# ---------------------------------------------------------------- 2026-07-28 input_required tools
# Each asks the client for input with an `input_required` result and answers once the client
# retries with `inputResponses` (and `requestState` where it set one). A handshake-era client
# never sees them in tools/list: they exist only where that revision exists.

STATE_KEY = secrets.token_bytes(32)  # signs requestState; a fresh key per process is enough


def seal(state: dict[str, Any]) -> str:
    body = base64.urlsafe_b64encode(json.dumps(state).encode()).decode()
    mac = hmac.new(STATE_KEY, body.encode(), hashlib.sha256).hexdigest()
    return f"{body}.{mac}"


def unseal(token: str | None) -> dict[str, Any] | None:
    """The state this server sealed, or None for a missing or altered one."""
    if not token or "." not in token:
        return None
    body, mac = token.rsplit(".", 1)
    if not hmac.compare_digest(mac, hmac.new(STATE_KEY, body.encode(), hashlib.sha256).hexdigest()):
        return None
    try:
        state = json.loads(base64.urlsafe_b64decode(body))
    except ValueError:
        return None
    return state if isinstance(state, dict) else None


def form(message: str, field: str, kind: str = "string") -> types.ElicitRequest:
    schema = {"type": "object", "properties": {field: {"type": kind}}, "required": [field]}
    return types.ElicitRequest(
        method="elicitation/create",
        params=types.ElicitRequestFormParams(message=message, requested_schema=schema),
    )


def sample(prompt: str, max_tokens: int) -> types.CreateMessageRequest:
    return types.CreateMessageRequest(
        method="sampling/createMessage",
        params=types.CreateMessageRequestParams(
            messages=[types.SamplingMessage(role="user", content=text(prompt))],
            max_tokens=max_tokens,
        ),
    )


ROOTS = types.ListRootsRequest(method="roots/list")


def answer(responses: types.InputResponses | None, key: str) -> Any:
    return (responses or {}).get(key)


def field(response: Any, name: str) -> str:
    content = getattr(response, "content", None) or {}
    return str(content.get(name, "")) if isinstance(content, dict) else ""


def sampled_text(response: Any) -> str:
    content = getattr(response, "content", None)
    return content.text if isinstance(content, types.TextContent) else "no response"


def done(value: str) -> types.CallToolResult:
    return types.CallToolResult(content=[text(value)])


def ask(requests: dict[str, Any], state: dict[str, Any] | None = None) -> types.InputRequiredResult:
    return types.InputRequiredResult(
        input_requests=requests, request_state=seal(state) if state is not None else None
    )


Params = types.CallToolRequestParams
Answer = types.CallToolResult | types.InputRequiredResult


async def mrtr_elicitation(ctx: Ctx, params: Params) -> Answer:
    got = answer(params.input_responses, "user_name")
    if got is not None:
        return done(f"Hello, {field(got, 'name')}!")
    return ask({"user_name": form("What is your name?", "name")})


async def mrtr_sampling(ctx: Ctx, params: Params) -> Answer:
    got = answer(params.input_responses, "sample_request")
    if got is not None:
        return done(f"Sampling result: {sampled_text(got)}")
    return ask({"sample_request": sample("What is the capital of France?", 100)})


async def mrtr_list_roots(ctx: Ctx, params: Params) -> Answer:
    got = answer(params.input_responses, "roots_request")
    if got is not None:
        return done(f"Found {len(getattr(got, 'roots', []) or [])} root(s)")
    return ask({"roots_request": ROOTS})


async def mrtr_request_state(ctx: Ctx, params: Params) -> Answer:
    state = unseal(params.request_state)
    got = answer(params.input_responses, "confirm")
    confirmed = got is not None and (getattr(got, "content", None) or {}).get("ok") is True
    if state is not None and state.get("kind") == "request-state" and confirmed:
        return done("state-ok: requestState validated")
    return ask({"confirm": form("Please confirm", "ok", "boolean")}, {"kind": "request-state"})


async def mrtr_multiple(ctx: Ctx, params: Params) -> Answer:
    state = unseal(params.request_state)
    got = params.input_responses or {}
    if (
        state is not None
        and state.get("kind") == "multiple-inputs"
        and {"user_name", "greeting", "client_roots"} <= set(got)
    ):
        roots = getattr(got["client_roots"], "roots", []) or []
        return done(
            f"Name: {field(got['user_name'], 'name')}; Greeting: {sampled_text(got['greeting'])}; "
            f"Roots: {len(roots)}"
        )
    return ask(
        {
            "user_name": form("What is your name?", "name"),
            "greeting": sample("Generate a greeting", 50),
            "client_roots": ROOTS,
        },
        {"kind": "multiple-inputs"},
    )


async def mrtr_multi_round(ctx: Ctx, params: Params) -> Answer:
    state = unseal(params.request_state) or {}
    got = params.input_responses or {}
    if state.get("round") == 1 and "step1" in got:
        return ask(
            {"step2": form("Step 2: What is your favorite color?", "color")},
            {"round": 2, "name": field(got["step1"], "name")},
        )
    if state.get("round") == 2 and "step2" in got:
        return done(
            f"Multi-round complete for {state.get('name')} who likes {field(got['step2'], 'color')}"
        )
    return ask({"step1": form("Step 1: What is your name?", "name")}, {"round": 1})


async def mrtr_tampered(ctx: Ctx, params: Params) -> Answer:
    if params.request_state is not None:
        state = unseal(params.request_state)
        if state is None:
            raise MCPError(types.INVALID_PARAMS, "requestState integrity check failed")
        if (
            state.get("kind") == "tamper-test"
            and answer(params.input_responses, "confirm") is not None
        ):
            return done("integrity-ok: state verified")
    return ask({"confirm": form("Please confirm", "ok", "boolean")}, {"kind": "tamper-test"})


async def mrtr_capabilities(ctx: Ctx, params: Params) -> Answer:
    caps = ctx.session.client_capabilities
    requests: dict[str, Any] = {}
    if caps is not None and caps.elicitation is not None:
        requests["elicit_input"] = form("Elicitation input", "value")
    if caps is not None and caps.sampling is not None:
        requests["sample_input"] = sample("Sample request", 50)
    if params.input_responses:
        return done(f"capabilities-ok: received {','.join(params.input_responses)}")
    if not requests:
        return done("No supported capabilities declared")
    return ask(requests, {"kind": "capabilities-test"})


async def missing_capability(ctx: Ctx, params: Params) -> Answer:
    caps = ctx.session.client_capabilities
    if caps is None or caps.sampling is None:
        raise MCPError(
            -32021,
            "Missing required client capability: sampling",
            {"requiredCapabilities": {"sampling": {}}},
        )
    return done("Success")


async def streaming(ctx: Ctx, params: Params) -> Answer:
    return done("Streaming complete")


async def logging_tool(ctx: Ctx, params: Params) -> Answer:
    # The SDK drops a log message of a 2026-07-28 request that carries no logLevel.
    await ctx.session.send_log_message(
        level="info",
        data="Diagnostic trace logging activated",
        logger=LOGGER,
        related_request_id=ctx.request_id,
    )
    return done("Logging evaluated")


BUS = InMemorySubscriptionBus()  # feeds subscriptions/listen streams (2026-07-28)


# The trigger tools change a list for real (a tool or a prompt comes or goes), so that a proxy
# that announces only actual changes has one to announce.
TOGGLED = {"tool": False, "prompt": False}


async def trigger_tools(ctx: Ctx, params: Params) -> Answer:
    TOGGLED["tool"] = not TOGGLED["tool"]
    await BUS.publish(ToolsListChanged())
    return done("Mutation triggered")


async def trigger_prompts(ctx: Ctx, params: Params) -> Answer:
    TOGGLED["prompt"] = not TOGGLED["prompt"]
    await BUS.publish(PromptsListChanged())
    return done("Mutation triggered")


MRTR_TOOLS = {
    "test_trigger_tool_change": trigger_tools,
    "test_trigger_prompt_change": trigger_prompts,
    "test_input_required_result_elicitation": mrtr_elicitation,
    "test_input_required_result_sampling": mrtr_sampling,
    "test_input_required_result_list_roots": mrtr_list_roots,
    "test_input_required_result_request_state": mrtr_request_state,
    "test_input_required_result_multiple_inputs": mrtr_multiple,
    "test_input_required_result_multi_round": mrtr_multi_round,
    "test_input_required_result_tampered_state": mrtr_tampered,
    "test_input_required_result_capabilities": mrtr_capabilities,
    "test_missing_capability": missing_capability,
    "test_streaming_elicitation": streaming,
    "test_logging_tool": logging_tool,
}
MODERN = "2026-07-28"
# A tool whose `region` argument travels in an `Mcp-Param-Region` header too (SEP-2243).
HEADER_TOOL = types.Tool(
    name="test_header_echo",
    description="Echoes its region argument, which also travels as a header",
    input_schema={
        "type": "object",
        "properties": {"region": {"type": "string", "x-mcp-header": "Region"}},
        "required": ["region"],
    },
)

# ---------------------------------------------------------------- tools

TOOLS: list[dict[str, Any]] = [
    {"name": "test_simple_text", "description": "Returns one text block"},
    {"name": "test_image_content", "description": "Returns one image block"},
    {"name": "test_audio_content", "description": "Returns one audio block"},
    {"name": "test_embedded_resource", "description": "Returns an embedded resource"},
    {"name": "test_multiple_content_types", "description": "Returns text, image and a resource"},
    {"name": "test_tool_with_logging", "description": "Logs three messages while it runs"},
    {"name": "test_tool_with_progress", "description": "Reports progress 0, 50, 100"},
    {"name": "test_error_handling", "description": "Always fails with isError"},
    {"name": "test_reconnection", "description": "Closes its response stream, answers later"},
    {
        "name": "test_sampling",
        "description": "Asks the client's model for a completion",
        "inputSchema": {
            "type": "object",
            "properties": {"prompt": {"type": "string", "description": "The prompt"}},
            "required": ["prompt"],
        },
    },
    {
        "name": "test_elicitation",
        "description": "Asks the user for a response",
        "inputSchema": {
            "type": "object",
            "properties": {"message": {"type": "string", "description": "What to ask"}},
            "required": ["message"],
        },
    },
    {"name": "test_elicitation_sep1034_defaults", "description": "Elicits a form with defaults"},
    {"name": "test_elicitation_sep1330_enums", "description": "Elicits the five enum forms"},
    {
        "name": "json_schema_2020_12_tool",
        "description": "Carries JSON Schema 2020-12 keywords in its input schema",
        "inputSchema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {
                "address": {
                    "$anchor": "addressDef",
                    "type": "object",
                    "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                }
            },
            "properties": {
                "name": {"type": "string"},
                "address": {"$ref": "#/$defs/address"},
                "contactMethod": {"type": "string", "enum": ["phone", "email"]},
                "phone": {"type": "string"},
                "email": {"type": "string"},
            },
            "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
            "if": {
                "properties": {"contactMethod": {"const": "phone"}},
                "required": ["contactMethod"],
            },
            "then": {"required": ["phone"]},
            "else": {"required": ["email"]},
            "additionalProperties": False,
        },
    },
]


def tool_list(modern: bool) -> list[types.Tool]:
    listed = [
        types.Tool(
            name=t["name"],
            description=t["description"],
            input_schema=t.get("inputSchema", EMPTY_SCHEMA),
        )
        for t in TOOLS
    ]
    if modern:
        listed += [
            types.Tool(
                name=name, description=f"2026-07-28 diagnostic: {name}", input_schema=EMPTY_SCHEMA
            )
            for name in MRTR_TOOLS
        ]
        listed.append(HEADER_TOOL)
    if TOGGLED["tool"]:
        listed.append(
            types.Tool(
                name="test_toggled_tool",
                description="Listed while toggled on",
                input_schema=EMPTY_SCHEMA,
            )
        )
    return listed


async def list_tools(
    ctx: Ctx, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=tool_list(ctx.protocol_version >= MODERN))


SEP1034_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "User name", "default": "John Doe"},
        "age": {"type": "integer", "description": "User age", "default": 30},
        "score": {"type": "number", "description": "User score", "default": 95.5},
        "status": {
            "type": "string",
            "description": "User status",
            "enum": ["active", "inactive", "pending"],
            "default": "active",
        },
        "verified": {"type": "boolean", "description": "Verified", "default": True},
    },
    "required": [],
}

SEP1330_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "untitledSingle": {
            "type": "string",
            "description": "Pick one",
            "enum": ["option1", "option2", "option3"],
        },
        "titledSingle": {
            "type": "string",
            "description": "Pick one (titled)",
            "oneOf": [
                {"const": "value1", "title": "First"},
                {"const": "value2", "title": "Second"},
                {"const": "value3", "title": "Third"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "description": "Pick one (legacy titles)",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["One", "Two", "Three"],
        },
        "untitledMulti": {
            "type": "array",
            "description": "Pick some",
            "minItems": 1,
            "maxItems": 3,
            "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
        },
        "titledMulti": {
            "type": "array",
            "description": "Pick some (titled)",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First"},
                    {"const": "value2", "title": "Second"},
                    {"const": "value3", "title": "Third"},
                ]
            },
        },
    },
    "required": [],
}

RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"response": {"type": "string", "description": "Your response"}},
    "required": ["response"],
}


# The handshake-era scenarios' sampling and elicitation tools work in both eras, as a real
# dual-era server's would: a request mid-call before 2026-07-28, an `input_required` result at it.
# So a client that reaches this server through a proxy speaking 2026-07-28 to it still gets asked.
ASKED = "ask"  # the inputRequests key of those tools


async def elicit(ctx: Ctx, params: Params, message: str, schema: dict[str, Any]) -> Answer:
    if ctx.protocol_version >= MODERN:
        result = answer(params.input_responses, ASKED)
        if not isinstance(result, types.ElicitResult):
            request = types.ElicitRequest(
                method="elicitation/create",
                params=types.ElicitRequestFormParams(message=message, requested_schema=schema),
            )
            return ask({ASKED: request})
    else:
        try:
            result = await ctx.session.elicit_form(
                message=message, requested_schema=schema, related_request_id=ctx.request_id
            )
        except MCPError as e:
            return done(f"Elicitation not supported or error: {e}")
    content = json.dumps(result.content or {})
    return done(f"Elicitation completed: action={result.action}, content={content}")


async def sampling(ctx: Ctx, params: Params, prompt: str) -> Answer:
    if ctx.protocol_version >= MODERN:
        got = answer(params.input_responses, ASKED)
        if got is None:
            return ask({ASKED: sample(prompt, 100)})
        return done(f"LLM response: {sampled_text(got)}")
    try:
        sampled = await ctx.session.create_message(
            messages=[types.SamplingMessage(role="user", content=text(prompt))],
            max_tokens=100,
            related_request_id=ctx.request_id,
        )
    except MCPError as e:
        return done(f"Sampling not supported or error: {e}")
    return done(f"LLM response: {sampled_text(sampled)}")


async def call_tool(
    ctx: Ctx, params: types.CallToolRequestParams
) -> types.CallToolResult | types.InputRequiredResult:
    args = params.arguments or {}
    name = params.name
    if name == "test_simple_text":
        return types.CallToolResult(content=[text("This is a simple text response for testing.")])
    if name == "test_image_content":
        return types.CallToolResult(
            content=[types.ImageContent(type="image", data=PNG, mime_type="image/png")]
        )
    if name == "test_audio_content":
        return types.CallToolResult(
            content=[types.AudioContent(type="audio", data=WAV, mime_type="audio/wav")]
        )
    if name == "test_embedded_resource":
        resource = types.TextResourceContents(
            uri="test://embedded-resource",
            mime_type="text/plain",
            text="This is an embedded resource.",
        )
        return types.CallToolResult(
            content=[types.EmbeddedResource(type="resource", resource=resource)]
        )
    if name == "test_multiple_content_types":
        resource = types.TextResourceContents(
            uri="test://mixed-content-resource",
            mime_type="application/json",
            text=json.dumps({"test": "data", "value": 123}),
        )
        return types.CallToolResult(
            content=[
                text("Multiple content types test:"),
                types.ImageContent(type="image", data=PNG, mime_type="image/png"),
                types.EmbeddedResource(type="resource", resource=resource),
            ]
        )
    if name == "test_tool_with_logging":
        for message in (
            "Tool execution started",
            "Tool processing data",
            "Tool execution completed",
        ):
            await ctx.session.send_log_message(
                level="info", data=message, logger=LOGGER, related_request_id=ctx.request_id
            )
            await anyio.sleep(0.05)
        return types.CallToolResult(content=[text("Tool with logging executed successfully")])
    if name == "test_tool_with_progress":
        meta: dict[str, Any] = dict(ctx.meta or {})
        token = meta.get("progress_token", meta.get("progressToken"))
        for step in (0, 50, 100):
            if token is not None:
                await ctx.session.send_progress_notification(
                    token,
                    step,
                    100,
                    f"Completed step {step} of 100",
                    related_request_id=str(ctx.request_id),
                )
            await anyio.sleep(0.05)
        return types.CallToolResult(content=[text(str(token))])
    if name == "test_error_handling":
        return types.CallToolResult(
            content=[text("This tool intentionally returns an error for testing")], is_error=True
        )
    if name == "test_reconnection":
        if ctx.close_sse_stream is not None:
            await ctx.close_sse_stream()
        await anyio.sleep(0.1)
        return types.CallToolResult(content=[text("Reconnection test completed successfully.")])
    if name == "test_sampling":
        return await sampling(ctx, params, str(args.get("prompt", "")))
    if name == "test_elicitation":
        return await elicit(ctx, params, str(args.get("message", "")), RESPONSE_SCHEMA)
    if name == "test_elicitation_sep1034_defaults":
        message = "Please review and update the form fields with defaults"
        return await elicit(ctx, params, message, SEP1034_SCHEMA)
    if name == "test_elicitation_sep1330_enums":
        return await elicit(
            ctx, params, "Please select options from the enum fields", SEP1330_SCHEMA
        )
    if name in MRTR_TOOLS:
        return await MRTR_TOOLS[name](ctx, params)
    if name == "test_header_echo":
        return types.CallToolResult(content=[text(f"region={args.get('region')}")])
    if name == "json_schema_2020_12_tool":
        return types.CallToolResult(content=[text(f"called with: {json.dumps(args)}")])
    raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {name}")


# ---------------------------------------------------------------- resources

RESOURCES = [
    types.Resource(
        uri="test://static-text",
        name="static-text",
        title="Static Text Resource",
        description="A static text resource",
        mime_type="text/plain",
    ),
    types.Resource(
        uri="test://static-binary",
        name="static-binary",
        title="Static Binary Resource",
        description="A static binary resource (a PNG)",
        mime_type="image/png",
    ),
    types.Resource(
        uri="test://watched-resource",
        name="watched-resource",
        title="Watched Resource",
        description="A resource to subscribe to",
        mime_type="text/plain",
    ),
]
TEMPLATE = "test://template/{id}/data"


async def list_resources(
    ctx: Ctx, params: types.PaginatedRequestParams | None
) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=RESOURCES)


async def list_templates(
    ctx: Ctx, params: types.PaginatedRequestParams | None
) -> types.ListResourceTemplatesResult:
    template = types.ResourceTemplate(
        uri_template=TEMPLATE,
        name="template",
        title="Resource Template",
        description="A template with one parameter",
        mime_type="application/json",
    )
    return types.ListResourceTemplatesResult(resource_templates=[template])


async def read_resource(
    ctx: Ctx, params: types.ReadResourceRequestParams
) -> types.ReadResourceResult:
    uri = str(params.uri)
    contents: list[types.TextResourceContents | types.BlobResourceContents]
    if uri == "test://static-text":
        contents = [
            types.TextResourceContents(
                uri=uri,
                mime_type="text/plain",
                text="This is the content of the static text resource.",
            )
        ]
    elif uri == "test://static-binary":
        contents = [types.BlobResourceContents(uri=uri, mime_type="image/png", blob=PNG)]
    elif uri == "test://watched-resource":
        contents = [types.TextResourceContents(uri=uri, mime_type="text/plain", text="watched")]
    elif uri.startswith("test://template/") and uri.endswith("/data"):
        ident = uri.removeprefix("test://template/").removesuffix("/data")
        body = json.dumps({"id": ident, "templateTest": True, "data": f"Data for ID: {ident}"})
        contents = [types.TextResourceContents(uri=uri, mime_type="application/json", text=body)]
    else:
        raise MCPError(types.INVALID_PARAMS, f"Resource not found: {uri}", {"uri": uri})
    return types.ReadResourceResult(contents=contents)


async def subscribe(ctx: Ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
    return types.EmptyResult()


async def unsubscribe(ctx: Ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    return types.EmptyResult()


# ---------------------------------------------------------------- prompts

PROMPTS = [
    types.Prompt(name="test_simple_prompt", title="Simple Test Prompt", description="No arguments"),
    types.Prompt(
        name="test_prompt_with_arguments",
        title="Prompt With Arguments",
        description="Two required arguments",
        arguments=[
            types.PromptArgument(name="arg1", description="First argument", required=True),
            types.PromptArgument(name="arg2", description="Second argument", required=True),
        ],
    ),
    types.Prompt(
        name="test_prompt_with_embedded_resource",
        title="Prompt With Embedded Resource",
        description="Embeds the resource named by its argument",
        arguments=[
            types.PromptArgument(name="resourceUri", description="URI to embed", required=True)
        ],
    ),
    types.Prompt(name="test_prompt_with_image", title="Prompt With Image", description="An image"),
]


MRTR_PROMPT = types.Prompt(
    name="test_input_required_result_prompt",
    description="Asks for context with input_required (2026-07-28)",
)


async def list_prompts(
    ctx: Ctx, params: types.PaginatedRequestParams | None
) -> types.ListPromptsResult:
    listed = PROMPTS + ([MRTR_PROMPT] if ctx.protocol_version >= MODERN else [])
    if TOGGLED["prompt"]:
        listed = [*listed, types.Prompt(name="test_toggled_prompt", description="Listed while on")]
    return types.ListPromptsResult(prompts=listed)


async def get_prompt(
    ctx: Ctx, params: types.GetPromptRequestParams
) -> types.GetPromptResult | types.InputRequiredResult:
    args = params.arguments or {}
    user: Literal["user"] = "user"
    if params.name == MRTR_PROMPT.name and ctx.protocol_version >= MODERN:
        got = answer(params.input_responses, "user_context")
        if got is None:
            return ask({"user_context": form("What context should the prompt use?", "context")})
        messages = [
            types.PromptMessage(
                role=user, content=text(f"Prompt with context: {field(got, 'context')}")
            )
        ]
    elif params.name == "test_simple_prompt":
        messages = [
            types.PromptMessage(role=user, content=text("This is a simple prompt for testing."))
        ]
    elif params.name == "test_prompt_with_arguments":
        body = f"Prompt with arguments: arg1='{args.get('arg1')}', arg2='{args.get('arg2')}'"
        messages = [types.PromptMessage(role=user, content=text(body))]
    elif params.name == "test_prompt_with_embedded_resource":
        resource = types.TextResourceContents(
            uri=args.get("resourceUri", "test://example"),
            mime_type="text/plain",
            text="Embedded content.",
        )
        messages = [
            types.PromptMessage(
                role=user, content=types.EmbeddedResource(type="resource", resource=resource)
            ),
            types.PromptMessage(
                role=user, content=text("Please process the embedded resource above.")
            ),
        ]
    elif params.name == "test_prompt_with_image":
        messages = [
            types.PromptMessage(
                role=user, content=types.ImageContent(type="image", data=PNG, mime_type="image/png")
            ),
            types.PromptMessage(role=user, content=text("Please analyze the image above.")),
        ]
    else:
        raise MCPError(types.INVALID_PARAMS, f"Unknown prompt: {params.name}")
    return types.GetPromptResult(messages=messages)


# ---------------------------------------------------------------- the rest


async def complete(ctx: Ctx, params: types.CompleteRequestParams) -> types.CompleteResult:
    return types.CompleteResult(completion=types.Completion(values=[], total=0, has_more=False))


async def set_level(ctx: Ctx, params: types.SetLevelRequestParams) -> types.EmptyResult:
    return types.EmptyResult()


def build() -> Server[Any]:
    # logging/setLevel is deprecated at 2026-07-28 but still part of the handshake-era scenarios.
    warnings.filterwarnings("ignore", category=MCPDeprecationWarning)
    return Server(
        "mcpool-conformance-server",
        version="1.0.0",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
        on_subscribe_resource=subscribe,
        on_unsubscribe_resource=unsubscribe,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
        on_completion=complete,
        on_set_logging_level=set_level,
        on_subscriptions_listen=ListenHandler(BUS),
    )


class MemoryEventStore(EventStore):
    """Keeps every event so a client can resume a closed stream (SEP-1699 polling)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []

    async def store_event(self, stream_id: str, message: Any) -> str:
        event_id = secrets.token_hex(8)
        self.events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: Any) -> str | None:
        found = [i for i, e in enumerate(self.events) if e[0] == last_event_id]
        if not found:
            return None
        stream = self.events[found[0]][1]
        for event_id, stream_id, message in self.events[found[0] + 1 :]:
            if stream_id == stream and message is not None:
                await send_callback(type("Event", (), {"event_id": event_id, "message": message})())
        return stream


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] == "stdio":
        from mcp.server.stdio import stdio_server

        async def serve() -> None:
            server = build()
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())

        anyio.run(serve)
        return
    if len(sys.argv) == 3 and sys.argv[1] == "http":
        import uvicorn

        app = build().streamable_http_app(event_store=MemoryEventStore(), retry_interval=100)
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
        return
    sys.exit(__doc__)


if __name__ == "__main__":
    main()
