"""An OTLP/HTTP receiver on 127.0.0.1 for tests: keeps the spans and metric names it is sent.

A real HTTP server (http.server, in a thread) decoding the exporters' protobuf bodies with the
OpenTelemetry protocol's own message classes (opentelemetry-proto, installed with the otel
extra)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Received:
    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.metrics: set[str] = set()
        self.lock = threading.Lock()


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, Received]]:
    """(the endpoint URL to give OTEL_EXPORTER_OTLP_ENDPOINT, what arrives)."""
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            if self.path == "/v1/traces":
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                with received.lock:
                    for rs in request.resource_spans:
                        for ss in rs.scope_spans:
                            for span in ss.spans:
                                attributes = {
                                    a.key: a.value.string_value or a.value.int_value
                                    for a in span.attributes
                                }
                                received.spans.append(
                                    {
                                        "name": span.name,
                                        "kind": span.kind,
                                        "attributes": attributes,
                                        "status": span.status.code,
                                        "duration_ns": span.end_time_unix_nano
                                        - span.start_time_unix_nano,
                                    }
                                )
            elif self.path == "/v1/metrics":
                metrics = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                with received.lock:
                    for rm in metrics.resource_metrics:
                        for sm in rm.scope_metrics:
                            received.metrics.update(m.name for m in sm.metrics)
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
