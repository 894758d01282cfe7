"""Issue 12, item 9: on SIGTERM (or `daemonctl stop`) every in-flight call gets a JSON-RPC error.

A real daemon, a slow real upstream (tools/fake_upstream.py's `sleep`), 50 calls in flight over
three sessions (two raw socket sessions and one handed off by a real `mcpool attach`), then the
stop: each call gets exactly one answer, an error that says the daemon is shutting down, before
its connection closes.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest
import trio

from .harness import DaemonFactory, RawSocketClient, fake_server
from .support import STEP_TIMEOUT, raw_attach
from .test_handoff import bridge

SESSION_CLOSING = -31007
CALLS_PER_SOCKET = 20
CALLS_THROUGH_ATTACH = 10
SLEEP_SECONDS = 120  # far beyond the test: only the shutdown can end these calls


async def _start_calls(client: RawSocketClient, count: int, prefix: str) -> list[str]:
    """`count` slow tools/calls in one write; a ping after them is answered only once the
    daemon has read (and forwarded) every one of them."""
    ids = [f"{prefix}-{n}" for n in range(count)]
    lines = b"".join(
        b'{"jsonrpc":"2.0","id":"%s","method":"tools/call","params":{"name":"fake__sleep",'
        b'"arguments":{"seconds":%d}}}\n' % (i.encode(), SLEEP_SECONDS)
        for i in ids
    )
    await client.send_raw(lines)
    assert "result" in await client.request("ping")
    return ids


async def _answers_until_closed(client: RawSocketClient) -> list[dict[str, Any]]:
    client.receive_timeout = STEP_TIMEOUT
    answers = list(client.backlog)
    while (line := await client.receive_line()) is not None:
        answers.append(json.loads(line))
    return answers


@pytest.mark.parametrize("how", ["sigterm", "daemonctl stop"])
async def test_every_in_flight_call_gets_an_error_when_the_daemon_stops(
    daemon_factory: DaemonFactory, how: str
) -> None:
    daemon = await daemon_factory({"fake": fake_server()})
    settings = [str(daemon.config_path)]
    async with daemon.raw() as a, daemon.raw() as b, bridge(daemon, "handoff") as c:
        await raw_attach(a, settings, "a")
        await raw_attach(b, settings, "b")
        await c.initialize()
        expected = {
            "a": await _start_calls(a, CALLS_PER_SOCKET, "a"),
            "b": await _start_calls(b, CALLS_PER_SOCKET, "b"),
            "c": await _start_calls(c.client, CALLS_THROUGH_ATTACH, "c"),
        }
        assert sum(len(ids) for ids in expected.values()) == 50
        if how == "sigterm":
            os.kill(daemon.pid, signal.SIGTERM)
        else:
            await daemon.ctl("stop")
        got: dict[str, list[dict[str, Any]]] = {}
        with trio.fail_after(STEP_TIMEOUT * 2):
            async with trio.open_nursery() as nursery:
                for name, client in (("a", a), ("b", b), ("c", c.client)):

                    async def collect(name: str = name, client: RawSocketClient = client) -> None:
                        got[name] = await _answers_until_closed(client)

                    nursery.start_soon(collect)
    for name, ids in expected.items():
        answers = [m for m in got[name] if "id" in m and "method" not in m]
        assert sorted(m["id"] for m in answers) == sorted(ids), (name, got[name])
        for answer in answers:
            error = answer.get("error")
            assert error is not None, answer
            assert error["code"] == SESSION_CLOSING, answer
            assert "shutting down" in error["message"], answer
    assert daemon.process is not None
    with trio.fail_after(STEP_TIMEOUT):
        assert await daemon.process.wait() == 0, daemon.output()
