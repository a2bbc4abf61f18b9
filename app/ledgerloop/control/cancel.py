"""Cancelling a run: a request to stop pending work. It undoes nothing.

One transaction moves the run to `cancelled` (with its event), cancels its pending approvals
and pending effects, and records a cancel request for its DBOS workflow; no crash can leave a
cancelled run with an approval someone could still grant. After the commit the workflow is
cancelled through DBOS's own API (`cancel_workflow`, of `DBOS` in a worker or of a
`DBOSClient`), which runs in a transaction of its own, and the request is deleted.

The gap between the two commits is guarded twice: the run's steps refuse to move a terminal
run (`run_ensure_status` raises RunStopped, and `memory-load` ends a run found terminal), so
the run stops even where DBOS is not told; and a request whose requester died, whose DBOS
cancel failed, or that was made inside a caller's own transaction (DBOS must not cancel a
workflow for a cancel that may still roll back) is settled by a worker's sweep
(`cancel_requests_settle`, every `cancel_sweep_s`).

Run it as the owner role (the tenant role has no rights on schema dbos); pass `tenant_id` to
refuse another tenant's run as not found.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from psycopg.pq import TransactionStatus

from ledgerloop.approvals.store import approval_cancel_for_run
from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries
from ledgerloop.effects.ledger import effects_cancel_pending
from ledgerloop.errors import LedgerloopError
from ledgerloop.faults import hit
from ledgerloop.runs.states import TERMINAL, RunStatus
from ledgerloop.runs.store import (
    Run,
    RunNotFound,
    StaleRun,
    run_facts,
    run_require,
    run_transition,
)
from ledgerloop.telemetry.runtrace import end_run

log = logging.getLogger(__name__)
Q = load_queries("ledgerloop.runs")

#: DBOS statuses of a workflow that has not finished (DELAYED: a hibernated run).
_LIVE = frozenset({"PENDING", "ENQUEUED", "DELAYED"})


class WorkflowControl(Protocol):
    """What cancelling needs of DBOS: `dbos.DBOS` (in a worker) or a `dbos.DBOSClient`."""

    def list_workflows(
        self,
        *,
        workflow_ids: list[str] | None = ...,
        load_input: bool = ...,
        load_output: bool = ...,
    ) -> list[Any]: ...

    def cancel_workflow(self, workflow_id: str, *, cancel_children: bool = ...) -> None: ...


#: Optimistic retries when the worker moves the run between our read and our write.
_ATTEMPTS = 5


class RunNotCancellable(LedgerloopError):
    """The run already finished; there is no pending work left to cancel."""

    status_code: ClassVar[int] = 409


@dataclass(frozen=True)
class Cancellation:
    run: Run
    #: The pending approvals this cancellation closed.
    approvals_cancelled: list[uuid.UUID]
    #: True when DBOS's cancel stopped the run's workflow now; False when the workflow had
    #: already finished (or never existed, e.g. a run made by run_create alone), or when the
    #: cancel is left to the sweep (inside a caller's transaction, or DBOS failed).
    workflow_cancelled: bool


def cancel_run(
    conn: Conn,
    run_id: uuid.UUID,
    *,
    workflows: WorkflowControl,
    requested_by: str,
    reason: str | None = None,
    tenant_id: uuid.UUID | None = None,
    details: dict[str, object] | None = None,
) -> Cancellation:
    """Cancel a run that has not finished. Raises RunNotFound, or RunNotCancellable (409)
    naming the status the run finished in."""
    payload: dict[str, object] = {"requested_by": requested_by}
    if reason:
        payload["reason"] = reason
    if details:
        payload.update(details)
    for _ in range(_ATTEMPTS):
        try:
            with conn.transaction():
                run = run_require(conn, run_id)
                if tenant_id is not None and run.tenant_id != tenant_id:
                    raise RunNotFound(f"no run {run_id}", fix="check the id and the tenant")
                if run.status in TERMINAL:
                    raise RunNotCancellable(
                        f"run {run_id} already {run.status.value} at "
                        f"{run.updated_at.isoformat()}; cancelling stops pending work and "
                        "this run has none",
                        fix="nothing to do; to undo a finished run's effects, compensate them",
                    )
                moved = run_transition(conn, run, RunStatus.CANCELLED, "cancelled", payload).run
                # After the run update, as approval_decide expects: a decision racing this
                # either committed first or now sees the cancelled run.
                approvals = approval_cancel_for_run(conn, run_id)
                effects_cancel_pending(conn, run_id)
                conn.execute(Q["cancel_request_add"], {"run_id": run_id})
            break
        except StaleRun:
            continue  # the worker moved the run meanwhile: judge again from its new state
    else:
        raise StaleRun(run_id, run.version, run_require(conn, run_id))
    # The run ended here, not in its workflow: its root span is emitted here.
    end_run(RunStatus.CANCELLED.value, "cancelled", facts=run_facts(moved))
    if conn.info.transaction_status is not TransactionStatus.IDLE:
        return Cancellation(moved, approvals, False)  # the caller may still roll back
    hit("cancel.after_commit")
    return Cancellation(moved, approvals, workflow_cancel(conn, workflows, run_id))


def workflow_cancel(conn: Conn, workflows: WorkflowControl, run_id: uuid.UUID) -> bool:
    """Cancel the run's workflow through DBOS (after the run's cancel committed) and settle
    its request. True when the workflow was live and is now cancelled. A failure is logged
    and left to the sweep."""
    workflow_id = str(run_id)
    try:
        found = workflows.list_workflows(
            workflow_ids=[workflow_id], load_input=False, load_output=False
        )
        live = bool(found) and found[0].status in _LIVE
        if live:
            # With its child episodes (ledgerloop.agent.episodes): a cancelled run's episode
            # would otherwise go on paying for model turns nobody will read.
            workflows.cancel_workflow(workflow_id, cancel_children=True)
    except Exception as exc:
        log.warning("run %s: cancelling its workflow failed (%s); the sweep retries", run_id, exc)
        return False
    with conn.transaction():
        conn.execute(Q["cancel_request_done"], {"run_id": run_id})
    return live


def cancel_requests_settle(
    conn: Conn, workflows: WorkflowControl, *, settle_s: float, limit: int = 100
) -> int:
    """Cancel the workflows of requests older than `settle_s` (their requester did not finish
    them); returns how many requests were settled. Safe to run from several workers."""
    settled = 0
    with conn.transaction():
        due = conn.execute(Q["cancel_requests_due"], {"settle_s": settle_s, "limit": limit})
        for row in due.fetchall():
            workflow_id = str(row["run_id"])
            try:
                workflows.cancel_workflow(workflow_id, cancel_children=True)
            except Exception as exc:
                log.warning(
                    "run %s: cancelling its workflow failed (attempt %d: %s)",
                    workflow_id,
                    row["attempts"] + 1,
                    exc,
                )
                conn.execute(Q["cancel_request_retry_later"], {"run_id": row["run_id"]})
                continue
            conn.execute(Q["cancel_request_done"], {"run_id": row["run_id"]})
            settled += 1
    return settled
