"""A ticket-creating HTTP downstream that counts what it really created.

Three kinds of create endpoint model the three downstreams an outbox relay meets:
`/idempotent` honours `Idempotency-Key`, `/lookup` does not but can be asked what a key created,
and `/plain` offers neither. Faults armed through `POST /_faults` (see `ticket_faults`) make it
refuse, stall, garble or drop answers, and `GET /_stats` says how many tickets exist, so tests
can prove exactly-once delivery against the count rather than against what the client saw.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import threading
import time
from collections.abc import Sequence
from typing import Annotated

import uvicorn
from fastapi import FastAPI, Header
from starlette.responses import JSONResponse, Response
from uvicorn.config import LOGGING_CONFIG

from ledgerloop.examples.ticket_faults import (
    KINDS,
    REFUSING_MODES,
    DropConnectionResponse,
    FaultSpec,
    Kind,
    garbage_response,
    hide_deliberate_drops,
    refusal_response,
)
from ledgerloop.examples.ticket_store import (
    KEY_REUSE_DETAIL,
    KeyReuseError,
    Ticket,
    TicketIn,
    TicketStore,
)

__all__ = ["Kind", "Ticket", "TicketIn", "TicketServiceThread", "create_app", "main", "serve"]

IdempotencyKey = Annotated[
    str | None, Header(alias="Idempotency-Key", min_length=1, max_length=255)
]


def _ticket_json(ticket: Ticket) -> dict[str, object]:
    return ticket.model_dump(mode="json")


async def _create(
    store: TicketStore, kind: Kind, ticket_in: TicketIn, key: str | None, traceparent: str | None
) -> Response:
    store.note_traceparent(traceparent)
    fault = store.begin_request(kind)
    if fault is not None and fault.mode in REFUSING_MODES:
        return refusal_response(fault.mode)
    try:
        ticket, replayed = store.create(kind, ticket_in, key)
    except KeyReuseError:
        return JSONResponse({"detail": KEY_REUSE_DETAIL}, status_code=422)
    # Every remaining fault strikes after the commit: that is what makes the outcome ambiguous.
    if fault is not None:
        if fault.mode == "commit_then_drop":
            return DropConnectionResponse()
        if fault.mode == "garbage":
            return garbage_response()
        # slow: committed already, so a client that gives up early still left a ticket behind.
        await asyncio.sleep(fault.delay_ms / 1000)
    if replayed:
        return JSONResponse(
            _ticket_json(ticket), status_code=200, headers={"Idempotent-Replayed": "true"}
        )
    return JSONResponse(_ticket_json(ticket), status_code=201)


def _add_create_route(app: FastAPI, store: TicketStore, kind: Kind) -> None:
    async def create_ticket(
        ticket_in: TicketIn,
        idempotency_key: IdempotencyKey = None,
        traceparent: Annotated[str | None, Header(max_length=256)] = None,
    ) -> Response:
        return await _create(store, kind, ticket_in, idempotency_key, traceparent)

    app.add_api_route(
        f"/{kind}/tickets",
        create_ticket,
        methods=["POST"],
        status_code=201,
        name=f"create_{kind}_ticket",
    )


def _not_found(what: str) -> JSONResponse:
    return JSONResponse({"detail": f"{what} not found"}, status_code=404)


def create_app() -> FastAPI:
    """A ticket service with its own, empty state."""
    store = TicketStore()
    app = FastAPI(title="Ledgerloop ticket service", docs_url=None, redoc_url=None)
    app.state.store = store
    for kind in KINDS:
        _add_create_route(app, store, kind)

    @app.get("/idempotent/tickets/by-key/{key:path}")
    async def idempotent_by_key(key: str) -> Response:
        ticket = store.idempotent_by_key(key)
        return JSONResponse(_ticket_json(ticket)) if ticket else _not_found("key")

    @app.get("/lookup/tickets/by-key/{key:path}")
    async def lookup_by_key(key: str) -> Response:
        tickets = store.lookup_by_key(key)
        if not tickets:
            return _not_found("key")
        return JSONResponse({"tickets": [_ticket_json(t) for t in tickets]})

    @app.get("/tickets/{ticket_id}")
    async def get_ticket(ticket_id: str) -> Response:
        ticket = store.get(ticket_id)
        return JSONResponse(_ticket_json(ticket)) if ticket else _not_found("ticket")

    @app.post("/tickets/{ticket_id}/close")
    async def close_ticket(ticket_id: str) -> Response:
        closed = store.close(ticket_id)
        if closed is None:
            return _not_found("ticket")
        return JSONResponse({"id": ticket_id, "closed": True, "already_closed": not closed})

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/_stats")
    async def stats() -> dict[str, object]:
        return store.stats()

    @app.get("/_traceparents")
    async def traceparents() -> list[str | None]:
        """The W3C traceparent of every create request, in order (None: it had none)."""
        return store.traceparents()

    @app.post("/_faults", status_code=201)
    async def add_fault(spec: FaultSpec) -> dict[str, object]:
        return {"faults": store.add_fault(spec)}

    @app.get("/_faults")
    async def list_faults() -> dict[str, object]:
        return {"faults": store.faults()}

    @app.delete("/_faults")
    async def clear_faults() -> dict[str, object]:
        store.clear_faults()
        return {"faults": []}

    @app.post("/_reset")
    async def reset() -> dict[str, object]:
        store.reset()
        return store.stats()

    return app


def _bind(host: str, port: int) -> socket.socket:
    """Bind and listen before uvicorn starts, so port 0 is known and early clients queue."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Name the protocol: asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP,
    # and without it Nagle plus delayed ACKs add ~40 ms to every keep-alive request.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _server(app: FastAPI, *, log_level: str, log_config: bool) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        # h11 pinned: commit_then_drop relies on how the server aborts a started response.
        http="h11",
        lifespan="off",
        log_level=log_level,
        # In-process servers leave logging to the host (pytest); uvicorn's dictConfig would not.
        log_config=LOGGING_CONFIG if log_config else None,
        access_log=False,
        # A request parked by a `slow` fault must not hold up shutdown for long.
        timeout_graceful_shutdown=5,
    )
    hide_deliberate_drops()  # after Config: it may configure logging
    return uvicorn.Server(config)


def serve(host: str, port: int, *, log_level: str = "warning") -> None:
    """Run the service until SIGINT or SIGTERM, after printing the URL it listens on.

    Quiet by default: a parent process that pipes stderr without reading it would otherwise
    block the service once the pipe fills up.
    """
    sock = _bind(host, port)
    try:
        server = _server(create_app(), log_level=log_level, log_config=True)
        print(f"ticket service listening on {_url(host, sock.getsockname()[1])}", flush=True)
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        # uvicorn shuts down gracefully, then re-raises the SIGINT it captured: Ctrl-C is the
        # normal way to stop a demo service, so end quietly instead of with a traceback.
        pass
    finally:
        sock.close()


class TicketServiceThread:
    """The ticket service on a background thread, for tests and benchmarks in one process."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self.app = create_app()
        self._sock: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL; known once started (port 0 is resolved to the bound port)."""
        if self.port == 0:
            raise RuntimeError("ticket service has not been started")
        return _url(self.host, self.port)

    def start(self, timeout: float = 10.0) -> None:
        """Start serving; returns once the server accepts connections."""
        if self._thread is not None:
            raise RuntimeError("ticket service already started")
        self._sock = _bind(self.host, self.port)
        self.port = self._sock.getsockname()[1]
        self._server = server = _server(self.app, log_level="warning", log_config=False)
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [self._sock]}, name="ticket-service", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not self._thread.is_alive():
                self.stop()
                raise RuntimeError("ticket service thread exited during startup")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"ticket service did not start within {timeout}s")
            time.sleep(0.005)

    def stop(self, timeout: float = 10.0) -> None:
        """Shut down gracefully and release the port; safe to call twice."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RuntimeError(f"ticket service did not stop within {timeout}s")
        if self._sock is not None:
            self._sock.close()  # uvicorn closes it too; this covers a failed startup
        self._thread = None
        self._server = None
        self._sock = None

    def __enter__(self) -> TicketServiceThread:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m ledgerloop.examples.ticket_service --port N`."""
    parser = argparse.ArgumentParser(description="Run the Ledgerloop example ticket service.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning"])
    args = parser.parse_args(argv)
    serve(args.host, args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
