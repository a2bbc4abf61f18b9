"""A recording downstream for users' crash tests: it counts every real side effect.

Point a write tool's destination at it. Every `POST`/`PUT`/`PATCH`/`DELETE` is a side effect,
recorded with the `Idempotency-Key` it carried. A downstream that honours keys answers a
repeated key with the first answer and creates nothing; one that does not (set
`honours_keys=False`, for instance to prove that a tool declared as honouring keys would
duplicate) creates a new effect every time. Any `GET` whose path ends with a key is a lookup:
200 with what that key created, or 404.

The invariant it serves: at most one real effect per logical call, where the logical call is
the idempotency key (`{run_id}:{tool_call_id}`, `...:compensate` for a compensation).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import unquote, urlsplit


@dataclass(frozen=True)
class RecordedEffect:
    """One real side effect the downstream performed."""

    id: str
    method: str
    path: str
    key: str | None
    body: Any
    at: float = field(default_factory=time.time)

    def answer(self) -> dict[str, Any]:
        return {"id": self.id, "status": "created", "idempotency_key": self.key}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, owner: RecordingDownstream, address: tuple[str, int]) -> None:
        self.owner = owner
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def _reply(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _write(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            self._reply(400, {"error": "the body is not JSON"})
            return
        owner = self.server.owner
        key = self.headers.get(owner.key_header)
        status, answer = owner.perform(self.command, urlsplit(self.path).path, key, body)
        self._reply(status, answer)

    do_POST = do_PUT = do_PATCH = do_DELETE = _write

    def do_GET(self) -> None:
        path = unquote(urlsplit(self.path).path)
        found = self.server.owner.lookup(path)
        if found is None:
            self._reply(404, {"error": "nothing was created with this key"})
        else:
            self._reply(200, found.answer())

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the record is the log


class RecordingDownstream:
    """`with RecordingDownstream() as downstream:` serves on 127.0.0.1 until the block ends."""

    def __init__(
        self,
        *,
        honours_keys: bool = True,
        key_header: str = "Idempotency-Key",
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.honours_keys = honours_keys
        self.key_header = key_header
        self._lock = threading.Lock()
        self._effects: list[RecordedEffect] = []
        self._server = _Server(self, (host, port))
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="recording-downstream", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the handler calls ----------------------------------------------------------

    def perform(self, method: str, path: str, key: str | None, body: Any) -> tuple[int, Any]:
        with self._lock:
            if self.honours_keys and key is not None:
                for done in self._effects:
                    if done.key == key:
                        return 200, done.answer()
            effect = RecordedEffect(f"EFF-{len(self._effects) + 1:06d}", method, path, key, body)
            self._effects.append(effect)
        return 201, effect.answer()

    def lookup(self, path: str) -> RecordedEffect | None:
        with self._lock:
            for done in self._effects:
                if done.key and path.endswith(done.key):
                    return done
        return None

    # -- what tests read -----------------------------------------------------------------

    def effects(self) -> list[RecordedEffect]:
        with self._lock:
            return list(self._effects)

    def count_by_key(self) -> Counter[str | None]:
        return Counter(e.key for e in self.effects())

    def duplicates(self) -> dict[str, int]:
        """Logical calls (idempotency keys) performed more than once."""
        return {k: n for k, n in self.count_by_key().items() if k is not None and n > 1}

    def reset(self) -> None:
        with self._lock:
            self._effects.clear()
