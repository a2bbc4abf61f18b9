"""The run store: the snapshot (agent_run) and its history (agent_run_event).

Every change updates the snapshot and appends the event in one transaction. The update
carries `WHERE version = v`; when no row changes, the store reloads and classifies the event
as a duplicate (already applied), stale (the caller's snapshot is old but the move is still
legal) or invalid (the move is not in the transition table, e.g. a late approval of a
cancelled run). Functions take the caller's connection, so a user can create a run inside
their own transaction.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from psycopg.types.json import Jsonb

from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries
from ledgerloop.errors import LedgerloopError
from ledgerloop.runs.states import TERMINAL, InvalidTransition, RunStatus, check_move

Q = load_queries("ledgerloop.runs")


class RunNotFound(LedgerloopError):
    """No such run (or it belongs to another tenant)."""


class StaleRun(LedgerloopError):
    """The run changed since it was read; reload it and decide again."""

    retryable = True

    def __init__(self, run_id: uuid.UUID, expected: int, current: Run) -> None:
        self.current = current
        super().__init__(
            f"run {run_id} is at version {current.version} ({current.status.value}), "
            f"not {expected}",
            fix="reload the run and apply the event to its current state",
        )


@dataclass(frozen=True)
class Run:
    id: uuid.UUID
    tenant_id: uuid.UUID
    agent: str
    status: RunStatus
    state: dict[str, Any]
    input: dict[str, Any]
    idempotency_key: str | None
    version: int
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Run:
        return cls(**{**row, "status": RunStatus(row["status"])})


@dataclass(frozen=True)
class RunEvent:
    sequence: int
    event_type: str
    payload: dict[str, Any]
    created_at: datetime


class Outcome(StrEnum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"


@dataclass(frozen=True)
class Transition:
    outcome: Outcome
    run: Run


def run_create(
    conn: Conn,
    *,
    agent: str,
    input: dict[str, Any],
    tenant_id: uuid.UUID = DEFAULT_TENANT,
    run_id: uuid.UUID | None = None,
    idempotency_key: str | None = None,
) -> tuple[Run, bool]:
    """Insert a run in `received` with its first event. Returns (run, created).

    The same idempotency key within a tenant returns the existing run and created=False.
    """
    with conn.transaction():
        row = conn.execute(
            Q["run_insert"],
            {
                "id": run_id or uuid.uuid4(),
                "tenant_id": tenant_id,
                "agent": agent,
                "input": Jsonb(input),
                "idempotency_key": idempotency_key,
            },
        ).fetchone()
        if row is None:
            existing = conn.execute(
                Q["run_get_by_idempotency_key"],
                {"tenant_id": tenant_id, "idempotency_key": idempotency_key},
            ).fetchone()
            assert existing is not None, "conflict on a key that is not there"
            return Run.from_row(existing), False
        run = Run.from_row(row)
        conn.execute(
            Q["run_event_insert"],
            {
                "run_id": run.id,
                "tenant_id": run.tenant_id,
                "sequence": 0,
                "event_type": "received",
                "payload": Jsonb({"agent": agent}),
            },
        )
        return run, True


def run_get(conn: Conn, run_id: uuid.UUID) -> Run | None:
    row = conn.execute(Q["run_get"], {"id": run_id}).fetchone()
    return Run.from_row(row) if row else None


def run_require(conn: Conn, run_id: uuid.UUID) -> Run:
    run = run_get(conn, run_id)
    if run is None:
        raise RunNotFound(f"no run {run_id}", fix="check the id and the tenant")
    return run


def run_transition(
    conn: Conn,
    run: Run,
    target: RunStatus,
    event_type: str,
    payload: dict[str, Any] | None = None,
    state_patch: dict[str, Any] | None = None,
) -> Transition:
    """Move `run` (the caller's snapshot) to `target`, recording `event_type`.

    Raises InvalidTransition for a move outside the table and StaleRun when the run moved on
    and this event is not already its latest; returns DUPLICATE when it is.
    """
    payload = payload or {}
    with conn.transaction():
        # No self-loops exist in the table, so a snapshot already at the target can only be
        # this very event arriving again.
        if run.status == target and _is_latest(conn, run, event_type, payload):
            return Transition(Outcome.DUPLICATE, run)
        check_move(run.status, target, str(run.id))
        row = conn.execute(
            Q["run_transition"],
            {
                "id": run.id,
                "version": run.version,
                "status": target.value,
                "state_patch": Jsonb(state_patch or {}),
            },
        ).fetchone()
        if row is not None:
            moved = Run.from_row(row)
            conn.execute(
                Q["run_event_insert"],
                {
                    "run_id": moved.id,
                    "tenant_id": moved.tenant_id,
                    "sequence": moved.version,
                    "event_type": event_type,
                    "payload": Jsonb(payload),
                },
            )
            return Transition(Outcome.APPLIED, moved)
    return _classify(conn, run, target, event_type, payload)


def _is_latest(conn: Conn, run: Run, event_type: str, payload: dict[str, Any]) -> bool:
    last = conn.execute(Q["run_event_last"], {"run_id": run.id}).fetchone()
    return bool(last and last["event_type"] == event_type and last["payload"] == payload)


def _classify(
    conn: Conn, seen: Run, target: RunStatus, event_type: str, payload: dict[str, Any]
) -> Transition:
    current = run_require(conn, seen.id)
    if current.status == target and _is_latest(conn, current, event_type, payload):
        return Transition(Outcome.DUPLICATE, current)
    if current.status != seen.status:
        # Judge the event against where the run really is, so a late approval of a
        # cancelled run is refused as invalid rather than offered a retry.
        check_move(current.status, target, str(current.id))
    raise StaleRun(seen.id, seen.version, current)


class RunStopped(LedgerloopError):
    """The run reached a terminal state (it was cancelled, or it already finished)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        super().__init__(f"run {run.id} is {run.status.value}")


def run_ensure_status(
    conn: Conn,
    run_id: uuid.UUID,
    target: RunStatus,
    event_type: str,
    payload: dict[str, Any] | None = None,
    state_patch: dict[str, Any] | None = None,
) -> Run:
    """Bring the run to `target` unless it is already there; safe to repeat after a crash.

    Workflow steps are at-least-once, so a step that moved the run and died before its
    checkpoint runs again: finding the run already at `target` is then success, not an
    error. A run that became terminal underneath (cancelled) raises RunStopped.
    """
    for _ in range(5):
        run = run_require(conn, run_id)
        if run.status == target:
            return run
        if run.status in TERMINAL:
            raise RunStopped(run)
        try:
            return run_transition(conn, run, target, event_type, payload, state_patch).run
        except StaleRun:
            continue  # someone else moved it (a cancel request); judge again from the top
    raise StaleRun(run_id, run.version, run_require(conn, run_id))


def run_events(conn: Conn, run_id: uuid.UUID) -> list[RunEvent]:
    rows = conn.execute(Q["run_events"], {"run_id": run_id}).fetchall()
    return [RunEvent(**row) for row in rows]


def run_list(
    conn: Conn, *, status: RunStatus | None = None, agent: str | None = None, limit: int = 50
) -> list[Run]:
    rows = conn.execute(
        Q["run_list"],
        {"status": status.value if status else None, "agent": agent, "limit": limit},
    ).fetchall()
    return [Run.from_row(row) for row in rows]


__all__ = [
    "InvalidTransition",
    "Outcome",
    "Run",
    "RunEvent",
    "RunNotFound",
    "RunStopped",
    "StaleRun",
    "Transition",
    "run_create",
    "run_ensure_status",
    "run_events",
    "run_get",
    "run_list",
    "run_require",
    "run_transition",
]
