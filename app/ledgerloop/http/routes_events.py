"""GET /v1/runs/{run_id}/events: a run's events as Server-Sent Events, resumable.

The route holds no database connection and no worker thread while it streams: it borrows a
pooled connection for the authorization and each replay page, then waits on the process's
hub (streams/hub.py), which reads each run's new events once for all of its subscribers.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request
from fastapi.responses import StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials

from ledgerloop.approvals.errors import Unauthenticated
from ledgerloop.approvals.principals import principal_authenticate
from ledgerloop.db.connect import tenant_scope
from ledgerloop.errors import LedgerloopError
from ledgerloop.http.auth import bearer
from ledgerloop.http.errors import responses
from ledgerloop.runs.store import RunNotFound
from ledgerloop.streams.feed import Page, StreamEvent, finished_event, read_page, read_text
from ledgerloop.streams.hub import Reader, RunEventHub, TextReader

router = APIRouter(prefix="/v1/runs", tags=["runs"])

#: A comment line this often keeps proxies from closing an idle stream.
KEEPALIVE_S = 15.0

#: Stream reads (authorizations, replay pages, the hub's reads) in flight at once: a burst of
#: subscribers queues here instead of growing the API's pool by a connection each.
READS_AT_ONCE = 2


class BadLastEventId(LedgerloopError):
    """The stream cannot resume from the given event id."""


def _resume_point(after: str | None, last_event_id: str | None) -> int:
    given = last_event_id if last_event_id is not None else after
    if given is None or given == "":
        return -1
    name = "Last-Event-ID" if last_event_id is not None else "after"
    if not given.strip().lstrip("-").isdigit() or int(given) < -1:
        raise BadLastEventId(
            f"{name} {given[:40]!r} is not an event id",
            fix="send the `id:` of the last event received (a whole number), or none to "
            "start from the beginning",
        )
    return int(given)


def _authorized_page(request: Request, token: str, run_id: uuid.UUID, after: int) -> Page:
    """The caller's first page, read in its tenant scope: another tenant's run is not there."""
    with request.app.state.pool.connection() as conn:
        conn.autocommit = True
        principal = principal_authenticate(conn, token)
        with tenant_scope(conn, principal.tenant_id):
            page = read_page(conn, run_id, after)
    if page is None:
        raise RunNotFound(f"no run {run_id}", fix="check the id and the tenant")
    if after > page.version:
        raise BadLastEventId(
            f"event {after} is in the future: run {run_id}'s last event is {page.version}",
            fix="resume from an id this run's stream sent",
        )
    return page


def read_as_owner(app: FastAPI) -> Reader:
    """The hub's reader: the owner's view (the subscription was authorized when it began)."""

    def read(run_id: uuid.UUID, after: int) -> Page | None:
        with app.state.pool.connection() as conn:
            conn.autocommit = True
            return read_page(conn, run_id, after)

    async def reader(run_id: uuid.UUID, after: int) -> Page | None:
        async with app.state.stream_reads:
            return await asyncio.to_thread(read, run_id, after)

    return reader


def read_text_as_owner(app: FastAPI) -> TextReader:
    """The hub's reader of model text, as the owner (like `read_as_owner`)."""

    def read(run_id: uuid.UUID, after: int | None) -> list[tuple[int, StreamEvent]]:
        with app.state.pool.connection() as conn:
            conn.autocommit = True
            return read_text(conn, run_id, after)

    async def reader(run_id: uuid.UUID, after: int | None) -> list[tuple[int, StreamEvent]]:
        async with app.state.stream_reads:
            return await asyncio.to_thread(read, run_id, after)

    return reader


@router.get(
    "/{run_id}/events",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
            "description": "The run's events (SSE); the stream closes after run.finished",
        },
        **responses(400, 401, 404, 422),
    },
    summary="Stream a run's events (Server-Sent Events), resumable with Last-Event-ID",
)
async def events(
    run_id: uuid.UUID,
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    after: Annotated[
        str | None, Query(max_length=40, description="Resume after this event id")
    ] = None,
    last_event_id: Annotated[
        str | None,
        Header(alias="Last-Event-ID", max_length=40, description="Resume after this event id"),
    ] = None,
) -> StreamingResponse:
    if credentials is None:
        raise Unauthenticated()
    cursor = _resume_point(after, last_event_id)
    async with request.app.state.stream_reads:
        first = await asyncio.to_thread(
            _authorized_page, request, credentials.credentials, run_id, cursor
        )
    hub: RunEventHub = request.app.state.hub
    closing: asyncio.Event = request.app.state.closing
    reader = hub.read

    async def stream() -> AsyncIterator[bytes]:
        nonlocal cursor
        page: Page | None = first
        # The durable record first, page by page, then live from the hub.
        while page is not None:
            for event in page.events:
                yield event.sse()
                cursor = event.id if event.id is not None else cursor
            if page.finished:
                yield finished_event(run_id, page.status, cursor).sse()
                return
            if page.complete:
                break
            page = await reader(run_id, cursor)
        sub = hub.subscribe(run_id, cursor)
        try:
            while not closing.is_set():
                waiter = asyncio.ensure_future(sub.wake.wait())
                stopper = asyncio.ensure_future(closing.wait())
                done, _ = await asyncio.wait(
                    {waiter, stopper}, timeout=KEEPALIVE_S, return_when=asyncio.FIRST_COMPLETED
                )
                waiter.cancel()
                stopper.cancel()
                if not done:
                    yield b": keepalive\n\n"
                    continue
                sub.wake.clear()
                for event in hub.take_text(sub):
                    yield event.sse()
                taken: list[StreamEvent] | None = hub.take(sub)
                if taken is None:  # fell behind the shared buffer: its own read
                    gap = await reader(run_id, sub.cursor)
                    taken = gap.events if gap is not None else []
                    if gap is not None and not gap.complete:
                        sub.wake.set()
                for event in taken:
                    yield event.sse()
                    sub.cursor = event.id if event.id is not None else sub.cursor
                status = hub.finished(sub)
                if status is not None:
                    await hub.text_settled(sub)
                    for event in hub.take_text(sub):
                        yield event.sse()
                    yield finished_event(run_id, status, sub.cursor).sse()
                    return
        finally:
            hub.unsubscribe(sub)

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
