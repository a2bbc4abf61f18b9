"""The sweeper: every unfinished run has a live workflow, or it is settled.

A run's own workflow moves it to a terminal status. When that workflow cannot (DBOS ended it
in ERROR after a nondeterminism error, someone cancelled it through DBOS, retention deleted
it, it ran out of recovery attempts, or it is stuck past the run's deadline), the run would
read `planning` or `executing` forever. `ledgerloop up` runs this loop beside the worker:
every `LEDGERLOOP_SWEEP_INTERVAL_S` (5 s) one indexed query lists the unfinished runs
(partial index `agent_run_unfinished`: an idle database answers it from an empty index), DBOS
is asked for their workflows (`DBOS.list_workflows`, only when there are any), and each run
whose workflow is

    ERROR                              -> failed     workflow_error (DBOS's error with it)
    MAX_RECOVERY_ATTEMPTS_EXCEEDED     -> failed     recovery_attempts_exceeded
    CANCELLED                          -> cancelled  workflow_cancelled
    SUCCESS (the run not settled)      -> failed     workflow_ended
    missing                            -> failed     workflow_missing
    live, past the run's deadline      -> failed     deadline_exceeded (the workflow cancelled)

is settled in one transaction with its event (`swept: true`), its pending approvals and
undelivered effects cancelled, a failed run's compensations begun (the worker supplies
that step: it knows the tools), and counted in `ledgerloop.runs.swept`. Runs younger than
`LEDGERLOOP_SWEEP_MIN_AGE_S` are not judged, and a live workflow gets
`LEDGERLOOP_SWEEP_DEADLINE_GRACE_S` past the deadline to end the run itself first.
Every worker may sweep: settling is a versioned transition, so two sweepers settle a run once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ledgerloop.approvals.store import approval_cancel_for_run
from ledgerloop.control.cancel import WorkflowControl, workflow_cancel
from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries
from ledgerloop.effects.ledger import effects_cancel_pending
from ledgerloop.failures import describe
from ledgerloop.idle import IdleBackoff
from ledgerloop.runs.states import TERMINAL, RunStatus
from ledgerloop.runs.store import StaleRun, run_facts, run_get, run_transition
from ledgerloop.telemetry.runtrace import end_run

log = logging.getLogger(__name__)
Q = load_queries("ledgerloop.runs")

#: DBOS statuses of a workflow that is still going to run (or is running).
LIVE = frozenset({"PENDING", "ENQUEUED", "DELAYED"})
#: How many runs one DBOS lookup asks about.
BATCH = 500


@dataclass(frozen=True)
class SweepConfig:
    interval_s: float = 5.0
    #: Runs younger than this are not judged (their workflow may still be being created).
    min_age_s: float = 5.0
    #: How long past its deadline a run with a live workflow gets to end itself.
    deadline_grace_s: float = 60.0
    #: The run deadline for runs that never started (their state holds no deadline yet).
    run_deadline_s: float = 3600.0
    #: The most runs looked at per tick, oldest first.
    limit: int = 10_000


@dataclass(frozen=True)
class Verdict:
    run_id: uuid.UUID
    target: RunStatus
    reason: str
    details: dict[str, Any] = field(default_factory=dict)
    cancel_workflow: bool = False


def judge(
    row: dict[str, Any], workflow: Any | None, now: float, config: SweepConfig
) -> Verdict | None:
    """What to do with one unfinished run, given its DBOS workflow status (None: missing)."""
    run_id = row["id"]
    if workflow is None:
        return Verdict(run_id, RunStatus.FAILED, "workflow_missing", {"workflow_status": None})
    status = str(workflow.status)
    seen: dict[str, Any] = {"workflow_status": status}
    if status == "ERROR":
        error = workflow.error
        if error is not None:
            seen["error"] = describe(error) if isinstance(error, BaseException) else str(error)
        return Verdict(run_id, RunStatus.FAILED, "workflow_error", seen)
    if status == "MAX_RECOVERY_ATTEMPTS_EXCEEDED":
        return Verdict(run_id, RunStatus.FAILED, "recovery_attempts_exceeded", seen)
    if status == "CANCELLED":
        return Verdict(run_id, RunStatus.CANCELLED, "workflow_cancelled", seen)
    if status == "SUCCESS":
        return Verdict(run_id, RunStatus.FAILED, "workflow_ended", seen)
    if status in LIVE and now > float(row["deadline"]) + config.deadline_grace_s:
        seen["deadline"] = row["deadline"]
        return Verdict(run_id, RunStatus.FAILED, "deadline_exceeded", seen, cancel_workflow=True)
    return None


def runs_unfinished(conn: Conn, config: SweepConfig) -> list[dict[str, Any]]:
    rows = conn.execute(
        Q["run_list_unfinished"],
        {
            "deadline_s": config.run_deadline_s,
            "min_age_s": config.min_age_s,
            "limit": config.limit,
        },
    ).fetchall()
    return list(rows)


#: Begins a failed run's compensations in the caller's transaction; returns what it began.
#: Supplied by the worker (agent/compensation_steps.py: compensations_begin), which knows the tools.
Compensate = Callable[[Conn, uuid.UUID], list[dict[str, Any]]]


def run_settle(
    conn: Conn,
    verdict: Verdict,
    compensate: Compensate | None = None,
    workflows: WorkflowControl | None = None,
) -> bool:
    """Settle one run as judged; False when it finished (or moved) meanwhile. A failed run's
    compensations begin in the same transaction (their outcomes are nobody's to wait for). A
    workflow to cancel gets a cancel request in the same transaction and, after the commit,
    DBOS's own cancel through `workflows` (left to the cancel sweep when None or failing)."""
    payload: dict[str, Any] = {"reason": verdict.reason, "swept": True, **verdict.details}
    try:
        with conn.transaction():
            run = run_get(conn, verdict.run_id)
            if run is None or run.status in TERMINAL:
                return False
            if compensate is not None and verdict.target is RunStatus.FAILED:
                _compensate(conn, run.id, compensate, payload)
            # StaleRun (the run moved: its workflow is alive after all) rolls everything
            # back, the compensations included; the run is judged again next tick.
            run_transition(conn, run, verdict.target, verdict.reason, payload, payload)
            approval_cancel_for_run(conn, run.id)
            effects_cancel_pending(conn, run.id)
            if verdict.cancel_workflow:
                conn.execute(Q["cancel_request_add"], {"run_id": run.id})
    except StaleRun:
        return False
    # The run ended here, not in its workflow: its root span is emitted here.
    end_run(verdict.target.value, verdict.reason, facts=run_facts(run))
    if verdict.cancel_workflow and workflows is not None:
        workflow_cancel(conn, workflows, run.id)
    return True


def _compensate(
    conn: Conn, run_id: uuid.UUID, compensate: Compensate, payload: dict[str, Any]
) -> None:
    """Begin the compensations inside a savepoint: one that cannot begin (its tool is gone
    from this worker, say) is recorded with the run, and does not keep the run unsettled."""
    try:
        with conn.transaction():
            begun = compensate(conn, run_id)
    except Exception as exc:
        log.exception("run %s: its compensations could not begin", run_id)
        payload["compensation_error"] = describe(exc)
        return
    if begun:
        payload["compensations"] = begun


async def _workflows(ids: Sequence[str]) -> dict[str, Any]:
    """DBOS's view of these workflows, by id; ERROR ones with their error."""
    from dbos import DBOS

    found: dict[str, Any] = {}
    for start in range(0, len(ids), BATCH):
        chunk = list(ids[start : start + BATCH])
        statuses = await DBOS.list_workflows_async(
            workflow_ids=chunk, load_input=False, load_output=False
        )
        found.update({s.workflow_id: s for s in statuses})
    errored = [wid for wid, s in found.items() if s.status == "ERROR"]
    if errored:
        # Only these need their error, which DBOS loads with the output.
        for status in await DBOS.list_workflows_async(workflow_ids=errored, load_input=False):
            found[status.workflow_id] = status
    return found


async def sweep_once(
    pool: Any, config: SweepConfig, compensate: Compensate | None = None
) -> list[Verdict]:
    """One pass: judge every unfinished run and settle the ones whose workflow cannot."""
    from ledgerloop.telemetry import run_swept

    def unfinished() -> list[dict[str, Any]]:
        with pool.connection() as conn:
            return runs_unfinished(conn, config)

    rows = await asyncio.to_thread(unfinished)
    if not rows:
        return []
    workflows = await _workflows([str(r["id"]) for r in rows])
    now = time.time()
    verdicts = [
        v for r in rows if (v := judge(r, workflows.get(str(r["id"])), now, config)) is not None
    ]
    settled = []

    def settle(verdict: Verdict) -> bool:
        from dbos import DBOS

        with pool.connection() as conn:
            return run_settle(conn, verdict, compensate, DBOS)

    for verdict in verdicts:
        try:
            done = await asyncio.to_thread(settle, verdict)
        except Exception:
            # One run that cannot be settled must not hold up the others.
            log.exception("run %s: settling it failed; trying again next pass", verdict.run_id)
            continue
        if done:
            log.warning(
                "run %s settled %s (%s): %s",
                verdict.run_id,
                verdict.target.value,
                verdict.reason,
                verdict.details,
            )
            run_swept(verdict.reason)
            settled.append(verdict)
    return settled


async def run_sweeper(
    pool: Any, config: SweepConfig, stop: asyncio.Event, compensate: Compensate | None = None
) -> None:
    """Sweep every `config.interval_s` until `stop`; a failed pass (the database away) is
    logged once and tried again at the next tick."""
    failing = False
    # Slower while passes settle nothing (ledgerloop.idle): what it catches is rare and
    # never urgent to the second (a deadline, a workflow that is gone).
    backoff = IdleBackoff(config.interval_s)
    while not stop.is_set():
        found = True
        try:
            found = bool(await sweep_once(pool, config, compensate))
            failing = False
        except Exception:
            if not failing:
                log.exception("sweeper pass failed; retrying every %.0f s", config.interval_s)
            failing = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), backoff.after(found))
