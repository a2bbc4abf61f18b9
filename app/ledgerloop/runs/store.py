"""The run store: the snapshot (agent_run) and its history (agent_run_event).

Every change updates the snapshot and appends the event in one transaction. The update
carries `WHERE version = v`; when no row changes, the store reloads and classifies the event
as a duplicate (already applied), stale (the caller's snapshot is old but the move is still
legal) or invalid (the move is not in the transition table, e.g. a late approval of a
cancelled run). Functions take the caller's connection, so a user can create a run inside
their own transaction.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from psycopg.types.json import Json, Jsonb

from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries
from ledgerloop.errors import LedgerloopError
from ledgerloop.runs.states import TERMINAL, TRANSITIONS, InvalidTransition, RunStatus, check_move
from ledgerloop.telemetry.runtrace import RunFacts

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
                "step": None,
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
    *,
    step: str | None = None,
) -> Transition:
    """Move `run` (the caller's snapshot) to `target`, recording `event_type`.

    `step` names the workflow step writing the event: a step runs at least once, and its
    event is recorded once (a same-state event, which changes nothing else, is only told
    apart from its own repeat this way). Without a step, an event equal to the run's latest
    at the same status is the duplicate.

    Raises InvalidTransition for a move outside the table and StaleRun when the run moved on
    and this event is not already recorded; returns DUPLICATE when it is.
    """
    payload = payload or {}
    with conn.transaction():
        if _already_recorded(conn, run, target, event_type, payload, step):
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
                    "step": step,
                },
            )
            return Transition(Outcome.APPLIED, moved)
    return _classify(conn, run, target, event_type, payload, step)


def _already_recorded(
    conn: Conn,
    run: Run,
    target: RunStatus,
    event_type: str,
    payload: dict[str, Any],
    step: str | None,
) -> bool:
    if step is not None:
        found = conn.execute(Q["run_event_by_step"], {"run_id": run.id, "step": step})
        return found.fetchone() is not None
    if run.status != target:
        return False
    last = conn.execute(Q["run_event_last"], {"run_id": run.id}).fetchone()
    return bool(last and last["event_type"] == event_type and last["payload"] == payload)


def _classify(
    conn: Conn,
    seen: Run,
    target: RunStatus,
    event_type: str,
    payload: dict[str, Any],
    step: str | None,
) -> Transition:
    current = run_require(conn, seen.id)
    if _already_recorded(conn, current, target, event_type, payload, step):
        return Transition(Outcome.DUPLICATE, current)
    if current.status != seen.status:
        # Judge the event against where the run really is, so a late approval of a
        # cancelled run is refused as invalid rather than offered a retry.
        check_move(current.status, target, str(current.id))
    raise StaleRun(seen.id, seen.version, current)


@dataclass(frozen=True)
class Memory:
    """Conversation messages to save with a move: `messages` ({"role", "content"} each) at
    sequence `first_sequence` on of the run's conversation `conversation_id`."""

    conversation_id: str
    first_sequence: int
    messages: list[dict[str, Any]]


def _compact(value: Any) -> str:
    # Stored as JSON text (column type json): no spaces after separators.
    return json.dumps(value, separators=(",", ":"))


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
    *,
    step: str | None = None,
    memory: Memory | None = None,
) -> Run:
    """Bring the run to `target` and record the event; safe to repeat after a crash.

    Workflow steps are at-least-once, so a step that moved the run and died before its
    checkpoint runs again. With `step` (the writing step's name) the event is recorded once,
    also when it leaves the status unchanged (a same-state event). Without it, finding the
    run already at `target` is success and records nothing. A run that became terminal
    underneath (cancelled) raises RunStopped; a move the table forbids, InvalidTransition.

    One statement (run_advance) does it all under the run's row lock, so a concurrent cancel
    is either before it (and this sees a terminal run) or after it. `memory`: conversation
    messages that commit with the move (the same statement), or not at all.
    """
    row = conn.execute(
        Q["run_advance"],
        {
            "id": run_id,
            "status": target.value,
            "allowed_from": moves_to(target),
            "state_patch": Jsonb(state_patch or {}),
            "event_type": event_type,
            "payload": Jsonb(payload or {}),
            "step": step,
            "conversation_id": memory.conversation_id if memory else None,
            "first_sequence": memory.first_sequence if memory else None,
            "messages": Json(memory.messages, dumps=_compact) if memory else None,
        },
    ).fetchone()
    if row is None:
        raise RunNotFound(f"no run {run_id}", fix="check the run id")
    if row["id"] is not None:
        return Run.from_row({k: row[k] for k in _RUN_COLUMNS})
    current = RunStatus(row["current"])
    if row["duplicate"] or (step is None and current == target):
        return run_require(conn, run_id)
    return run_not_moved(conn, run_id, current, target)


def run_not_moved(conn: Conn, run_id: uuid.UUID, current: RunStatus, target: RunStatus) -> Run:
    """A move to `target` that did not happen from `current`, as `run_ensure_status` judges
    it: a run already finished there is success; else RunStopped (it finished elsewhere) or
    InvalidTransition (the table forbids the move)."""
    if current in TERMINAL:
        run = run_require(conn, run_id)
        if current == target:
            return run
        raise RunStopped(run)
    raise InvalidTransition(current, target, str(run_id))


def moves_to(target: RunStatus) -> list[str]:
    """The statuses a run may move to `target` from (run_advance's `allowed_from`)."""
    return [s.value for s in RunStatus if target in TRANSITIONS[s]]


_RUN_COLUMNS = (
    "id",
    "tenant_id",
    "agent",
    "status",
    "state",
    "input",
    "idempotency_key",
    "version",
    "created_at",
    "updated_at",
)


def run_events(conn: Conn, run_id: uuid.UUID) -> list[RunEvent]:
    rows = conn.execute(Q["run_events"], {"run_id": run_id}).fetchall()
    return [RunEvent(**row) for row in rows]


@dataclass(frozen=True)
class RunFilter:
    """Which runs a list shows; None is "any". `tenant_id` None: every tenant's (the CLI as
    the owner); the HTTP API always passes the caller's."""

    tenant_id: uuid.UUID | None = None
    status: RunStatus | None = None
    agent: str | None = None
    run_id: uuid.UUID | None = None
    idempotency_key: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None

    def params(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "status": self.status.value if self.status else None,
            "agent": self.agent,
            "run_id": self.run_id,
            "idempotency_key": self.idempotency_key,
            "created_after": self.created_after,
            "created_before": self.created_before,
        }


@dataclass(frozen=True)
class RunPage:
    runs: list[Run]
    #: (created_at, id) of the last run shown when more may follow, else None.
    after: tuple[datetime, uuid.UUID] | None


def run_page(
    conn: Conn,
    where: RunFilter,
    *,
    limit: int = 50,
    after: tuple[datetime, uuid.UUID] | None = None,
) -> RunPage:
    """One page of runs, newest first, strictly after `after` (a keyset, not an offset: a
    page costs the same on the thousandth page as on the first)."""
    at, last_id = after if after else (None, None)
    # Unprepared: a prepared generic plan keeps every `IS NULL OR` branch and may scan the
    # tenant; a custom plan folds the absent filters away and uses the matching index.
    rows = conn.execute(
        Q["run_list"],
        {**where.params(), "after_at": at, "after_id": last_id, "limit": limit + 1},
        prepare=False,
    ).fetchall()
    runs = [Run.from_row(row) for row in rows[:limit]]
    more = len(rows) > limit
    return RunPage(runs, (runs[-1].created_at, runs[-1].id) if more else None)


def run_counts(conn: Conn, where: RunFilter) -> dict[str, int]:
    """Runs per status matching `where` (its status aside); reads every matching entry."""
    rows = conn.execute(Q["run_counts"], where.params(), prepare=False).fetchall()
    return {row["status"]: row["runs"] for row in rows}


def run_list(
    conn: Conn, *, status: RunStatus | None = None, agent: str | None = None, limit: int = 50
) -> list[Run]:
    return run_page(conn, RunFilter(status=status, agent=agent), limit=limit).runs


__all__ = [
    "InvalidTransition",
    "Memory",
    "Outcome",
    "Run",
    "RunEvent",
    "RunFilter",
    "RunNotFound",
    "RunPage",
    "RunStopped",
    "StaleRun",
    "Transition",
    "run_counts",
    "run_create",
    "run_ensure_status",
    "run_events",
    "run_get",
    "run_list",
    "run_page",
    "run_require",
    "run_transition",
]


# -- which execution of a run is running (telemetry; see ledgerloop.telemetry.runtrace) --


def run_execution_swap(
    conn: Conn, run_id: uuid.UUID, execution: dict[str, Any]
) -> dict[str, Any] | None:
    """Record the execution taking over a resumed run; return what the previous one left."""
    row = conn.execute(
        Q["run_execution_swap"], {"id": run_id, "execution": Jsonb(execution)}
    ).fetchone()
    previous: dict[str, Any] | None = row["previous"] if row else None
    return previous


def run_execution_end(conn: Conn, run_id: uuid.UUID, execution: dict[str, Any]) -> None:
    """The running execution ended its own span (it hibernated)."""
    conn.execute(Q["run_execution_end"], {"id": run_id, "execution": Jsonb(execution)})


def run_executions_stopped(conn: Conn, executor_id: str) -> None:
    """A worker stopping cleanly ended the spans of the runs it was executing."""
    conn.execute(Q["run_executions_stopped"], {"executor_id": executor_id})


def run_facts(run: Run) -> RunFacts:
    """What the run's spans say about it (its root span starts at the run's creation)."""
    return RunFacts(
        str(run.id),
        run.agent,
        tenant_id=str(run.tenant_id),
        conversation_id=str(run.input.get("conversation_id") or run.id),
        created_ns=int(run.created_at.timestamp() * 1e9),
    )
