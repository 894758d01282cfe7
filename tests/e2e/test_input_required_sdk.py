"""Input requests across the eras, with the SDK on both ends (issue 18): a tool that asks its
client for input (an elicitation, a sampling, or one then the other) through mcpool, in both
directions of era mismatch.

- A 2026-07-28 client (`mcp.Client`) on a handshake-era upstream: the upstream sends
  `elicitation/create` / `sampling/createMessage` in the middle of the call; mcpool answers the
  client's call with an `input_required` result carrying them, keeps the upstream's call open,
  and answers the upstream once the client retries with its inputResponses.
- A 2025-11-25 client on a 2026-07-28 upstream: the upstream answers `input_required`; mcpool
  asks the client with the server-to-client requests and retries the upstream call.

The upstream is tests/e2e/sdk_asking_upstream.py (an SDK 2.x server; `--handshake` keeps it in
the handshake era), so each side is the SDK's own implementation of its era."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import trio
from mcp import Client, StdioServerParameters

from e2e.harness import DaemonFactory, attach_args, write_settings
from e2e.support import text_of
from e2e.test_http import free_port, wait_listening
from e2e.test_http_fence import LISTEN_POLL

ASKING_UPSTREAM = Path(__file__).with_name("sdk_asking_upstream.py")
# Spawn, era probe and discovery of a Python upstream, plus the rounds through the bridge.
WAIT = 30.0

EXPECTED = {
    "ask_name": ("hello Ada", ["elicitation"]),
    "ask_model": ("model says Paris", ["sampling"]),
    "ask_both": ("Ada: Paris", ["elicitation", "sampling"]),
}


class Asked:
    """The client's callbacks, recording what it was asked."""

    def __init__(self) -> None:
        self.kinds: list[str] = []

    async def sampling(
        self, context: Any, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        self.kinds.append("sampling")
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="Paris"), model="fake"
        )

    async def elicitation(
        self, context: Any, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        self.kinds.append("elicitation")
        return types.ElicitResult(action="accept", content={"name": "Ada"})


@asynccontextmanager
async def asking_http_upstream(tmp_path: Path, *args: str) -> AsyncIterator[dict[str, Any]]:
    """The asking upstream over streamable HTTP on a free loopback port: its settings entry."""
    port = free_port()
    log = tmp_path / f"asking-{port}.log"
    with log.open("ab") as out:
        proc = await trio.lowlevel.open_process(
            [sys.executable, str(ASKING_UPSTREAM), *args, "--http", str(port)],
            env=dict(os.environ),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    try:
        await wait_listening(port, proc, log)
        yield {"type": "http", "url": f"http://127.0.0.1:{port}/mcp"}
    finally:
        proc.kill()
        with trio.move_on_after(5):
            await proc.wait()


async def _call_through_mcpool(
    daemon_factory: DaemonFactory,
    *,
    client_mode: str,
    upstream_args: list[str],
    tool: str,
    upstream: dict[str, Any] | None = None,
) -> tuple[str, list[str], str, str]:
    d = await daemon_factory()
    if upstream is None:
        upstream = {"command": sys.executable, "args": [str(ASKING_UPSTREAM), *upstream_args]}
    settings = write_settings(d.root / "s.json", {"up": upstream})
    params = StdioServerParameters(
        command=sys.executable,
        args=attach_args(d.sock, [settings], "asker"),
        env=d.attach_env(),
        cwd=d.root,
    )
    asked = Asked()
    with trio.fail_after(WAIT):
        async with Client(
            params,
            mode=client_mode,  # type: ignore[arg-type]
            sampling_callback=asked.sampling,
            elicitation_callback=asked.elicitation,
        ) as client:
            result = await client.call_tool(f"up__{tool}", {})
            version = client.protocol_version
    assert not result.is_error, result
    # The connection the session is on (a dual-era server's sessions of the handshake era move
    # to one of their own once it is up: issue 29 item 1; the other one closes).
    with trio.fail_after(WAIT):
        while len(active := [s for s in await d.ctl("servers") if s["state"] != "closed"]) > 1:
            await trio.sleep(0.05)
    (server,) = active
    return text_of(result), asked.kinds, version, server["era"]


@pytest.mark.parametrize("tool", sorted(EXPECTED))
async def test_a_2026_client_answers_a_handshake_upstreams_input_requests(
    daemon_factory: DaemonFactory, tool: str
) -> None:
    text, kinds, version, era = await _call_through_mcpool(
        daemon_factory, client_mode="2026-07-28", upstream_args=["--handshake"], tool=tool
    )
    assert (version, era) == ("2026-07-28", "handshake")
    assert (text, kinds) == (EXPECTED[tool][0], EXPECTED[tool][1])


@pytest.mark.parametrize("tool", ["ask_name", "ask_model"])
async def test_a_2026_client_answers_a_handshake_http_upstreams_input_requests(
    daemon_factory: DaemonFactory, tmp_path: Path, tool: str
) -> None:
    # Over HTTP the upstream's request comes on the stream of the call it belongs to (P5).
    async with asking_http_upstream(tmp_path, "--handshake") as upstream:
        text, kinds, version, era = await _call_through_mcpool(
            daemon_factory, client_mode="2026-07-28", upstream_args=[], tool=tool, upstream=upstream
        )
    assert (version, era) == ("2026-07-28", "handshake")
    assert (text, kinds) == (EXPECTED[tool][0], EXPECTED[tool][1])


@pytest.mark.parametrize("tool", ["ask_name", "ask_model"])
async def test_a_2026_client_of_the_http_endpoint_answers_a_handshake_upstream(
    daemon_factory: DaemonFactory, tool: str
) -> None:
    # `mcpool daemon --http`: each 2026-07-28 request is a session of its own; the one holding
    # the call stays until the retry, which its requestState routes to it.
    upstream = {"command": sys.executable, "args": [str(ASKING_UPSTREAM), "--handshake"]}
    d = await daemon_factory({"up": upstream}, start=False)
    port = free_port()
    argv = d.argv()
    d.argv = lambda: [*argv, "--http", f"127.0.0.1:{port}"]  # type: ignore[method-assign]
    await d.start()
    asked = Asked()
    with trio.fail_after(WAIT):
        while True:
            try:
                await (await trio.open_tcp_stream("127.0.0.1", port)).aclose()
                break
            except OSError:
                await trio.sleep(LISTEN_POLL)
        async with Client(
            f"http://127.0.0.1:{port}/mcp",
            mode="2026-07-28",
            sampling_callback=asked.sampling,
            elicitation_callback=asked.elicitation,
        ) as client:
            result = await client.call_tool(f"up__{tool}", {})
    assert not result.is_error, result
    assert (text_of(result), asked.kinds) == (EXPECTED[tool][0], EXPECTED[tool][1])
    (server,) = await d.ctl("servers")
    assert server["era"] == "handshake"


@pytest.mark.parametrize("tool", sorted(EXPECTED))
async def test_a_2025_client_answers_a_2026_upstreams_input_required(
    daemon_factory: DaemonFactory, tool: str
) -> None:
    # Pinned modern: a server that speaks both eras would give the 2025 session a handshake
    # connection of its own (issue 29 item 1), and mcpool's translation is what is tested.
    upstream = {
        "command": sys.executable,
        "args": [str(ASKING_UPSTREAM)],
        "protocolVersion": "2026-07-28",
    }
    text, kinds, version, era = await _call_through_mcpool(
        daemon_factory, client_mode="legacy", upstream_args=[], tool=tool, upstream=upstream
    )
    assert (version, era) == ("2025-11-25", "modern")
    assert (text, kinds) == (EXPECTED[tool][0], EXPECTED[tool][1])


ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
}
POLL = 0.05  # how often the test reads the daemon's view of the upstream's open calls


async def test_the_state_is_checked_and_a_client_that_leaves_cancels_the_held_call(
    daemon_factory: DaemonFactory,
) -> None:
    """On the wire (the daemon's socket): a tampered requestState is -32602 and the call still
    waits; the right one carries it on; a client that leaves mid-round ends the upstream's call."""
    upstream = {"command": sys.executable, "args": [str(ASKING_UPSTREAM), "--handshake"]}
    d = await daemon_factory({"up": upstream})
    call = {"name": "up__ask_name", "arguments": {}, "_meta": ENVELOPE}
    async with d.raw() as raw:
        raw.receive_timeout = WAIT
        first = await raw.request("tools/call", call)
        result = first["result"]
        assert result["resultType"] == "input_required", first
        ((key, ask),) = result["inputRequests"].items()
        assert ask["method"] == "elicitation/create"
        answers = {key: {"action": "accept", "content": {"name": "Ada"}}}
        forged = await raw.request(
            "tools/call",
            {**call, "inputResponses": answers, "requestState": result["requestState"] + "x"},
        )
        assert forged["error"]["code"] == -32602
        assert forged["error"]["data"]["requestState"] == "unknown"
        done = await raw.request(
            "tools/call",
            {**call, "inputResponses": answers, "requestState": result["requestState"]},
        )
        assert done["result"]["content"][0]["text"] == "hello Ada"
        assert done["result"]["resultType"] == "complete"
        # Another call, left in the middle of its round.
        again = await raw.request("tools/call", call)
        assert again["result"]["resultType"] == "input_required"
        (server,) = await d.ctl("servers")
        assert server["in_flight"] == 1  # the upstream's call is held open
    with trio.fail_after(WAIT):
        while (await d.ctl("servers"))[0]["in_flight"]:
            await trio.sleep(POLL)
