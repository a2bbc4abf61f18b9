"""A scripted Anthropic Messages API server for the agent loop, the demo and the tests.

It speaks enough of ``POST /v1/messages`` for the real ``anthropic`` SDK to parse its replies,
plain or streamed (``"stream": true``: the Server-Sent Events the real API sends, message_start
to message_stop, text split into word deltas, chunked transfer encoding), answers from a YAML
script (see ``ledgerloop.models.script``) and records every request. ``GET /_requests`` returns
the record; ``POST /_reset`` clears it and the error-attempt counters; ``GET /_first_deltas``
says when each streamed answer's first text delta went out (a benchmark's clock).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import re
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self, TextIO
from urllib.parse import urlsplit

from ledgerloop.models.script import EMPTY_OUTPUT_TOKENS, Reply, Script, ScriptError, load_script

log = logging.getLogger(__name__)

JSON = dict[str, Any]

EXHAUSTED_TEXT = "script exhausted"

_ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    529: "overloaded_error",
}


@dataclass(frozen=True)
class _Answer:
    status: int
    body: JSON | list[JSON]
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    #: Sent as Server-Sent Events (a 200 to a request with `"stream": true`).
    stream: bool = False
    #: A streamed answer's pause before each text delta after the first.
    delta_delay_s: float = 0.0


def _error(
    status: int, message: str, headers: Mapping[str, str] | None = None, delay_s: float = 0.0
) -> _Answer:
    body = {"type": "error", "error": {"type": _ERROR_TYPES[status], "message": message}}
    return _Answer(status, body, headers or {}, delay_s)


def _digest(*parts: object) -> str:
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()


def _text_of(content: object) -> str:
    """The text of a message's content: a string, or the text blocks of a block list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [b.get("text") for b in content if isinstance(b, dict) and b.get("type") == "text"]
        return "\n".join(t for t in texts if isinstance(t, str))
    return ""


def _invalid_reason(request: object) -> str | None:
    # Light validation: enough to catch a broken client, not a copy of the real API's rules.
    if not isinstance(request, dict):
        return "the request body must be a JSON object"
    if not isinstance(request.get("model"), str):
        return "model: field required (a string)"
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: field required (a non-empty list)"
    if not all(isinstance(m, dict) for m in messages):
        return "messages: each message must be an object"
    max_tokens = request.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        return "max_tokens: field required (an integer)"
    if not isinstance(request.get("stream", False), bool):
        return "stream: must be a boolean"
    return None


class _Responder:
    """Chooses the scripted answer for each request and records it. Thread-safe."""

    def __init__(self, script: Script, rpm_limit: int | None = None) -> None:
        self._script = script
        #: Requests answered per minute, as a provider enforces it: over a sliding minute,
        #: the request past the limit gets a 429 with the seconds until one leaves.
        self._rpm_limit = rpm_limit
        self._accepted: deque[float] = deque()
        self._lock = threading.Lock()
        self._records: list[JSON] = []
        self._seq = 0
        # Attempts per (conversation key, turn, model), for `status` replies with `times`.
        self._attempts: dict[tuple[str, int, str], int] = {}
        self._log_file: TextIO | None = None

    def attach_log(self, log_file: TextIO | None) -> None:
        with self._lock:
            self._log_file = log_file

    def records(self) -> list[JSON]:
        with self._lock:
            return list(self._records)

    def reset(self) -> None:
        # seq keeps counting so lines in the log file stay unique across resets.
        with self._lock:
            self._records.clear()
            self._attempts.clear()

    def answer(self, raw: bytes, headers: Mapping[str, str]) -> _Answer:
        """The answer to one ``/v1/messages`` request; ``headers`` has lower-case names."""
        try:
            request: Any = json.loads(raw)
        except ValueError:
            request = None
            reason: str | None = "the request body is not valid JSON"
        else:
            reason = _invalid_reason(request)
        record: JSON = {
            "model": None,
            "conversation": None,
            "turn": None,
            "request": request,
            "headers": {
                # Presence only: a key value must never reach the log. The SDK sends either.
                "x-api-key": bool(headers.get("x-api-key")),
                "authorization": bool(headers.get("authorization")),
                "anthropic-version": headers.get("anthropic-version"),
                # W3C trace context, so a test can see which span a request belongs to.
                "traceparent": headers.get("traceparent"),
            },
        }
        with self._lock:
            self._seq += 1
            record = {"seq": self._seq, "at": time.time(), **record}
            if reason is not None:
                answer, outcome = _error(400, reason), "invalid"
            elif (limited := self._over_limit(record["at"])) is not None:
                answer, outcome = limited, "rate_limited"
            else:
                answer, outcome = self._choose(request, len(raw), record)
                if request.get("stream") and answer.status == 200:
                    answer = replace(answer, stream=True)  # every 200 of a streamed request
            record.update(status=answer.status, outcome=outcome)
            self._records.append(record)
            if self._log_file is not None:
                self._log_file.write(json.dumps(record) + "\n")
                self._log_file.flush()
        return answer

    def _over_limit(self, now: float) -> _Answer | None:
        """A 429 when this request would pass the per-minute limit; call with the lock held."""
        if self._rpm_limit is None:
            return None
        while self._accepted and self._accepted[0] <= now - 60:
            self._accepted.popleft()
        if len(self._accepted) >= self._rpm_limit:
            retry = max(1, math.ceil(self._accepted[0] + 60 - now))
            message = f"rate limit: {self._rpm_limit} requests per minute"
            return _error(429, message, {"retry-after": str(retry)})
        self._accepted.append(now)
        return None

    def _choose(self, request: JSON, size: int, record: JSON) -> tuple[_Answer, str]:
        """Pick the answer for a valid request; call with the lock held."""
        model: str = request["model"]
        messages: list[JSON] = request["messages"]
        first_user = next((m for m in messages if m.get("role") == "user"), {})
        first_text = _text_of(first_user.get("content"))
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        label, conversation = self._script.conversation_for(first_text)
        # The conversation key ties ids and attempt counts to this run's input, so two runs
        # with different inputs never share them and a replayed request gets the same ids.
        key = _digest("conversation", first_text)[:16]
        record.update(model=model, conversation=label, turn=turn)

        if turn >= len(conversation.turns):
            exhausted = Reply(text=EXHAUSTED_TEXT)
            return _Answer(200, _message(exhausted, model, key, turn, size)), "exhausted"
        reply = conversation.turns[turn].for_model(model)
        if reply is None:
            problem = f"the script has no reply for model {model!r} at {label} turn {turn}"
            return _error(400, problem), "no_reply_for_model"
        if reply.status is not None:
            attempt = self._attempts.get((key, turn, model), 0) + 1
            self._attempts[(key, turn, model)] = attempt
            if reply.times is None or attempt <= reply.times or reply.then is None:
                message = reply.message or f"scripted {reply.status} (attempt {attempt})"
                if reply.retry_after_s is not None:
                    retry = {"retry-after": str(reply.retry_after_s)}
                elif reply.status == 429:
                    # Retry-After in milliseconds: a client honouring it waits 1 ms.
                    retry = {"retry-after": "0", "retry-after-ms": "1"}
                else:
                    retry = {}
                delay_s = reply.delay_ms / 1000
                return _error(reply.status, message, retry, delay_s), "error"
            reply = reply.then
        body = _message(reply, model, key, turn, size)
        outcome = "empty" if reply.empty else "message"
        return _Answer(
            200, body, delay_s=reply.delay_ms / 1000, delta_delay_s=reply.delta_delay_ms / 1000
        ), outcome


def _message(reply: Reply, model: str, key: str, turn: int, request_size: int) -> JSON:
    """The Messages API response body for a content or empty reply."""
    content: list[JSON] = []
    if reply.text is not None:
        content.append({"type": "text", "text": reply.text})
    for index, call in enumerate(reply.tool_use):
        tool_id = "toolu_" + _digest(key, turn, index)[:24]
        content.append({"type": "tool_use", "id": tool_id, "name": call.name, "input": call.input})
    if reply.output_tokens is not None:
        output_tokens = reply.output_tokens
    elif reply.empty:
        output_tokens = EMPTY_OUTPUT_TOKENS
    else:
        output_tokens = max(1, len(json.dumps(content)) // 4)
    return {
        "id": "msg_" + _digest(key, turn, model, "message")[:24],
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if reply.tool_use else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": request_size // 4,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def _text_pieces(text: str) -> list[str]:
    """A text as the deltas a streamed answer sends: a word and the space after it each."""
    return re.findall(r"\s*\S+\s*", text) or [text]


def stream_events(message: JSON) -> list[tuple[str, JSON]]:
    """A whole message as the streamed Messages API sends it: message_start (no content, the
    input usage), per block a content_block_start, its deltas and a content_block_stop, then
    message_delta (stop reason, output usage) and message_stop."""
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**message["usage"], "output_tokens": 1}
    events: list[tuple[str, JSON]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            opened: JSON = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": t} for t in _text_pieces(block["text"])]
        else:
            opened = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opened},
            )
        )
        events += [
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
            for d in deltas
        ]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": message["usage"]["output_tokens"]},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    # The stdlib's listen backlog is 5: a worker opening many connections at once (thousands
    # of runs thinking together) would see "connection refused" instead of a queue.
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], responder: _Responder) -> None:
        super().__init__(address, _Handler)
        self.responder = responder
        self.stopping = threading.Event()
        #: When each streamed answer's first text delta was written (time.time()): the
        #: benchmark's start for the first-delta latency.
        self.first_deltas: list[float] = []
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def process_request(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any
    ) -> None:
        if isinstance(request, socket.socket):
            with self._connections_lock:
                self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: socket.socket | tuple[bytes, socket.socket]) -> None:
        if isinstance(request, socket.socket):
            with self._connections_lock:
                self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Wake handler threads blocked on idle keep-alive connections so they exit."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, the client's delayed ACK
    # adds ~40 ms to every reply on keep-alive connections.
    disable_nagle_algorithm = True
    timeout = 60  # an idle keep-alive connection frees its thread after this many seconds
    server: _HTTPServer

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/_requests":
            self._send(_Answer(200, self.server.responder.records()))
        elif path == "/_first_deltas":
            self._send(_Answer(200, {"sent": self.server.first_deltas}))
        else:
            self._send(_error(404, f"no route for GET {self.path}"))

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        path = urlsplit(self.path).path
        if path == "/v1/messages":
            headers = {name.lower(): value for name, value in self.headers.items()}
            answer = self.server.responder.answer(body, headers)
            if answer.delay_s and self.server.stopping.wait(answer.delay_s):
                self.close_connection = True  # shutting down: drop the slow reply
                return
            if answer.stream and answer.status == 200:
                self._send_stream(answer)
            else:
                self._send(answer)
        elif path == "/_reset":
            self.server.responder.reset()
            self._send(_Answer(200, {"reset": True}))
        else:
            self._send(_error(404, f"no route for POST {self.path}"))

    def _send(self, answer: _Answer) -> None:
        data = json.dumps(answer.body).encode()
        try:
            self.send_response(answer.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for name, value in answer.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (a timeout, usually); the request is already recorded.
            self.close_connection = True

    def _flush(self, frames: list[bytes], first_at: int | None) -> None:
        """Write the frames made so far in one send (and note when the first text delta
        went out, when it is among them)."""
        if frames:
            self.wfile.write(b"".join(frames))
            self.wfile.flush()
            if first_at is not None:
                self.server.first_deltas.append(time.time())
            frames.clear()

    def _send_stream(self, answer: _Answer) -> None:
        """The answer as Server-Sent Events, one chunk (of chunked encoding) per event.
        Events made together go out in one write, as a network would coalesce them; a slow
        writer's (`delta_delay_ms`) are written before each pause: a client sees the first
        delta before the last."""
        assert isinstance(answer.body, dict)
        try:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            text_deltas = 0
            first_at: int | None = None  # the first text delta's place in `frames`
            frames: list[bytes] = []
            for name, data in stream_events(answer.body):
                if data.get("delta", {}).get("type") == "text_delta":
                    text_deltas += 1
                    pause = answer.delta_delay_s if text_deltas > 1 else 0.0
                    if pause:
                        self._flush(frames, first_at)
                        first_at = None
                        if self.server.stopping.wait(pause):
                            self.close_connection = True
                            return
                    if text_deltas == 1:
                        first_at = len(frames)
                frame = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
                frames.append(b"%x\r\n%s\r\n" % (len(frame), frame))
            frames.append(b"0\r\n\r\n")
            self._flush(frames, first_at)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("scripted model: " + format, *args)


class ScriptedModelServer:
    """The scripted Messages API server, run on a background thread."""

    def __init__(
        self,
        script: Script,
        host: str = "127.0.0.1",
        port: int = 0,
        log_path: Path | None = None,
        rpm_limit: int | None = None,
    ) -> None:
        self._address = (host, port)
        self._log_path = log_path
        self._responder = _Responder(script, rpm_limit)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._log_file: TextIO | None = None

    def start(self) -> Self:
        """Bind and serve on a daemon thread; returns once the socket is listening."""
        if self._httpd is not None:
            raise RuntimeError("the scripted model server is already running")
        httpd = _HTTPServer(self._address, self._responder)
        if self._log_path is not None:
            self._log_file = self._log_path.open("a", encoding="utf-8")
            self._responder.attach_log(self._log_file)
        self._httpd = httpd
        # A short poll interval keeps stop() fast; the loop is idle otherwise.
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="scripted-model-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close open connections and the log file. Safe to call twice."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.stopping.set()
        httpd.shutdown()
        httpd.close_connections()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join()
        self._responder.attach_log(None)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the scripted model server is not running")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self._address[0]}:{self.port}"

    def requests(self) -> list[JSON]:
        """Every request recorded since start or the last reset, oldest first."""
        return self._responder.records()

    def reset(self) -> None:
        """Clear the recorded requests and the error-attempt counters."""
        self._responder.reset()

    def first_deltas(self) -> list[float]:
        """When each streamed answer's first text delta went out (time.time()), in order."""
        return list(self._httpd.first_deltas) if self._httpd is not None else []

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def serve(
    script_path: Path,
    host: str = "127.0.0.1",
    port: int = 0,
    log_path: Path | None = None,
    rpm_limit: int | None = None,
) -> None:
    """Serve ``script_path`` until SIGINT or SIGTERM."""
    script = load_script(script_path)
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # Only note it: taking locks in a signal handler can deadlock the interrupted thread.
        received.append(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with ScriptedModelServer(script, host, port, log_path, rpm_limit) as server:
            print(f"scripted model listening on {server.url}", flush=True)
            while not received:
                time.sleep(0.1)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ledgerloop.models.scripted_server",
        description="Serve a scripted Anthropic Messages API.",
    )
    parser.add_argument("--script", type=Path, required=True, help="YAML script file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--log", type=Path, default=None, help="append one JSON line per request")
    parser.add_argument(
        "--rpm-limit", type=int, default=None, help="answer 429 past this many requests a minute"
    )
    args = parser.parse_args(argv)
    try:
        serve(args.script, args.host, args.port, args.log, args.rpm_limit)
    except ScriptError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
