"""The FastAPI application: the /v1 API, the approval page and /healthz.

`create_app` takes the database URL and the registered agent names; the lifespan opens a
connection pool and a DBOS client (for reading steps) and closes both on shutdown. Endpoints
are plain `def`: the stores are synchronous, and FastAPI runs such endpoints in its thread
pool, each on its own pooled connection.
"""

from __future__ import annotations

import asyncio
import email.message
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from psycopg_pool import ConnectionPool
from pydantic import BaseModel
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ledgerloop.config import load_settings
from ledgerloop.control.timeline import dbos_client
from ledgerloop.db.connect import Conn, make_pool
from ledgerloop.db.footprint import HTTP_POOL
from ledgerloop.errors import LedgerloopError
from ledgerloop.http.errors import (
    PayloadTooLarge,
    UnsupportedMediaType,
    install_error_handlers,
    ledgerloop_error_response,
    responses,
)
from ledgerloop.http.page import router as page_router
from ledgerloop.http.routes_approvals import router as approvals_router
from ledgerloop.http.routes_effects import router as effects_router
from ledgerloop.http.routes_events import READS_AT_ONCE, read_as_owner, read_text_as_owner
from ledgerloop.http.routes_events import router as events_router
from ledgerloop.http.routes_messages import router as messages_router
from ledgerloop.http.routes_runs import router as runs_router
from ledgerloop.http.routes_schedules import router as schedules_router
from ledgerloop.pricing import ModelPrice
from ledgerloop.streams.hub import RunEventHub
from ledgerloop.streams.source import NotificationSource, PgListener

#: The largest request body accepted (the SQL start_run's input limit is the same 256 KiB).
MAX_BODY_BYTES = 256 * 1024


def _version() -> str:
    try:
        return version("ledgerloop")
    except PackageNotFoundError:  # running from a checkout that was never installed
        return "0+unknown"


class Health(BaseModel):
    status: Literal["ok"]


def create_app(
    database_url: str,
    *,
    agent_names: Iterable[str],
    pool_max_size: int | None = None,
    notifications: NotificationSource | None = None,
    prices: Mapping[str, ModelPrice] | None = None,
    pool: ConnectionPool[Conn] | None = None,
    dbos: Any = None,
) -> FastAPI:
    """`notifications`: where the run event streams hear of new events; by default a
    LISTEN connection of the app's own (streams/source.py). `prices`: the model price table
    timelines are costed by (LEDGERLOOP_MODEL_PRICES). `pool` and `dbos` (DBOS itself or a
    DBOSClient, for reading steps): borrowed from the embedding process (`ledgerloop up`: the
    worker's), which opens and closes them; by default the app opens its own, within
    LEDGERLOOP_MAX_CONNECTIONS (`pool_max_size`, default: its share of it)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Both open synchronously (the pool waits for its first connection): off the loop,
        # so an embedding process's other tasks keep running meanwhile.
        own_pool = own_dbos = None
        if pool is None:
            size = pool_max_size or load_settings().footprint("http").pool(HTTP_POOL)
            own_pool = await asyncio.to_thread(
                make_pool, database_url, min_size=1, max_size=size, name="ledgerloop-http"
            )
        if dbos is None:
            try:
                own_dbos = await asyncio.to_thread(dbos_client, database_url)
            except BaseException:
                if own_pool is not None:
                    await asyncio.to_thread(own_pool.close)
                raise
        app.state.pool, app.state.dbos = pool or own_pool, dbos or own_dbos
        # One listener for every stream this process serves (streams/hub.py), unless the
        # process hands its own source in.
        listener: PgListener | None = None
        source = notifications
        if source is None:
            source = listener = PgListener(database_url)
        app.state.stream_reads = asyncio.Semaphore(READS_AT_ONCE)
        app.state.hub = RunEventHub(source, read_as_owner(app), read_text_as_owner(app))
        app.state.closing = asyncio.Event()
        app.state.hub.start()
        try:
            yield
        finally:
            app.state.closing.set()
            app.state.hub.stop()
            if listener is not None:
                await asyncio.to_thread(listener.close)
            if own_dbos is not None:
                await asyncio.to_thread(own_dbos.destroy)
            if own_pool is not None:
                await asyncio.to_thread(own_pool.close)

    app = FastAPI(
        title="Ledgerloop",
        version=_version(),
        summary="Durable, Postgres-native workflows for tool-using AI agents",
        lifespan=lifespan,
        # No Swagger UI: it loads its scripts from a CDN. The spec is at /openapi.json.
        docs_url=None,
        redoc_url=None,
    )
    app.state.agent_names = frozenset(agent_names)
    app.state.prices = dict(prices or {})
    install_error_handlers(app)
    app.add_middleware(BodyGuard)
    app.include_router(runs_router)
    app.include_router(events_router)
    app.include_router(messages_router)
    app.include_router(approvals_router)
    app.include_router(effects_router)
    app.include_router(schedules_router)
    app.include_router(page_router)

    def openapi() -> dict[str, Any]:
        # The agent names belong to this app, not to the StartRun model: add them to the
        # spec, so clients (and the fuzz test) know the valid ones. Validation stays in the
        # route, where an unknown name gets an answer listing the known ones.
        if app.openapi_schema is None:
            spec = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            if app.state.agent_names:
                agent = spec["components"]["schemas"]["StartRun"]["properties"]["agent"]
                agent["enum"] = sorted(app.state.agent_names)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/healthz", tags=["health"], response_model=Health, responses=responses(503))
    def healthz(request: Request) -> Health:
        """Answers when the server can reach its database; needs no token."""
        with request.app.state.pool.connection(timeout=5) as conn:
            conn.execute("SELECT 1")
        return Health(status="ok")

    return app


class BodyGuard:
    """Requests with a body: JSON only (415) and at most MAX_BODY_BYTES (413), checked before
    anything reads the body. FastAPI would hand a non-JSON body to validation as raw bytes
    (a confusing 422); Starlette's own size limit answers in plain text, not our error JSON.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        length = headers.get("content-length")
        has_body = (length is not None and length != "0") or "transfer-encoding" in headers
        error: LedgerloopError | None = None
        if has_body and not _is_json(headers.get("content-type")):
            error = UnsupportedMediaType(
                f"the request body is {headers.get('content-type') or 'untyped'}, not JSON",
                fix="send the body as JSON with Content-Type: application/json",
            )
        elif length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            error = PayloadTooLarge()
        if error is not None:
            await ledgerloop_error_response(error)(scope, receive, send)
            return
        await self.app(scope, _limited(receive), send)


def _limited(receive: Receive) -> Receive:
    """`receive` that refuses a body growing past the limit (one sent without a length)."""
    total = 0

    async def limited() -> Message:
        nonlocal total
        message = await receive()
        if message["type"] == "http.request":
            total += len(message.get("body", b""))
            if total > MAX_BODY_BYTES:
                # An HTTPException: FastAPI passes it through its body parsing unchanged,
                # where any other exception would become a generic 400.
                raise HTTPException(413)
        return message

    return limited


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )
