"""MCP ticket servers that answer some tools/call requests with garbage, after running them.

Over streamable HTTP, an ASGI wrapper lets the real server run the call (a write does
happen), throws its answer away and sends one of:

- ``"not-json"``: a 200 ``application/json`` body that is not JSON;
- ``"bad-result"``: a well-formed JSON-RPC response whose result is not a CallToolResult.

Over stdio: tests.support.garbled_stdio.
"""

from __future__ import annotations

import json
from typing import Any

from ledgerloop.examples.mcp_ticket_server import McpTicketServerThread
from tests.support.garbled_stdio import NOT_JSON, call_of


class GarbledMcpServerThread(McpTicketServerThread):
    """The HTTP ticket server; the tools in `garble` get their answers replaced."""

    def __init__(self, garble: dict[str, str]) -> None:
        super().__init__()
        self.garble = garble

    def app(self) -> Any:
        inner = super().app()
        garble = self.garble

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http" or scope["method"] != "POST":
                await inner(scope, receive, send)
                return
            chunks = []
            while True:
                event = await receive()
                chunks.append(event.get("body", b""))
                if not event.get("more_body"):
                    break
            body = b"".join(chunks)
            request_id, tool = call_of(body)
            replayed = False

            async def replay() -> Any:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            mode = garble.get(tool or "")
            if mode is None:
                await inner(scope, replay, send)
                return

            async def discard(event: Any) -> None:
                return None

            await inner(scope, replay, discard)  # the tool runs; its answer is lost
            if mode == "not-json":
                payload = NOT_JSON
            else:
                result = {"content": "not a list", "isError": "perhaps"}
                payload = json.dumps(
                    {"jsonrpc": "2.0", "id": request_id, "result": result}
                ).encode()
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": payload})

        return app
