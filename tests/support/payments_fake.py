"""A user's own fake of a payments provider, as a crash test of theirs would start it: it
honours `Idempotency-Key` by its own rules and calls `on_refund` for each refund it really
makes (not for a request it answers from an earlier one), which is how the crash plugin's
invariants count a downstream that is not its recorder (docs/testing.md)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class PaymentsFake(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.refunds: dict[str, dict[str, Any]] = {}
        #: Called as `on_refund(method, path, key, body)` for every refund made.
        self.on_refund: Callable[[str, str, str | None, Any], object] | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Self:
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def refund(self, path: str, key: str | None, body: Any) -> dict[str, Any]:
        with self._lock:
            made = self.refunds.get(key) if key else None
            if made is not None:
                return made
            made = {"id": f"re_{len(self.refunds) + 1}", **body}
            self.refunds[key or made["id"]] = made
        if self.on_refund is not None:
            self.on_refund("POST", path, key, body)
        return made


class _Handler(BaseHTTPRequestHandler):
    server: PaymentsFake

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        made = self.server.refund(self.path, self.headers.get("Idempotency-Key"), body)
        data = json.dumps(made).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the refunds are the log
