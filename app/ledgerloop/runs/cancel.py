"""Cancelling a run: a request to stop pending work. It undoes nothing.

One transaction moves the run to `cancelled` (with its event), cancels its pending approvals
and cancels its DBOS workflow, so no crash can leave a cancelled run with a live workflow or
an approval someone could still grant. Work already done stays done: a delivered effect is
undone only by a compensation, which is a new effect with its own audit trail.

The workflow is cancelled with the same UPDATE DBOS's own `cancel_workflow` runs (dbos 3.4,
`SystemDatabase.cancel_workflows`), issued here so it commits with the run. DBOS stops the
workflow at its next step; the run's steps also refuse to move a terminal run
(`run_ensure_status` raises RunStopped), so the run is stopped even where DBOS is not told.
tests/e2e/test_http_api.py reads the result back through DBOSClient to catch a DBOS change.

Run it as the owner role (the tenant role has no rights on schema dbos); pass `tenant_id` to
refuse another tenant's run as not found.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import ClassVar, LiteralString

from ledgerloop.approvals.store import approval_cancel_for_run
from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import effects_cancel_pending
from ledgerloop.errors import LedgerloopError
from ledgerloop.runs.states import TERMINAL, RunStatus
from ledgerloop.runs.store import Run, RunNotFound, StaleRun, run_require, run_transition

_CANCEL_WORKFLOW: LiteralString = """
UPDATE dbos.workflow_status
SET status = 'CANCELLED',
    owner_xid = NULL,
    queue_name = NULL,
    deduplication_id = NULL,
    started_at_epoch_ms = NULL,
    updated_at = (extract(epoch FROM now()) * 1000)::bigint,
    completed_at = (extract(epoch FROM now()) * 1000)::bigint
WHERE workflow_uuid = %(workflow_id)s AND status NOT IN ('SUCCESS', 'ERROR')
RETURNING workflow_uuid
"""

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
    #: False when the workflow had already finished (or never existed, e.g. a run made by
    #: run_create alone).
    workflow_cancelled: bool


def cancel_run(
    conn: Conn,
    run_id: uuid.UUID,
    *,
    requested_by: str,
    reason: str | None = None,
    tenant_id: uuid.UUID | None = None,
) -> Cancellation:
    """Cancel a run that has not finished. Raises RunNotFound, or RunNotCancellable (409)
    naming the status the run finished in."""
    payload: dict[str, object] = {"requested_by": requested_by}
    if reason:
        payload["reason"] = reason
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
                workflow = conn.execute(_CANCEL_WORKFLOW, {"workflow_id": str(run_id)}).fetchone()
            return Cancellation(moved, approvals, workflow is not None)
        except StaleRun:
            continue  # the worker moved the run meanwhile: judge again from its new state
    raise StaleRun(run_id, run.version, run_require(conn, run_id))
