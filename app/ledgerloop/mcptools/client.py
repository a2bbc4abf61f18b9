"""Connections to MCP servers (the official `mcp` SDK), over stdio or streamable HTTP.

One connection per server per event loop, opened on first use and reopened after a failure.
The SDK's client is an anyio context that must be entered and left by the same task, so each
connection lives in a task of its own and calls are made from any task through it.

Every tools/call carries the effect's idempotency key in the request's `_meta` under
`META_IDEMPOTENCY_KEY`, so a server can recognise a repeat of the same call.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from ledgerloop.tools.policy import McpServer

log = logging.getLogger(__name__)

#: The `_meta` key an MCP write call carries its idempotency key under.
META_IDEMPOTENCY_KEY = "io.ledgerloop/idempotency-key"
#: What a connection waits for the server's handshake before giving up.
CONNECT_TIMEOUT_S = 15.0


class McpUnreachable(Exception):
    """The connection could not be made: nothing was sent to the server."""


@dataclass
class McpConnection:
    name: str
    server: McpServer
    client: Client | None = None
    session_id: str | None = None
    _close: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    @property
    def network_transport(self) -> str:
        return "pipe" if self.server.transport == "stdio" else "tcp"

    @property
    def address(self) -> tuple[str | None, int | None]:
        if self.server.url is None:
            return None, None
        parts = urlsplit(self.server.url)
        return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)

    @property
    def protocol_version(self) -> str | None:
        with contextlib.suppress(Exception):
            return self.client.protocol_version if self.client else None
        return None

    def _target(self, stack: contextlib.AsyncExitStack) -> Any:
        server = self.server
        if server.transport == "stdio":
            command = [sys.executable if part == "{python}" else part for part in server.command]
            return StdioServerParameters(command=command[0], args=command[1:], env=server.env)

        async def remember_session(response: httpx2.Response) -> None:
            sid = response.headers.get("mcp-session-id")
            if sid:
                self.session_id = sid

        http = httpx2.AsyncClient(event_hooks={"response": [remember_session]})
        # The SDK leaves a client it was given open: ours closes with the connection, or a
        # connection dropped after garbage would leak its sockets.
        stack.push_async_callback(http.aclose)
        assert server.url is not None
        return streamable_http_client(server.url, http_client=http)

    async def open(self) -> None:
        ready = asyncio.Event()
        # A context of its own: the SDK's requests on this task (the handshake) must not
        # land on whatever span was current where the connection was first needed.
        self._task = asyncio.create_task(
            self._hold(ready), name=f"mcp-{self.name}", context=contextvars.Context()
        )
        waiter = asyncio.ensure_future(ready.wait())
        try:
            done, _ = await asyncio.wait(
                {waiter, self._task},
                timeout=CONNECT_TIMEOUT_S,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            waiter.cancel()
        if not ready.is_set():
            await self.close()
            reason = "no handshake in time"
            if self._task in done and self._task.exception() is not None:
                reason = _describe(self._task.exception())
            raise McpUnreachable(f"cannot connect to MCP server {self.name}: {reason}")

    async def _hold(self, ready: asyncio.Event) -> None:
        # mode="legacy": the initialize handshake every server speaks, and a session id over
        # HTTP (Mcp-Session-Id) for the spans.
        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(
                Client(self._target(stack), mode="legacy", cache=None)
            )
            self.client = client
            ready.set()
            await self._close.wait()

    async def close(self) -> None:
        self._close.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 5)
            except BaseException:
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task
        self.client = None

    @property
    def alive(self) -> bool:
        return self.client is not None and self._task is not None and not self._task.done()


class McpConnections:
    """The connections of one event loop (a worker's, or a relay's)."""

    def __init__(self) -> None:
        self._open: dict[str, McpConnection] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, name: str, server: McpServer) -> McpConnection:
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            conn = self._open.get(name)
            if conn is not None and conn.alive and conn.server == server:
                return conn
            if conn is not None:
                await conn.close()
            conn = McpConnection(name, server)
            await conn.open()
            self._open[name] = conn
            return conn

    async def discard(self, name: str) -> None:
        conn = self._open.pop(name, None)
        if conn is not None:
            await conn.close()

    async def aclose(self) -> None:
        for name in list(self._open):
            await self.discard(name)


# Keyed by the loop itself, weakly: a loop that is gone takes its pool with it, and a new
# loop that happens to get a dead loop's id() never inherits connections bound to it.
_PER_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, McpConnections] = (
    weakref.WeakKeyDictionary()
)


def connections() -> McpConnections:
    """This event loop's connections (the worker's steps share them)."""
    loop = asyncio.get_running_loop()
    pool = _PER_LOOP.get(loop)
    if pool is None:
        pool = _PER_LOOP[loop] = McpConnections()
    return pool


async def close_connections() -> None:
    """Close this event loop's connections; a worker calls it before its loop ends.

    Left to the loop's own shutdown, a connection's task is cancelled together with
    whatever its HTTP client starts while unwinding, and a task started then never runs:
    the loop closes with it pending.
    """
    pool = _PER_LOOP.pop(asyncio.get_running_loop(), None)
    if pool is not None:
        await pool.aclose()


def _describe(exc: BaseException | None) -> str:
    """One line for an error, unwrapping anyio's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if exc is None:
        return "unknown error"
    return f"{type(exc).__name__}: {exc}"[:300]


describe = _describe
