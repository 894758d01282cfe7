"""OpenTelemetry export (daemon/_otel.py) to a real OTLP/HTTP receiver on 127.0.0.1."""

from __future__ import annotations

import pytest
import trio
from fakes import call_record
from otlp_receiver import otlp_receiver

from mcpool.daemon import _otel
from mcpool.session._observe import ERROR, RESULT, TOOL_ERROR

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")


def test_only_an_endpoint_turns_it_on() -> None:
    assert not _otel.wanted({})
    assert _otel.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert _otel.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x/v1/traces"})


async def test_spans_follow_the_mcp_conventions_and_metrics_arrive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with otlp_receiver() as (endpoint, received):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        observer = _otel.start("0.1.0")
        t = trio.current_time()
        observer.add(
            "s7",
            [
                call_record("git", "tools/call", "log", t, t + 0.25, RESULT, None, 10, 20),
                call_record("git", "tools/call", "diff", t, t + 0.1, TOOL_ERROR, None, 1, 2),
                call_record("fs", "resources/read", "file:///a", t, t + 0.1, ERROR, -32002, 1, 2),
            ],
        )
        with trio.fail_after(10):
            await trio.to_thread.run_sync(observer.flush)
        await observer.aclose()
    by_name = {span["name"]: span for span in received.spans}
    assert set(by_name) == {"tools/call log", "tools/call diff", "resources/read"}
    log = by_name["tools/call log"]
    assert log["kind"] == 2  # SERVER
    assert log["attributes"] == {
        "mcp.method.name": "tools/call",
        "mcp.session.id": "s7",
        "mcpool.server": "git",
        "gen_ai.tool.name": "log",
    }
    assert 0.24e9 < log["duration_ns"] < 0.26e9
    assert by_name["tools/call diff"]["attributes"]["error.type"] == "tool_error"
    read = by_name["resources/read"]["attributes"]
    assert read["error.type"] == "-32002" and read["mcp.resource.uri"] == "file:///a"
    assert {"mcp.server.operation.duration", "mcpool.bytes"} <= received.metrics
