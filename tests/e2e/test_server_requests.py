"""Issue 6 end to end: server-to-client requests and shared upstream state (P5, P6).

Real daemon, real bridges, real SDK clients; server-everything and server-filesystem as the
third-party upstreams, the fake upstream where we must count what reached it.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import trio
from mcp import ClientSession, MCPDeprecationWarning, StdioServerParameters, stdio_client

from e2e.harness import DaemonProcess, attach_args, fake_server, write_settings
from e2e.support import wait_until

WAIT = 20.0


class Callbacks:
    """A client's answers to server-to-client requests, recording each call."""

    def __init__(self, name: str, roots: list[str] | None = None) -> None:
        self.name = name
        self.sampled: list[types.CreateMessageRequestParams] = []
        self.elicited: list[types.ElicitRequestParams] = []
        self.roots = roots or []
        self.logs: list[types.LoggingMessageNotificationParams] = []
        self.updates: list[str] = []

    async def sampling(self, context: Any, params: types.CreateMessageRequestParams) -> Any:
        self.sampled.append(params)
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=f"sampled by {self.name}"),
            model="test-model",
        )

    async def elicitation(self, context: Any, params: types.ElicitRequestParams) -> Any:
        self.elicited.append(params)
        return types.ElicitResult(action="decline")

    async def list_roots(self, context: Any) -> Any:
        return types.ListRootsResult(
            roots=[types.Root(uri=f"file://{r}", name=os.path.basename(r)) for r in self.roots]
        )

    async def logging(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(params)

    async def messages(self, message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            self.updates.append(str(message.params.uri))


@asynccontextmanager
async def client(d: DaemonProcess, settings: Path, cb: Callbacks) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=attach_args(d.sock, [settings], cb.name),
        env=d.attach_env(),
        cwd=d.root,
    )
    async with (
        stdio_client(params) as (read, write),
        ClientSession(
            read,
            write,
            sampling_callback=cb.sampling,
            elicitation_callback=cb.elicitation,
            list_roots_callback=cb.list_roots,
            logging_callback=cb.logging,
            message_handler=cb.messages,
        ) as session,
    ):
        with trio.fail_after(WAIT):
            await session.initialize()
        yield session


async def subscribe(session: ClientSession, uri: str, *, on: bool = True) -> None:
    """Handshake-era resources/(un)subscribe, which the SDK flags as removed in 2026-07-28."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        if on:
            await session.subscribe_resource(uri)
        else:
            await session.unsubscribe_resource(uri)


def everything(peers: dict[str, str]) -> dict[str, Any]:
    return {"command": "node", "args": [peers["PEER_EVERYTHING_JS"], "stdio"]}


def text(result: types.CallToolResult) -> str:
    return " ".join(b.text for b in result.content if isinstance(b, types.TextContent))


async def test_sampling_and_elicitation_reach_the_calling_session_only(daemon_factory, peers):
    d = await daemon_factory()
    settings = write_settings(d.root / "e.json", {"everything": everything(peers)})
    a, b = Callbacks("a"), Callbacks("b")
    async with client(d, settings, a) as sa, client(d, settings, b):
        with trio.fail_after(WAIT):
            result = await sa.call_tool(
                "everything__trigger-sampling-request", {"prompt": "hi", "maxTokens": 10}
            )
        assert "sampled by a" in text(result), result
        assert len(a.sampled) == 1
        assert b.sampled == []
        with trio.fail_after(WAIT):
            result = await sa.call_tool("everything__trigger-elicitation-request", {})
        assert len(a.elicited) == 1
        assert b.elicited == []
        servers = await d.ctl("servers")
        assert len(servers) == 1  # one shared upstream served both sessions


async def test_a_request_several_sessions_may_own_waits_for_its_owner_then_calls_go_in_turn(
    daemon_factory, peers
):
    """Issue 29 item 3: never refused for want of an owner, never guessed (X8)."""
    d = await daemon_factory()
    settings = write_settings(d.root / "e.json", {"everything": everything(peers)})
    a, b = Callbacks("a"), Callbacks("b")
    long_op = ("everything__trigger-long-running-operation", {"duration": 2, "steps": 2})
    sample = ("everything__trigger-sampling-request", {"prompt": "hi", "maxTokens": 5})
    async with client(d, settings, a) as sa, client(d, settings, b) as sb:
        async with trio.open_nursery() as nursery:
            # Session a keeps a request in flight on the shared upstream...
            nursery.start_soon(sa.call_tool, *long_op)
            with trio.fail_after(WAIT):
                await wait_until(lambda: _in_flight(d, 1))
                # ...so b's sampling request has two candidate owners: it waits until a's
                # call is over, then it is b's.
                result = await sb.call_tool(*sample)
        assert not result.is_error, result
        assert "sampled by b" in text(result), result
        assert a.sampled == [] and len(b.sampled) == 1
        [server] = await d.ctl("servers")
        assert server["turns"]["inTurn"] is True, server
        # From now on calls from different sessions go in turn: b's call waits for a's to
        # end, and its request is b's from the start.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sa.call_tool, *long_op)
            with trio.fail_after(WAIT):
                await wait_until(lambda: _in_flight(d, 1))
                result = await sb.call_tool(*sample)
        assert "sampled by b" in text(result), result
        assert a.sampled == [] and len(b.sampled) == 2
        log = await d.ctl("logs")
        assert [ln for ln in log["lines"] if "now go in turn" in ln], log["lines"]
        assert not [ln for ln in log["lines"] if "no session owns" in ln], log["lines"]


async def _in_flight(d: DaemonProcess, n: int) -> bool:
    servers = await d.ctl("servers")
    return bool(servers) and servers[0]["in_flight"] >= n


async def test_shared_filesystem_server_never_sees_a_sessions_roots(
    daemon_factory, peers, tmp_path: Path
):
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    secret_a, secret_b = tmp_path / "secret-a", tmp_path / "secret-b"
    secret_a.mkdir()
    secret_b.mkdir()
    d = await daemon_factory()
    fs = {"command": "node", "args": [peers["PEER_FILESYSTEM_JS"], str(allowed)]}
    settings = write_settings(d.root / "f.json", {"fs": fs})
    a, b = Callbacks("a", [str(secret_a)]), Callbacks("b", [str(secret_b)])
    async with client(d, settings, a) as sa, client(d, settings, b) as sb:
        for session in (sa, sb):
            with trio.fail_after(WAIT):
                listed = text(await session.call_tool("fs__list_allowed_directories", {}))
            assert "secret" not in listed, listed
        assert len(await d.ctl("servers")) == 1


async def test_subscriptions_are_reference_counted_per_entry_and_uri(daemon_factory):
    d = await daemon_factory()
    settings = write_settings(d.root / "s.json", {"fake": fake_server()})
    a, b = Callbacks("a"), Callbacks("b")
    uri = "fake://readme"
    async with client(d, settings, a) as sa, client(d, settings, b) as sb:
        await subscribe(sa, uri)
        await subscribe(sb, uri)
        await subscribe(sa, uri, on=False)
        await sb.send_ping()
        lines = (await d.ctl("logs", "fake"))["lines"]
        assert [ln for ln in lines if "subscribe" in ln] == [f"fake-upstream: subscribe {uri}"]
        await subscribe(sb, uri, on=False)
        await sb.send_ping()
        lines = (await d.ctl("logs", "fake"))["lines"]
        assert [ln for ln in lines if "subscribe" in ln] == [
            f"fake-upstream: subscribe {uri}",
            f"fake-upstream: unsubscribe {uri}",
        ]


async def test_resource_updates_reach_only_subscribers(daemon_factory, peers):
    d = await daemon_factory()
    settings = write_settings(d.root / "e.json", {"everything": everything(peers)})
    a, b = Callbacks("a"), Callbacks("b")
    async with client(d, settings, a) as sa, client(d, settings, b):
        resources = await sa.list_resources()
        uri = str(resources.resources[0].uri)
        await subscribe(sa, uri)
        with trio.fail_after(WAIT):
            await sa.call_tool("everything__toggle-subscriber-updates", {})
            await wait_until(lambda: bool(a.updates))
        assert set(a.updates) == {uri}
        assert b.updates == []


async def test_log_levels_are_per_session_on_a_shared_upstream(daemon_factory):
    d = await daemon_factory()
    settings = write_settings(d.root / "s.json", {"fake": fake_server()})
    quiet, chatty = Callbacks("quiet"), Callbacks("chatty")
    async with client(d, settings, quiet) as sq, client(d, settings, chatty) as sc:
        with warnings.catch_warnings():
            # Handshake-era logging/setLevel, which the SDK flags as removed in 2026-07-28.
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await sq.set_logging_level("error")
            await sc.set_logging_level("debug")
        await sq.call_tool("fake__log", {"level": "info", "message": "routine"})
        await sq.call_tool("fake__log", {"level": "error", "message": "bad"})
        await sc.call_tool("fake__log", {"level": "info", "message": "chatty's"})
        with trio.fail_after(WAIT):
            await wait_until(lambda: len(chatty.logs) == 1 and len(quiet.logs) == 1)
        # Each call's messages are its session's (issue 15), filtered by its own level.
        assert quiet.logs[0].data == "bad"
        assert chatty.logs[0].data == "chatty's"
        lines = (await d.ctl("logs", "fake"))["lines"]
        # The shared upstream logs at the most verbose level asked for, set once per change.
        assert [ln for ln in lines if "setLevel" in ln] == [
            "fake-upstream: setLevel error",
            "fake-upstream: setLevel debug",
        ]
