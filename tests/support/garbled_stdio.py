"""An MCP stdio server that prints garbage: `python -m tests.support.garbled_stdio TOOL...`.

It runs the example ticket server as its child and passes every line through, except the
answers to tools/call for TOOL (the call did run), which become a line of non-JSON text.
Standard library only, so it starts quickly.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

NOT_JSON = b"<html>502 Bad Gateway</html>"


def call_of(body: bytes) -> tuple[Any, str | None]:
    """The JSON-RPC id and tool name of a tools/call request (None: not one)."""
    try:
        message = json.loads(body)
    except ValueError:
        return None, None
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return None, None
    return message.get("id"), (message.get("params") or {}).get("name")


def relay_stdio(garbled: set[str]) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "ledgerloop.examples.mcp_ticket_server"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    pending: set[Any] = set()
    lock = threading.Lock()

    def upstream() -> None:
        assert child.stdin is not None
        for line in sys.stdin.buffer:
            request_id, tool = call_of(line)
            if tool in garbled:
                with lock:
                    pending.add(request_id)
            child.stdin.write(line)
            child.stdin.flush()
        child.stdin.close()

    threading.Thread(target=upstream, daemon=True).start()
    out = sys.stdout.buffer
    for line in child.stdout:
        try:
            request_id = json.loads(line).get("id")
        except (ValueError, AttributeError):
            request_id = None
        with lock:
            hit = request_id is not None and request_id in pending
            pending.discard(request_id)
        out.write(NOT_JSON + b"\n" if hit else line)
        out.flush()
    child.wait()


if __name__ == "__main__":
    relay_stdio(set(sys.argv[1:]))
