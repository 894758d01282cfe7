"""Issue 12, item 1: the one-liners that killed the daemon, against a real daemon process.

`notifications/cancelled` whose `requestId` is an object or an array (unhashable in Python) raised
TypeError in the session and took the whole daemon down with every session of every client.
Now it is a malformed notification: dropped with a log line, nothing else changes. It is sent
as the first line of a raw connection (an implicit session, still in its backlog), inside an
attached session, through a real `mcpool attach` bridge, and to the `--http` endpoint.
"""

from __future__ import annotations

import httpx2
import pytest
import trio

from .harness import DaemonFactory, fake_server
from .support import PROTOCOL_VERSION, STEP_TIMEOUT, raw_attach, raw_call, raw_text
from .test_handoff import bridge
from .test_http import http_daemon

ONE_LINERS = {
    "object": b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":{}}}\n',
    "array": b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":[1]}}\n',
}


@pytest.mark.parametrize("kind", sorted(ONE_LINERS))
async def test_cancelled_with_an_unhashable_request_id_is_dropped_over_the_socket(
    daemon_factory: DaemonFactory, kind: str
) -> None:
    line = ONE_LINERS[kind]
    daemon = await daemon_factory({"fake": fake_server()})
    settings = str(daemon.config_path)
    async with daemon.raw() as bystander, daemon.raw() as first, daemon.raw() as attached:
        await raw_attach(bystander, [settings], "bystander")
        # The first line of a connection: an implicit session that is still starting.
        await first.send_raw(line)
        init = await first.request(
            "initialize",
            {"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": {"name": "x"}},
        )
        assert init["result"]["protocolVersion"] == PROTOCOL_VERSION, init
        assert raw_text(await raw_call(first, "fake__echo", {"text": "first"})) == "first"
        # Inside a session that is up, twice, between calls.
        await raw_attach(attached, [settings], "attached")
        await attached.send_raw(line + line)
        assert "result" in await attached.request("ping")
        assert raw_text(await raw_call(attached, "fake__echo", {"text": "after"})) == "after"
        # Nobody else noticed.
        assert raw_text(await raw_call(bystander, "fake__echo", {"text": "still"})) == "still"
        # A notification is never answered: nothing arrived besides the answers asked for.
        assert first.backlog == [] and attached.backlog == [] and bystander.backlog == []
    assert daemon.process is not None and daemon.process.poll() is None, daemon.output()
    assert "dropped a malformed notifications/cancelled" in daemon.log_path.read_text()
    assert await daemon.stop() == 0


@pytest.mark.parametrize("kind", sorted(ONE_LINERS))
async def test_cancelled_with_an_unhashable_request_id_is_dropped_through_mcpool_attach(
    daemon_factory: DaemonFactory, kind: str
) -> None:
    line = ONE_LINERS[kind]
    daemon = await daemon_factory({"fake": fake_server()})
    async with daemon.raw() as bystander, bridge(daemon, "hostile") as hostile:
        await raw_attach(bystander, [str(daemon.config_path)], "bystander")
        await hostile.initialize()
        await hostile.client.send_raw(line)
        with trio.fail_after(STEP_TIMEOUT):
            assert "result" in await hostile.client.request("ping")
        assert raw_text(await raw_call(hostile.client, "fake__echo", {"text": "ok"})) == "ok"
        assert raw_text(await raw_call(bystander, "fake__echo", {"text": "ok"})) == "ok"
    assert daemon.process is not None and daemon.process.poll() is None, daemon.output()
    assert await daemon.stop() == 0


@pytest.mark.parametrize("kind", sorted(ONE_LINERS))
async def test_cancelled_with_an_unhashable_request_id_is_dropped_over_http(
    daemon_factory: DaemonFactory, kind: str
) -> None:
    daemon, port = await http_daemon(daemon_factory, {"fake": fake_server()})
    url = f"http://127.0.0.1:{port}/mcp"
    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {}},
    }
    async with httpx2.AsyncClient(timeout=STEP_TIMEOUT) as http:
        r = await http.post(url, json=init, headers=headers)
        assert r.status_code == 200, r.text
        session = {**headers, "mcp-session-id": r.headers["mcp-session-id"]}
        r = await http.post(url, content=ONE_LINERS[kind].strip(), headers=session)
        assert r.status_code == 202, r.text
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "fake__echo", "arguments": {"text": "over http"}},
        }
        r = await http.post(url, json=call, headers=session)
        assert r.status_code == 200 and "over http" in r.text, r.text
    assert daemon.process is not None and daemon.process.poll() is None, daemon.output()
    assert await daemon.stop() == 0
