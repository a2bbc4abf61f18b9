"""/v1/schedules: what `ledgerloop schedules` does, for operators over HTTP.

Reading needs a valid token; pausing, resuming and triggering need the operator role. Each
sees the caller's tenant's schedules only.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path
from pydantic import BaseModel

from ledgerloop.approvals.principals import OPERATOR, Principal
from ledgerloop.db.connect import tenant_scope
from ledgerloop.http.auth import Caller, Connection, with_role
from ledgerloop.http.errors import responses
from ledgerloop.schedules.store import (
    ScheduleRow,
    schedule_list,
    schedule_set_paused,
    schedule_trigger,
)

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])

Operator = Annotated[Principal, Depends(with_role(OPERATOR, action="changing schedules"))]
Name = Annotated[str, Path(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]


class ScheduleOut(BaseModel):
    name: str
    agent: str
    cron: str
    timezone: str
    input: dict[str, Any]
    missed: str
    paused: bool
    last_tick: datetime
    last_run_id: uuid.UUID | None
    declared_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, row: ScheduleRow) -> ScheduleOut:
        return cls.model_validate(row, from_attributes=True)


class ScheduleList(BaseModel):
    schedules: list[ScheduleOut]


class Triggered(BaseModel):
    run_id: uuid.UUID


@router.get("", response_model=ScheduleList, responses=responses(401), summary="List schedules")
def list_schedules(principal: Caller, conn: Connection) -> ScheduleList:
    with tenant_scope(conn, principal.tenant_id):
        rows = schedule_list(conn)
    return ScheduleList(schedules=[ScheduleOut.of(row) for row in rows])


@router.post(
    "/{name}/pause",
    response_model=ScheduleOut,
    responses=responses(401, 403, 404, 422),
    summary="Pause a schedule: no runs until resumed (operator)",
)
def pause(name: Name, principal: Operator, conn: Connection) -> ScheduleOut:
    with tenant_scope(conn, principal.tenant_id):
        return ScheduleOut.of(schedule_set_paused(conn, name, True))


@router.post(
    "/{name}/resume",
    response_model=ScheduleOut,
    responses=responses(401, 403, 404, 422),
    summary="Resume a schedule from its next tick (operator)",
)
def resume(name: Name, principal: Operator, conn: Connection) -> ScheduleOut:
    with tenant_scope(conn, principal.tenant_id):
        return ScheduleOut.of(schedule_set_paused(conn, name, False))


@router.post(
    "/{name}/trigger",
    status_code=201,
    response_model=Triggered,
    responses=responses(401, 403, 404, 422),
    summary="Start a run of the schedule now, with its input (operator)",
)
def trigger(
    name: Name,
    principal: Operator,
    conn: Connection,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=200,
            description="Repeat a request with the same key to get the same run back",
        ),
    ] = None,
) -> Triggered:
    with tenant_scope(conn, principal.tenant_id):
        return Triggered(run_id=schedule_trigger(conn, name, idempotency_key))
