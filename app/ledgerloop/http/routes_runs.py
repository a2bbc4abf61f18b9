"""/v1/runs: start (idempotent), list, show, timeline, cancel."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ledgerloop.approvals.principals import RUNNER, Principal
from ledgerloop.control.cancel import cancel_run
from ledgerloop.control.fork import fork_run
from ledgerloop.control.timeline import run_timeline
from ledgerloop.db.connect import tenant_scope
from ledgerloop.http.auth import Caller, Connection, with_role
from ledgerloop.http.errors import (
    IdempotencyKeyReused,
    InvalidRequest,
    UnknownAgent,
    json_storable,
    responses,
    storable_text,
)
from ledgerloop.runs.start import MAX_INPUT_DEPTH, depth_problem, input_too_deep, start_run
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import Run, RunFilter, run_counts, run_page, run_require
from ledgerloop.telemetry.runtrace import run_start_span

router = APIRouter(prefix="/v1/runs", tags=["runs"])

Runner = Annotated[Principal, Depends(with_role(RUNNER, action="starting or cancelling runs"))]


class StartRun(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: str = Field(min_length=1, max_length=64, description="A registered agent's name")
    input: dict[str, Any] = Field(
        description=(
            f"The run's input: a JSON object, at most 256 KiB and {MAX_INPUT_DEPTH} levels deep"
        )
    )
    conversation_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        description="Continue this conversation's memory (stored in the input)",
    )

    @field_validator("agent", "conversation_id")
    @classmethod
    def _text(cls, value: str | None) -> str | None:
        return storable_text(value) if value is not None else None

    @field_validator("input")
    @classmethod
    def _input(cls, value: dict[str, Any]) -> dict[str, Any]:
        # Before anything else looks at it: the same limit as ledgerloop.start_run's.
        if input_too_deep(value):
            raise ValueError(depth_problem() + "; flatten it, or pass the id of a stored document")
        json_storable(value)
        return value

    @model_validator(mode="after")
    def _one_conversation(self) -> StartRun:
        given = self.input.get("conversation_id")
        if self.conversation_id is not None and given not in (None, self.conversation_id):
            raise ValueError("conversation_id differs from input.conversation_id; give it once")
        return self

    def run_input(self) -> dict[str, Any]:
        """The stored input: the agent loop reads the conversation id from it."""
        if self.conversation_id is None:
            return self.input
        return {**self.input, "conversation_id": self.conversation_id}


class CancelRun(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, max_length=2000)

    @field_validator("reason")
    @classmethod
    def _text(cls, value: str | None) -> str | None:
        return storable_text(value) if value is not None else None


class RunOut(BaseModel):
    id: uuid.UUID
    tenant_id: uuid.UUID
    agent: str
    status: RunStatus
    input: dict[str, Any]
    state: dict[str, Any]
    idempotency_key: str | None
    version: int
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, run: Run) -> RunOut:
        return cls.model_validate(run, from_attributes=True)


class RunList(BaseModel):
    runs: list[RunOut]
    next_cursor: str | None = Field(
        default=None, description="Pass as `cursor` for the next page; null on the last"
    )
    counts: dict[str, int] | None = Field(
        default=None, description="Matching runs by status (with counts=true)"
    )


class EntryOut(BaseModel):
    at: datetime
    kind: Literal["event", "step", "effect", "approval"]
    name: str
    status: str | None
    detail: dict[str, Any]


class TimelineOut(BaseModel):
    run: RunOut
    entries: list[EntryOut]
    truncated: bool = Field(description="True when the run has more items than are shown")
    cost_usd: float | None = Field(
        default=None, description="The model calls' cost by the price table; null if unpriced"
    )
    unpriced_calls: int = Field(default=0, description="Model calls whose model has no price")


class ForkRun(BaseModel):
    model_config = ConfigDict(extra="forbid")

    from_step: int = Field(
        ge=1,
        description="The think step to ask the model again from: its `detail.function_id` in "
        "the timeline",
    )


class ForkOut(BaseModel):
    run: RunOut
    parent_id: uuid.UUID
    from_step: int


class CancellationOut(BaseModel):
    run: RunOut
    approvals_cancelled: list[uuid.UUID]
    workflow_cancelled: bool


@router.post(
    "",
    status_code=201,
    response_model=RunOut,
    responses={
        200: {"model": RunOut, "description": "The run this Idempotency-Key started"},
        **responses(400, 401, 403, 413, 415, 422),
    },
    summary="Start a run",
)
def start(
    body: StartRun,
    request: Request,
    response: Response,
    principal: Runner,
    conn: Connection,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=255,
            description="Repeat a request with the same key to get the same run back",
        ),
    ] = None,
) -> RunOut:
    known: frozenset[str] = request.app.state.agent_names
    if body.agent not in known:
        raise UnknownAgent(
            f"unknown agent {body.agent!r}; known agents: {', '.join(sorted(known)) or 'none'}",
            fix="use one of the known agents, or register yours (LEDGERLOOP_AGENT_MODULES)",
        )
    run_input = body.run_input()
    # The request's span (in the caller's trace, if it sent one) links to the run's own trace.
    with run_start_span(
        "POST", "/v1/runs", incoming_traceparent=request.headers.get("traceparent")
    ) as span:
        # As the owner role: start_run enqueues the workflow in schema dbos, where tenant
        # sessions have no rights. The run is the caller's tenant's all the same.
        with conn.transaction():
            run_id = start_run(
                conn,
                agent=body.agent,
                input=run_input,
                idempotency_key=idempotency_key,
                tenant_id=principal.tenant_id,
            )
            run = run_require(conn, run_id)
            row = conn.execute("SELECT now() AS now").fetchone()
        # created_at defaults to now(), the transaction's start: equal only for a run inserted
        # by this very transaction, so a repeat (even a concurrent one) is never reported as
        # created.
        created = row is not None and run.created_at == row["now"]
        if not created:
            if run.agent != body.agent or run.input != run_input:
                raise IdempotencyKeyReused(
                    f"Idempotency-Key {idempotency_key!r} already started run {run.id} with a "
                    "different agent or input",
                    fix="send the original request again, or use a new key for a new run",
                )
            response.status_code = 200
        span.started(run.id, response.status_code or 201)
    return RunOut.of(run)


@router.get("", response_model=RunList, responses=responses(401, 422), summary="List runs")
def list_runs(
    principal: Caller,
    conn: Connection,
    status: RunStatus | None = None,
    agent: Annotated[str | None, Query(max_length=64)] = None,
    run_id: Annotated[uuid.UUID | None, Query(description="Only this run")] = None,
    idempotency_key: Annotated[
        str | None, Query(max_length=255, description="Only the run this key started")
    ] = None,
    created_after: Annotated[
        datetime | None, Query(description="Runs created at or after this instant")
    ] = None,
    created_before: Annotated[
        datetime | None, Query(description="Runs created before this instant")
    ] = None,
    cursor: Annotated[
        str | None,
        Query(max_length=200, description="`next_cursor` of the previous page"),
    ] = None,
    counts: Annotated[
        bool, Query(description="Also count the matching runs by status (reads them all)")
    ] = False,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> RunList:
    where = RunFilter(
        tenant_id=principal.tenant_id,
        status=status,
        agent=agent,
        run_id=run_id,
        idempotency_key=idempotency_key,
        created_after=created_after,
        created_before=created_before,
    )
    after = cursor_decode(cursor) if cursor else None
    with tenant_scope(conn, principal.tenant_id):
        page = run_page(conn, where, limit=limit, after=after)
        by_status = run_counts(conn, where) if counts else None
    return RunList(
        runs=[RunOut.of(run) for run in page.runs],
        next_cursor=cursor_encode(*page.after) if page.after else None,
        counts=by_status,
    )


def cursor_encode(created_at: datetime, run_id: uuid.UUID) -> str:
    """The position after a run, opaque to clients: they pass it back unchanged."""
    raw = json.dumps([created_at.isoformat(), str(run_id)], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def cursor_decode(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        at, run_id = json.loads(base64.urlsafe_b64decode(padded.encode()))
        return datetime.fromisoformat(at), uuid.UUID(run_id)
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(
            f"cursor {cursor[:40]!r} is not one this API gave out",
            fix="pass the next_cursor of the previous page unchanged, or leave it out",
        ) from exc


@router.get(
    "/{run_id}", response_model=RunOut, responses=responses(401, 404, 422), summary="Show a run"
)
def show(run_id: uuid.UUID, principal: Caller, conn: Connection) -> RunOut:
    with tenant_scope(conn, principal.tenant_id):
        return RunOut.of(run_require(conn, run_id))


@router.get(
    "/{run_id}/timeline",
    response_model=TimelineOut,
    responses=responses(401, 404, 422),
    summary="A run's events, steps, effects and approvals in time order",
)
def timeline(
    run_id: uuid.UUID, request: Request, principal: Caller, conn: Connection
) -> TimelineOut:
    with tenant_scope(conn, principal.tenant_id):
        found = run_timeline(
            conn, run_id, steps=request.app.state.dbos, prices=request.app.state.prices
        )
    return TimelineOut(
        run=RunOut.of(found.run),
        entries=[EntryOut.model_validate(entry, from_attributes=True) for entry in found.entries],
        truncated=found.truncated,
        cost_usd=found.cost_usd,
        unpriced_calls=found.unpriced_calls,
    )


@router.post(
    "/{run_id}/cancel",
    response_model=CancellationOut,
    responses=responses(400, 401, 403, 404, 409, 413, 415, 422),
    summary="Ask a run to stop: pending work stops, nothing is undone",
)
def cancel(
    run_id: uuid.UUID,
    principal: Runner,
    conn: Connection,
    request: Request,
    body: CancelRun | None = None,
) -> CancellationOut:
    # As the owner (the run's cancel request is the owner's table); cancel_run refuses
    # another tenant's run as not found. DBOS's cancel goes through the app's DBOS client.
    done = cancel_run(
        conn,
        run_id,
        workflows=request.app.state.dbos,
        requested_by=f"{principal.name} (principal {principal.id})",
        reason=body.reason if body else None,
        tenant_id=principal.tenant_id,
    )
    return CancellationOut(
        run=RunOut.of(done.run),
        approvals_cancelled=done.approvals_cancelled,
        workflow_cancelled=done.workflow_cancelled,
    )


@router.post(
    "/{run_id}/fork",
    status_code=201,
    response_model=ForkOut,
    responses=responses(400, 401, 403, 404, 409, 413, 415, 422),
    summary="A new run from a finished run's model call: its journal up to there is the parent's",
)
def fork(
    run_id: uuid.UUID, body: ForkRun, principal: Runner, conn: Connection, request: Request
) -> ForkOut:
    # Another tenant's run is not found (404); one still executing is 409; a step it never
    # reached, or one that is not a model call, 422 listing the steps it may fork from.
    done = fork_run(
        conn,
        run_id,
        from_step=body.from_step,
        workflows=request.app.state.dbos,
        tenant_id=principal.tenant_id,
    )
    return ForkOut(run=RunOut.of(done.run), parent_id=done.parent.id, from_step=body.from_step)
