"""The example ticket system as an MCP server (the official `mcp` SDK), over stdio or HTTP.

Tools:

- `create_ticket` (a write): honours the idempotency key a client puts in the request's
  `_meta` under `io.ledgerloop/idempotency-key`: a repeat returns the original ticket.
  Both creates keep the `traceparent` of the request's `_meta` (`store.traceparents()`).
- `create_ticket_unkeyed` (a write): ignores the key (a downstream with no idempotency).
- `find_ticket_by_key` (a read): the tickets a key created, `{"tickets": [...]}`: the lookup
  the reconciler uses.
- `search_tickets` (a read): tickets whose title contains a word.

    python -m ledgerloop.examples.mcp_ticket_server                 # stdio
    python -m ledgerloop.examples.mcp_ticket_server --http 8766     # http://127.0.0.1:8766/mcp

The HTTP server keeps its tickets in memory for as long as it runs; the stdio one for as
long as its client keeps it.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any, Literal

import uvicorn
from mcp.server.mcpserver import Context, MCPServer

from ledgerloop.examples.ticket_store import Ticket, TicketIn, TicketStore

META_IDEMPOTENCY_KEY = "io.ledgerloop/idempotency-key"


def _json(ticket: Ticket) -> dict[str, Any]:
    return ticket.model_dump(mode="json")


def _meta_str(ctx: Context, name: str) -> str | None:
    meta = ctx.request_context.meta
    value = meta.get(name) if meta else None
    return value if isinstance(value, str) and value else None


def _key(ctx: Context) -> str | None:
    return _meta_str(ctx, META_IDEMPOTENCY_KEY)


def _note_trace(store: TicketStore, ctx: Context) -> None:
    # The trace context a client injects into `_meta` (MCP's carrier, unprefixed
    # `traceparent`), kept like the HTTP service keeps its header: a demo or test can follow
    # the trace from a ticket's create request back to the run.
    store.note_traceparent(_meta_str(ctx, "traceparent"))


def build_server(store: TicketStore) -> MCPServer:
    server = MCPServer("ledgerloop-tickets")

    @server.tool(description="File a ticket. A repeated idempotency key returns the original.")
    async def create_ticket(
        title: str,
        ctx: Context,
        body: str = "",
        priority: Literal["low", "normal", "high"] = "normal",
    ) -> dict[str, Any]:
        _note_trace(store, ctx)
        ticket, _ = store.create(
            "idempotent", TicketIn(title=title, body=body, priority=priority), _key(ctx)
        )
        return _json(ticket)

    @server.tool(description="File a ticket (this endpoint ignores idempotency keys).")
    async def create_ticket_unkeyed(
        title: str,
        ctx: Context,
        body: str = "",
        priority: Literal["low", "normal", "high"] = "normal",
    ) -> dict[str, Any]:
        _note_trace(store, ctx)
        ticket, _ = store.create("plain", TicketIn(title=title, body=body, priority=priority), None)
        return _json(ticket)

    @server.tool(description="The tickets created with an idempotency key.")
    async def find_ticket_by_key(idempotency_key: str) -> dict[str, Any]:
        found = store.lookup_by_key(idempotency_key)
        keyed = store.idempotent_by_key(idempotency_key)
        tickets = [*found, *([keyed] if keyed is not None and keyed not in found else [])]
        return {"tickets": [_json(t) for t in tickets]}

    @server.tool(description="Tickets whose title contains the word.")
    async def search_tickets(word: str) -> dict[str, Any]:
        hits = [t for t in store.all() if word.lower() in t.title.lower()]
        return {"tickets": [_json(t) for t in hits]}

    return server


class McpTicketServerThread:
    """The HTTP MCP server on a background thread (tests, demos); `.store` is its state."""

    def __init__(self, store: TicketStore | None = None, port: int = 0) -> None:
        self.store = store or TicketStore()
        self.port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def app(self) -> Any:
        """The ASGI application served (a test may wrap it)."""
        return build_server(self.store).streamable_http_app()

    def start(self, timeout: float = 20.0) -> McpTicketServerThread:
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", self.port))
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(self.app(), log_level="warning", log_config=None)
        self._server = server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [self._sock]}, daemon=True, name="mcp-tickets"
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the MCP ticket server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = None

    def __enter__(self) -> McpTicketServerThread:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The example ticket system as an MCP server.")
    parser.add_argument("--http", type=int, default=None, help="serve streamable HTTP here")
    args = parser.parse_args(argv)
    server = build_server(TicketStore())
    if args.http is None:
        server.run("stdio")
        return
    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=args.http, log_level="warning")


if __name__ == "__main__":
    main()
