"""A run's timeline: its events, its workflow's steps, its effects and approvals, in time order.

Events, effects and approvals are read on the caller's connection (inside `tenant_scope` only
the tenant's own); steps come from DBOS through its client API (`list_workflow_steps`), never
from DBOS's tables. Step outputs stay out: they hold model text and can be large. Of a model
call (a think step's output) only the facts are kept: model, tokens, stop reason, latency,
the tools it asked for and their arguments, never its text. A step's error message is kept,
cut to a readable length.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from dbos import DBOSClient, DBOSPortableJSONSerializer, StepInfo

from ledgerloop.approvals.store import Approval, approval_list
from ledgerloop.db.connect import Conn
from ledgerloop.db.errors import translated
from ledgerloop.effects.ledger import Effect, effect_list
from ledgerloop.pricing import ModelPrice, cost_usd
from ledgerloop.runs.store import Run, RunEvent, run_events, run_require

Kind = Literal["event", "step", "effect", "approval"]

#: Tie-break for entries at the same instant: the event that explains a step comes first.
_ORDER: dict[Kind, int] = {"event": 0, "approval": 1, "step": 2, "effect": 3}
#: Everything a timeline shows of one run; a run with more is cut, and says so.
MAX_ITEMS = 1000
_MAX_ERROR_CHARS = 500


class StepSource(Protocol):
    """What the timeline needs of `dbos.DBOSClient` (or `DBOS`)."""

    def list_workflow_steps(
        self, workflow_id: str, *, load_output: bool = ..., limit: int | None = ...
    ) -> list[StepInfo]: ...


def dbos_client(database_url: str) -> DBOSClient:
    """A DBOS client for reading steps; call `destroy()` when done."""
    from ledgerloop.db.pooling import is_pooled

    with translated(database_url, "connecting"):
        if is_pooled(database_url):
            return _PooledClient(database_url, pool_size=2)
        # Portable JSON, as the workers write: nothing read back is ever unpickled.
        return DBOSClient(
            system_database_url=database_url,
            serializer=DBOSPortableJSONSerializer(),
            system_database_pool_size=2,
        )


class _PooledClient(DBOSClient):
    """A DBOS client through a transaction-mode pooler, over an engine of its own: one that
    prepares no statements and sets no session setting (DBOSClient's own engine SETs
    idle_in_transaction_session_timeout on each connection). Disposed with the client."""

    def __init__(self, database_url: str, *, pool_size: int) -> None:
        import sqlalchemy as sa

        from ledgerloop.db.pooling import engine_connect_args
        from ledgerloop.db.url import sqlalchemy_url

        self._own_engine = sa.create_engine(
            sqlalchemy_url(database_url),
            pool_size=pool_size,
            max_overflow=0,
            pool_pre_ping=True,
            connect_args=engine_connect_args(database_url, "ledgerloop-dbos-client"),
        )
        super().__init__(
            system_database_engine=self._own_engine, serializer=DBOSPortableJSONSerializer()
        )

    def destroy(self) -> None:
        super().destroy()
        self._own_engine.dispose()


@dataclass(frozen=True)
class Entry:
    at: datetime
    kind: Kind
    name: str
    status: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "kind": self.kind,
            "name": self.name,
            "status": self.status,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Timeline:
    run: Run
    entries: list[Entry]
    truncated: bool
    #: The model calls' cost by the price table (those shown); None when none is priced.
    cost_usd: float | None = None
    #: Model calls whose model has no price (their cost is not in cost_usd).
    unpriced_calls: int = 0


def run_timeline(
    conn: Conn,
    run_id: uuid.UUID,
    *,
    steps: StepSource | None,
    prices: Mapping[str, ModelPrice] | None = None,
) -> Timeline:
    """The run's timeline. Raises RunNotFound (also for a run the connection cannot see).

    `steps=None` leaves the workflow's steps out (a caller with no DBOS access). `prices`:
    the price table (ledgerloop.pricing) each model call is costed by.
    """
    run = run_require(conn, run_id)
    events = run_events(conn, run_id)[:MAX_ITEMS]
    effects = effect_list(conn, run_id=run_id, limit=MAX_ITEMS)
    approvals = approval_list(conn, run_id=run_id, limit=MAX_ITEMS)
    infos = (
        steps.list_workflow_steps(str(run_id), load_output=True, limit=MAX_ITEMS) if steps else []
    )
    # A child episode's steps are the run's too (its think and tool steps, under its own
    # workflow id): listed once per child, though the parent records it twice (start, result).
    children = list(dict.fromkeys(i["child_workflow_id"] for i in infos if i["child_workflow_id"]))
    child_entries = [
        _step(info, workflow_id=child)
        for child in children
        if steps is not None
        for info in steps.list_workflow_steps(child, load_output=False, limit=MAX_ITEMS)
    ]
    entries = [
        *(_event(e) for e in events),
        *(_step(s) for s in infos),
        *child_entries,
        *(_effect(e) for e in effects),
        *(_approval(a) for a in approvals),
    ]
    entries.sort(key=lambda e: (e.at, _ORDER[e.kind]))
    _mark_cut_off(entries)
    truncated = any(len(items) >= MAX_ITEMS for items in (events, infos, effects, approvals))
    total, unpriced = _costs(entries, prices or {})
    return Timeline(run, entries, truncated, total, unpriced)


def _event(event: RunEvent) -> Entry:
    return Entry(
        event.created_at,
        "event",
        event.event_type,
        detail={"sequence": event.sequence, "payload": event.payload},
    )


def _ms(value: int | None) -> datetime | None:
    return datetime.fromtimestamp(value / 1000, UTC) if value is not None else None


def _step(info: StepInfo, workflow_id: str | None = None) -> Entry:
    started = _ms(info["started_at_epoch_ms"])
    completed = _ms(info["completed_at_epoch_ms"])
    error = info["error"]
    status = "failed" if error is not None else "completed" if completed else "running"
    detail: dict[str, Any] = {
        "function_id": info["function_id"],
        "completed_at": completed.isoformat() if completed else None,
    }
    if error is not None:
        detail["error"] = str(error)[:_MAX_ERROR_CHARS]
    if info["child_workflow_id"]:
        detail["child_workflow_id"] = info["child_workflow_id"]
    if workflow_id is not None:
        detail["workflow_id"] = workflow_id  # a child episode's step
    call = _model_call(info.get("output"))
    if call is not None:
        if started and completed:
            call["latency_ms"] = int((completed - started).total_seconds() * 1000)
        detail["model_call"] = call
    # A think step that waited for the fleet's model budget (models/limits.py) says how long.
    output = info.get("output")
    if isinstance(output, dict) and output.get("budget_wait_s"):
        detail["budget_wait_s"] = output["budget_wait_s"]
    # A step recorded without a start time (DBOS's own bookkeeping rows) sorts at its end.
    at = started or completed or datetime.now(UTC)
    return Entry(at, "step", info["function_name"], status, detail)


def _effect(effect: Effect) -> Entry:
    return Entry(
        effect.created_at,
        "effect",
        effect.tool,
        effect.status.value,
        {
            "key": effect.key,
            "destination": effect.destination,
            "attempts": effect.attempts,
            "external_reference": effect.external_reference,
            "error": effect.error,
            "resolved_by": effect.resolved_by,
            "updated_at": effect.updated_at.isoformat(),
        },
    )


def _approval(approval: Approval) -> Entry:
    return Entry(
        approval.requested_at,
        "approval",
        approval.tool,
        approval.status.value,
        {
            "id": str(approval.id),
            "action_hash": approval.action_hash,
            "summary": approval.preview.get("summary"),
            "expires_at": approval.expires_at.isoformat() if approval.expires_at else None,
            "decided_by": approval.decided_by_name,
            "reason": approval.reason,
            "decided_at": approval.decided_at.isoformat() if approval.decided_at else None,
        },
    )


def _model_call(output: Any) -> dict[str, Any] | None:
    """The facts of a think step's model response (agent/steps.py, compact_response)."""
    response = output.get("response") if isinstance(output, dict) else None
    if not isinstance(response, dict) or "usage" not in response:
        return None
    usage = response.get("usage") or {}
    uses = [
        block
        for block in response.get("content") or []
        if isinstance(block, dict) and block.get("type") == "tool_use"
    ]
    return {
        "model": response.get("model"),
        "stop_reason": response.get("stop_reason"),
        "input_tokens": usage.get("input_tokens"),
        "output_tokens": usage.get("output_tokens"),
        "tool_uses": [str(block.get("name")) for block in uses],
        "tool_calls": [
            {"id": block.get("id"), "name": block.get("name"), "input": block.get("input")}
            for block in uses
        ],
    }


def _mark_cut_off(entries: list[Entry]) -> None:
    """A step that started and never finished, while a later step of the same workflow did
    run: the execution running it was cut off (a crash, a kill) and another resumed after."""
    last_start: dict[str | None, datetime] = {}
    for entry in entries:
        if entry.kind == "step":
            last_start[entry.detail.get("workflow_id")] = entry.at
    for entry in entries:
        if entry.kind == "step" and entry.status == "running":
            later = last_start.get(entry.detail.get("workflow_id"))
            if later is not None and later > entry.at:
                entry.detail["cut_off"] = True


def _costs(entries: list[Entry], prices: Mapping[str, ModelPrice]) -> tuple[float | None, int]:
    """Cost each model call in place; the total of the priced ones and how many were not."""
    total: float | None = None
    unpriced = 0
    for entry in entries:
        call = entry.detail.get("model_call")
        if call is None:
            continue
        cost = cost_usd(prices, call["model"], call["input_tokens"], call["output_tokens"])
        call["cost_usd"] = cost
        if cost is None:
            unpriced += 1
        else:
            total = (total or 0.0) + cost
    return total, unpriced
