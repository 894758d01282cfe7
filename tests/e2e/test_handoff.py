"""`mcpool attach` handing its stdio to the daemon: the bridge leaves the message path, and its
life stays the session's (its exit ends the session; the session's end ends it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from .harness import DaemonFactory, DaemonProcess, RawSocketClient, attach_args, fake_server
from .support import PROTOCOL_VERSION, STEP_TIMEOUT, raw_call, raw_text, wait_until


class Bridge:
    def __init__(self, process: trio.Process, client: RawSocketClient) -> None:
        self.process = process
        self.client = client

    async def initialize(self) -> None:
        init = await self.client.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "handoff", "version": "0"},
            },
        )
        assert init["result"]["protocolVersion"] == PROTOCOL_VERSION, init
        await self.client.notify("notifications/initialized")

    async def exit_status(self) -> tuple[int, bytes]:
        """Close the client's end of stdin and wait for the bridge: (status, stderr)."""
        assert self.process.stdin is not None and self.process.stderr is not None
        with trio.fail_after(STEP_TIMEOUT):
            await self.process.stdin.aclose()
            err = b""
            while chunk := await self.process.stderr.receive_some():
                err += chunk
            return await self.process.wait(), err


@asynccontextmanager
async def bridge(daemon: DaemonProcess, name: str, **env: str) -> AsyncIterator[Bridge]:
    argv = [sys.executable, *attach_args(daemon.sock, [daemon.config_path], name)]
    process = await trio.lowlevel.open_process(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **daemon.env, **env},
        cwd=daemon.root,
    )
    assert process.stdin is not None and process.stdout is not None
    client = RawSocketClient(trio.StapledStream(process.stdin, process.stdout))  # type: ignore[arg-type]
    try:
        yield Bridge(process, client)
    finally:
        if process.returncode is None:
            os.kill(process.pid, signal.SIGCONT)
            process.kill()
        with trio.fail_after(STEP_TIMEOUT):
            await process.wait()


async def sessions_named(daemon: DaemonProcess, name: str) -> list[dict[str, Any]]:
    return [s for s in await daemon.ctl("sessions") if s["name"] == name]


async def test_a_handed_off_session_answers_while_the_bridge_is_stopped(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory({"f": fake_server()})
    async with bridge(daemon, "direct") as b:
        await b.initialize()
        (session,) = await sessions_named(daemon, "direct")
        assert session["via"] == "attach"
        # A stopped bridge relays nothing: the answer can only come from the daemon itself.
        os.kill(b.process.pid, signal.SIGSTOP)
        try:
            assert raw_text(await raw_call(b.client, "f__echo", {"text": "hi"})) == "hi"
        finally:
            os.kill(b.process.pid, signal.SIGCONT)
        assert await b.exit_status() == (0, b"")
    with trio.fail_after(STEP_TIMEOUT):
        await wait_until(lambda: _no_session(daemon, "direct"))


async def test_killing_the_bridge_ends_its_session(daemon_factory: DaemonFactory) -> None:
    daemon = await daemon_factory({"f": fake_server()})
    async with bridge(daemon, "doomed") as b:
        await b.initialize()
        assert len(await sessions_named(daemon, "doomed")) == 1
        b.process.kill()
        with trio.fail_after(STEP_TIMEOUT):
            await wait_until(lambda: _no_session(daemon, "doomed"))


async def test_a_client_that_closes_its_end_of_stdout_ends_the_bridge_quietly(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory({"f": fake_server()})
    async with bridge(daemon, "gone") as b:
        await b.initialize()
        assert b.process.stdout is not None and b.process.stdin is not None
        await b.process.stdout.aclose()  # the client stops reading its server's output
        await b.client.send({"jsonrpc": "2.0", "id": 99, "method": "ping"})
        # The daemon's answer meets a pipe nobody reads: the client is gone, as in relay mode.
        assert await b.exit_status() == (0, b"")
    with trio.fail_after(STEP_TIMEOUT):
        await wait_until(lambda: _no_session(daemon, "gone"))


async def test_relay_when_asked_for_still_serves_the_session(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory({"f": fake_server()})
    async with bridge(daemon, "relayed", MCPOOL_ATTACH_RELAY="1") as b:
        await b.initialize()
        (session,) = await sessions_named(daemon, "relayed")
        assert session["via"] == "attach-relay"
        assert raw_text(await raw_call(b.client, "f__echo", {"text": "hi"})) == "hi"
        assert await b.exit_status() == (0, b"")


async def test_the_daemon_stopping_ends_a_handed_off_bridge_with_one_line(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory({"f": fake_server()})
    async with bridge(daemon, "stopped") as b:
        await b.initialize()
        assert b.process.stderr is not None
        await daemon.stop()
        with trio.fail_after(STEP_TIMEOUT):
            status = await b.process.wait()
            err = b""
            while chunk := await b.process.stderr.receive_some():
                err += chunk
        assert status == 1
        assert err.startswith(b"mcpool attach: ") and err.count(b"\n") == 1, err
        # The client sees its server's output end.
        assert await b.client.receive_line() is None


async def _no_session(daemon: DaemonProcess, name: str) -> bool:
    return not await sessions_named(daemon, name)
