"""A recording downstream for users' crash tests: it counts every real side effect.

Point a write tool's destination at it. Every `POST`/`PUT`/`PATCH`/`DELETE` is a side effect,
recorded with the `Idempotency-Key` it carried. A downstream that honours keys answers a
repeated key with the first answer and creates nothing; one that does not (set
`honours_keys=False`, for instance to prove that a tool declared as honouring keys would
duplicate) creates a new effect every time. Any `GET` whose path ends with a key is a lookup:
200 with what that key created, or 404.

The invariant it serves: at most one real effect per logical call, where the logical call is
the idempotency key (`{run_id}:{tool_call_id}`, `...:compensate` for a compensation). A
request without a key (a side effect made by a read tool, or by any code outside the outbox)
is its own logical call by what it asked for: method, path and body. The same keyless request
performed twice is a duplicate, since neither the downstream nor anyone else can tell the
second from the first.

Your own downstream (a fake of your provider, with its own rules) can be counted instead:
give the destination its URL (`ledgerloop_crash(destinations={"payments": url})`) and have it
report each side effect it performs, in process with `record()` or from another process with
`POST {url}/_ledgerloop/performed` (`{"method", "path", "key", "body"}`, JSON).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Collection
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

    def logical_call(self, ledger_keys: Collection[str] | None = None) -> str:
        """The logical call this effect belongs to: its idempotency key; else (no key, or,
        when `ledger_keys` is given, a key no effect in the ledger has, so it did not come
        through the outbox) the request it was, so that the same request twice counts twice."""
        if self.key is not None and (ledger_keys is None or self.key in ledger_keys):
            return self.key
        body = json.dumps(self.body, sort_keys=True, default=str)
        if self.key is None:
            return f"keyless {self.method} {self.path} {body}"
        # Not the key itself: code that makes a fresh key each time it runs sends one call
        # under many keys.
        return f"{self.method} {self.path} {body} (with a key that is no effect's in the ledger)"


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
        if self.command == "POST" and urlsplit(self.path).path == REPORT_PATH:
            self._report(body)
            return
        key = self.headers.get(owner.key_header)
        status, answer = owner.perform(self.command, urlsplit(self.path).path, key, body)
        self._reply(status, answer)

    def _report(self, body: Any) -> None:
        # Another process's downstream saying it performed a side effect: recorded, not done.
        if not (
            isinstance(body, dict)
            and isinstance(body.get("method"), str)
            and isinstance(body.get("path"), str)
            and isinstance(body.get("key"), str | None)
        ):
            self._reply(400, {"error": 'expected {"method", "path", "key", "body"}'})
            return
        owner = self.server.owner
        effect = owner.record(body["method"], body["path"], body["key"], body.get("body"))
        self._reply(201, effect.answer())

    do_POST = do_PUT = do_PATCH = do_DELETE = _write

    def do_GET(self) -> None:
        path = unquote(urlsplit(self.path).path)
        self.server.owner.got(path)
        found = self.server.owner.lookup(path)
        if found is None:
            self._reply(404, {"error": "nothing was created with this key"})
        else:
            self._reply(200, found.answer())

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the record is the log


#: Where a downstream in another process reports the side effects it performed.
REPORT_PATH = "/_ledgerloop/performed"


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
        self._gets: Counter[str] = Counter()
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

    def record(self, method: str, path: str, key: str | None, body: Any = None) -> RecordedEffect:
        """Count a side effect your own downstream performed (it decided, by its own rules,
        that this request does something): the invariants then count it as they count this
        recorder's own. Call it once per real effect, not for a request it answered from an
        earlier one."""
        with self._lock:
            effect = RecordedEffect(f"EFF-{len(self._effects) + 1:06d}", method, path, key, body)
            self._effects.append(effect)
        return effect

    @property
    def report_url(self) -> str:
        """Where another process reports what it performed (`POST`, JSON: method, path, key,
        body)."""
        return self.url + REPORT_PATH

    def got(self, path: str) -> None:
        """Count a `GET` (the handler calls it for each one it answers)."""
        with self._lock:
            self._gets[path] += 1

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

    def gets_by_path(self) -> Counter[str]:
        """Every `GET` asked of this downstream, by path: a read tool pointed here is
        counted as a write is by `count_by_key`."""
        with self._lock:
            return Counter(self._gets)

    def count_by_key(self) -> Counter[str | None]:
        return Counter(e.key for e in self.effects())

    def duplicates(self, ledger_keys: Collection[str] | None = None) -> dict[str, int]:
        """Logical calls performed more than once: by idempotency key, and a request without
        one (or with a key none of `ledger_keys` is, when given) by its method, path and body
        (`RecordedEffect.logical_call`)."""
        calls = Counter(e.logical_call(ledger_keys) for e in self.effects())
        return {call: n for call, n in calls.items() if n > 1}

    def reset(self) -> None:
        with self._lock:
            self._effects.clear()
            self._gets.clear()
