"""Serving the app inside a running event loop: `ledgerloop up` runs it beside the worker.

uvicorn serves on a socket bound here (so a busy port is one clear error, not uvicorn's
sys.exit), with its signal handling off (the embedding process owns SIGINT/SIGTERM and sets
`stop`) and the app's lifespan entered here (so a failing startup raises, instead of exiting
the process). Setting `stop` drains open requests for up to GRACEFUL_S, then closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from ledgerloop.agent.definition import agents
from ledgerloop.errors import LedgerloopError
from ledgerloop.failures import is_transient
from ledgerloop.http.app import create_app
from ledgerloop.runtime import Runtime

log = logging.getLogger("ledgerloop.http")

GRACEFUL_S = 10
#: How often a server waiting for the database tries its lifespan again.
RETRY_S = 1.0


class HttpListenError(LedgerloopError):
    """The HTTP server cannot listen on its address."""


class _EmbeddedServer(uvicorn.Server):
    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn would replace the embedding process's handlers and re-raise the signal
        # after serving; `stop` is how this server is told to finish.
        yield


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: any free port)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
        )[0]
        # proto must say TCP: asyncio sets TCP_NODELAY only on sockets that do, and without
        # it every keep-alive response waits ~40 ms for the client's delayed ACK.
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(2048)
        except OSError:
            sock.close()
            raise
        return sock
    except OSError as exc:
        raise HttpListenError(
            f"cannot serve HTTP on {host}:{port}: {exc.strerror or exc}",
            fix="set LEDGERLOOP_HTTP_PORT (and LEDGERLOOP_HTTP_HOST) to a free address, "
            "or run `ledgerloop up --no-http`",
        ) from exc


async def _enter_lifespan(
    app: FastAPI, stack: contextlib.AsyncExitStack, stop: asyncio.Event, wait_for_database: bool
) -> bool:
    """Enter the app's lifespan (it opens the API's pool); False if `stop` came first.

    With `wait_for_database`, a database that is away is waited for, once a second: inside
    `ledgerloop up` the database was there a moment ago, and an outage that begins as the
    server starts must not end the worker.
    """
    said = False
    while True:
        try:
            await stack.enter_async_context(app.router.lifespan_context(app))
            return True
        except Exception as exc:
            if not (wait_for_database and is_transient(exc)):
                raise
            if not said:
                log.warning("the HTTP API waits for the database: %s", exc)
                said = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), RETRY_S)
        if stop.is_set():
            return False


async def run_server(
    app: FastAPI, sock: socket.socket, stop: asyncio.Event, *, wait_for_database: bool = False
) -> None:
    """Serve `app` on `sock` until `stop` is set (or this task is cancelled), then drain."""
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_config=None,  # leave the process's logging configuration alone
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_S,
    )
    server = _EmbeddedServer(config)
    try:
        async with contextlib.AsyncExitStack() as lifespan:
            if not await _enter_lifespan(app, lifespan, stop, wait_for_database):
                return
            serving = asyncio.create_task(server.serve(sockets=[sock]))
            stopped = asyncio.create_task(stop.wait())
            try:
                await asyncio.wait({serving, stopped}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
                server.should_exit = True
                # Open event streams end now instead of holding the drain to its timeout.
                closing = getattr(app.state, "closing", None)
                if closing is not None:
                    closing.set()
                # Awaited even when this task was cancelled: open requests finish first.
                await serving
    finally:
        sock.close()


async def serve_http(runtime: Runtime, stop: asyncio.Event) -> None:
    """The `http` service of `ledgerloop up`: the API and the approval page."""
    settings = runtime.settings
    # A failure here (the port is taken) stops the worker; run_worker re-raises it, so
    # `ledgerloop up` exits 2 with that one line.
    from dbos import DBOS

    sock = listen(settings.http_host, settings.http_port)
    # The worker's pool, DBOS and LISTEN connection: the API opens no connection of its own.
    app = create_app(
        runtime.database_url,
        agent_names=agents(),
        pool=runtime.pool,
        dbos=DBOS,
        notifications=runtime.notifications,
        prices=settings.model_prices,
    )
    await run_server(app, sock, stop, wait_for_database=True)
