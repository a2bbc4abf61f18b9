"""A minimal OTLP/HTTP collector on loopback, for tests that export real telemetry."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class Receiver(ThreadingHTTPServer):
    """A minimal OTLP/HTTP collector: keeps every POST body by path."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.bodies: dict[str, list[bytes]] = {}
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def traces(self) -> list[ExportTraceServiceRequest]:
        with self.lock:
            bodies = list(self.bodies.get("/v1/traces", []))
        return [ExportTraceServiceRequest.FromString(body) for body in bodies]

    def span_names(self) -> set[str]:
        return {
            span.name
            for request in self.traces()
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        }

    def spans(self) -> list[Any]:
        """Every span received, flattened."""
        return [
            span
            for request in self.traces()
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        with self.server.lock:
            self.server.bodies.setdefault(self.path, []).append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # keep test output clean
        pass


@contextmanager
def running_receiver() -> Iterator[Receiver]:
    """A Receiver serving on a background thread for the length of the block."""
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
