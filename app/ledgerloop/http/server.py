"""Serving the app inside a running event loop: `ledgerloop up` runs it beside the worker.

uvicorn serves on a socket bound here (so a busy port is one clear error, not uvicorn's
sys.exit), with its signal handling off (the embedding process owns SIGINT/SIGTERM and sets
`stop`) and the app's lifespan entered here (so a failing startup raises, instead of exiting
the process). Setting `stop` drains open requests for up to GRACEFUL_S, then closes.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from ledgerloop.agent.definition import agents
from ledgerloop.errors import LedgerloopError
from ledgerloop.http.app import create_app
from ledgerloop.runtime import Runtime

log = logging.getLogger("ledgerloop.http")

GRACEFUL_S = 10


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


async def run_server(app: FastAPI, sock: socket.socket, stop: asyncio.Event) -> None:
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
        async with app.router.lifespan_context(app):
            serving = asyncio.create_task(server.serve(sockets=[sock]))
            stopped = asyncio.create_task(stop.wait())
            try:
                await asyncio.wait({serving, stopped}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
                server.should_exit = True
                # Awaited even when this task was cancelled: open requests finish first.
                await serving
    finally:
        sock.close()


async def serve_http(runtime: Runtime, stop: asyncio.Event) -> None:
    """The `http` service of `ledgerloop up`: the API and the approval page."""
    settings = runtime.settings
    # A failure here (the port is taken) stops the worker; run_worker re-raises it, so
    # `ledgerloop up` exits 2 with that one line.
    sock = listen(settings.http_host, settings.http_port)
    app = create_app(runtime.database_url, agent_names=agents())
    await run_server(app, sock, stop)
