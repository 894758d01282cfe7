"""OpenTelemetry, optional (`pip install 'mcpool[otel]'`): a span per relayed request and the
statistics as metrics, exported over OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT` (or its
traces- or metrics-only form) is set. Off, and never imported, otherwise.

Spans follow the OpenTelemetry semantic conventions for MCP (Development status): kind SERVER
(mcpool answers the client's request), named `{mcp.method.name} {target}` (the tool or prompt;
a resource URI is an attribute, not part of the name), with `mcp.method.name`, `mcp.session.id`,
`gen_ai.tool.name` / `gen_ai.prompt.name` / `mcp.resource.uri`, `error.type` (`tool_error` for
an isError result, the JSON-RPC code otherwise) and `mcpool.server` (the upstream). Metrics:
`mcp.server.operation.duration` (a histogram, seconds) and `mcpool.bytes` (a counter, with
`direction`). The SDK exports from its own threads (BatchSpanProcessor, a periodic reader): a
span costs the loop its creation, never a network write.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import trio

from mcpool.session._observe import ERROR, RESULT, TOOL_ERROR, CallRecord

ENDPOINT_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)
SHUTDOWN_BOUND = 5.0  # seconds the daemon's exit waits for the last export
INSTALL_HINT = "pip install 'mcpool[otel]'"


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    return any(environ.get(name) for name in ENDPOINT_VARIABLES)


class OtelObserver:
    """A CallObserver exporting spans and metrics (built by `start`)."""

    def __init__(self, tracer_provider: Any, meter_provider: Any) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self._providers = (tracer_provider, meter_provider)
        self._tracer = tracer_provider.get_tracer("mcpool")
        meter = meter_provider.get_meter("mcpool")
        self._duration = meter.create_histogram(
            "mcp.server.operation.duration",
            unit="s",
            description="MCP request duration as mcpool answered it",
        )
        self._bytes = meter.create_counter("mcpool.bytes", unit="By")
        self._kind = SpanKind.SERVER
        self._error = Status(StatusCode.ERROR)

    def add(self, session: str, records: list[CallRecord[Any]]) -> None:
        """A span and the metrics for each of a session's answered requests."""
        for record in records:
            self._one(session, record)

    def _one(self, session: str, call: CallRecord[Any]) -> None:
        attributes: dict[str, Any] = {
            "mcp.method.name": call.method,
            "mcp.session.id": session,
            "mcpool.server": call.server,
        }
        target = ""
        if call.method == "tools/call":
            attributes["gen_ai.tool.name"] = target = call.name
        elif call.method == "prompts/get":
            attributes["gen_ai.prompt.name"] = target = call.name
        elif call.method.startswith("resources/") and call.name:
            attributes["mcp.resource.uri"] = call.name
        if call.outcome == TOOL_ERROR:
            attributes["error.type"] = "tool_error"
        elif call.outcome == ERROR:
            attributes["error.type"] = str(call.code) if isinstance(call.code, int) else "error"
        span = self._tracer.start_span(
            f"{call.method} {target}" if target else call.method,
            kind=self._kind,
            start_time=int(call.ts * 1e9),
            attributes=attributes,
        )
        if call.outcome != RESULT:
            span.set_status(self._error)
        span.end(end_time=int((call.ts + call.duration_ms / 1000.0) * 1e9))
        metric = {k: v for k, v in attributes.items() if k != "mcp.session.id"}
        self._duration.record(call.duration_ms / 1000.0, metric)
        self._bytes.add(call.bytes_in, {**metric, "direction": "in"})
        self._bytes.add(call.bytes_out, {**metric, "direction": "out"})

    def flush(self) -> None:
        """Export what waits (blocking: from a thread)."""
        tracer_provider, meter_provider = self._providers
        tracer_provider.force_flush()
        meter_provider.force_flush()

    async def aclose(self) -> None:
        """Flush and stop the exporters, within SHUTDOWN_BOUND, off the loop."""

        def shutdown() -> None:
            for provider in self._providers:
                provider.shutdown()

        with trio.move_on_after(SHUTDOWN_BOUND):
            await trio.to_thread.run_sync(shutdown, abandon_on_cancel=True)


def start(version: str) -> OtelObserver:
    """The observer, its exporters configured from the OTEL_* environment; ImportError (with
    INSTALL_HINT) when the extra is not installed."""
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ImportError(f"OpenTelemetry is not installed: {INSTALL_HINT}") from exc
    resource = Resource.create({"service.name": "mcpool", "service.version": version})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    meter_provider = MeterProvider(
        resource=resource, metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())]
    )
    return OtelObserver(tracer_provider, meter_provider)
