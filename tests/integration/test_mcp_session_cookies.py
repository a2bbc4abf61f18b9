"""An MCP connection is one session shared by every run: it keeps its server's cookies (a
load balancer's affinity cookie), unlike the relay's client for HTTP destinations, which
keeps none (test_effect_relay)."""

from __future__ import annotations

import asyncio
from typing import Any

from ledgerloop.effects.delivery import Verdict
from ledgerloop.examples.mcp_ticket_server import McpTicketServerThread
from ledgerloop.mcptools.calls import call_tool
from ledgerloop.mcptools.client import McpConnections
from ledgerloop.tools.policy import McpServer


class AffinityMcpServerThread(McpTicketServerThread):
    """The HTTP ticket server behind a 'load balancer' that sets an affinity cookie and
    notes the Cookie header of every request it passes on."""

    def __init__(self) -> None:
        super().__init__()
        self.cookies: list[str | None] = []

    def app(self) -> Any:
        inner = super().app()
        seen = self.cookies

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await inner(scope, receive, send)
                return
            headers = dict(scope["headers"])
            cookie = headers.get(b"cookie")
            seen.append(cookie.decode() if cookie is not None else None)

            async def with_cookie(event: Any) -> None:
                if event["type"] == "http.response.start":
                    event = {
                        **event,
                        "headers": [*event.get("headers", []), (b"set-cookie", b"backend=b1")],
                    }
                await send(event)

            await inner(scope, receive, with_cookie)

        return app


def test_an_mcp_session_keeps_the_affinity_cookie_its_server_set() -> None:
    with AffinityMcpServerThread() as server:
        config = McpServer(
            transport="streamable_http", url=server.url, read_tools=("search_tickets",)
        )

        async def two_calls() -> None:
            connections = McpConnections()
            try:
                for word in ("disk", "printer"):
                    outcome = await call_tool(
                        connections, "tickets", config, "search_tickets", {"word": word}
                    )
                    assert outcome.delivery.verdict is Verdict.SUCCEEDED, outcome.delivery
            finally:
                await connections.aclose()

        asyncio.run(two_calls())
    # The handshake's first request carries none; every request after the cookie was set
    # carries it, the second tool call included.
    assert server.cookies[0] is None
    assert len(server.cookies) >= 3
    assert all(cookie == "backend=b1" for cookie in server.cookies[1:]), server.cookies
