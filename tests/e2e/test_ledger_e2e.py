"""Issue 30 items 3-5 with real processes: the daemon's ledger of answered requests.

A daemon, the fake stdio upstream, a raw socket session: each tools/call, resources/read and
prompts/get is a line of the audit log (and never its arguments: a unique string passed as one
is looked for in every file the daemon wrote), `daemonctl stats --json` counts them, `daemonctl
audit` reads them back, and with `OTEL_EXPORTER_OTLP_ENDPOINT` set a receiver on 127.0.0.1 gets
a span per request.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
from otlp_receiver import otlp_receiver

from e2e.harness import DaemonFactory, DaemonProcess, RawSocketClient, fake_server, write_settings
from e2e.test_session_state import open_session as open_raw_session

STEP = 20.0


async def open_session(client: RawSocketClient, d: DaemonProcess) -> str:
    settings = write_settings(d.root / "s.json", {"up": fake_server()})
    return await open_raw_session(client, d, settings, "ledger-test", "7.1")


async def some_calls(client: RawSocketClient, secret: str) -> list[dict[str, Any]]:
    return [
        await client.request("tools/call", {"name": "up__echo", "arguments": {"text": secret}}),
        await client.request("tools/call", {"name": "up__echo", "arguments": {"text": secret}}),
        await client.request("tools/call", {"name": "up__fail", "arguments": {}}),
        await client.request("resources/read", {"uri": "fake://readme"}),
    ]


async def audit_lines(d: DaemonProcess, wanted: int) -> list[dict[str, Any]]:
    """The audit file's records, once it has `wanted` (it is written about once a second)."""
    path = Path(d.env["XDG_STATE_HOME"]) / "mcpool" / "audit.jsonl"
    while True:
        if path.exists():
            records = [json.loads(line) for line in path.read_text().splitlines() if line]
            if len(records) >= wanted:
                return records
        await trio.sleep(0.1)


async def test_each_call_is_audited_counted_and_no_argument_is_written(
    daemon_factory: DaemonFactory,
) -> None:
    d = await daemon_factory()
    secret = f"secret-{uuid.uuid4().hex}"
    async with d.raw() as client:
        with trio.fail_after(STEP):
            sid = await open_session(client, d)
            replies = await some_calls(client, secret)
            assert all("result" in r for r in replies), replies
            records = await audit_lines(d, 4)
            stats = await d.ctl("stats")
    assert [(r["method"], r["name"], r["outcome"]) for r in records] == [
        ("tools/call", "echo", "result"),
        ("tools/call", "echo", "result"),
        ("tools/call", "fail", "isError"),
        ("resources/read", "fake://readme", "result"),
    ]
    first = records[0]
    assert (first["session"]["id"], first["server"]) == (sid, "up")
    assert (first["session"]["client"], first["session"]["client_version"]) == (
        "ledger-test",
        "7.1",
    )
    assert first["session"]["folder"] == str(d.root)
    assert first["bytes_in"] > 0 and first["bytes_out"] > len(secret)
    up = stats["servers"]["up"]
    assert (up["calls"], up["errors"]) == (4, 1), stats
    assert up["tools"]["echo"]["calls"] == 2
    assert up["tools"]["resources/read fake://readme"]["calls"] == 1
    assert stats["sessions"] == {sid: 4}
    # `daemonctl audit` reads the same records back, for one server.
    read_back = await d.ctl("audit", "--server", "up")
    assert [r["name"] for r in read_back] == ["echo", "echo", "fail", "fake://readme"]
    # Never an argument: the secret is in none of the files the daemon wrote.
    await d.stop()
    written = [p for p in Path(d.root).rglob("*") if p.is_file()]
    assert any(p.name == "audit.jsonl" for p in written)
    holding = [p for p in written if secret.encode() in p.read_bytes()]
    assert holding == [], holding


async def test_an_otlp_receiver_gets_a_span_per_request(daemon_factory: DaemonFactory) -> None:
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
    with otlp_receiver() as (endpoint, received):
        d = await daemon_factory(
            env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        )
        async with d.raw() as client:
            with trio.fail_after(STEP):
                await open_session(client, d)
                await some_calls(client, "x")
        with trio.fail_after(STEP):
            await d.stop()  # its exporter flushes at the end
            while len(received.spans) < 4:
                await trio.sleep(0.1)
    names = sorted(span["name"] for span in received.spans)
    assert names == ["resources/read", "tools/call echo", "tools/call echo", "tools/call fail"]
    echo = next(s for s in received.spans if s["name"] == "tools/call echo")
    assert echo["attributes"]["mcp.method.name"] == "tools/call", echo
