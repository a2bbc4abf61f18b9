"""Long waits leave memory: runs hibernate while they wait, and a message or a deadline wakes them.

Real Postgres, a real DBOS worker (in-process) with a short `hibernate_after_s`, the real
relay and ticket service, the real SDK against the scripted model. What is checked is what a
user relies on: a hibernated run holds no DBOS execution (its workflow is parked DELAYED until
the wait's deadline), the decision or the effect's outcome wakes it, it resumes from its
journal (the model is not asked again), and nothing runs twice.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from dbos import DBOS
from opentelemetry.trace import SpanKind, StatusCode

from ledgerloop.approvals.principals import principal_create
from ledgerloop.approvals.store import approval_decide, approval_list
from ledgerloop.control.cancel import cancel_run
from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import effect_list
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.states import RunStatus
from ledgerloop.telemetry.runtrace import root_span_id
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import start_relay, stop_worker, worker_env
from ledgerloop.testing.worker import WorkerThread
from tests.conftest import REPO, start_test_run, wait_terminal
from tests.support.telemetry import Captured

HIBERNATE_AFTER_S = 0.3


@pytest.fixture
def worker(worker: Callable[..., WorkerThread]) -> Callable[..., WorkerThread]:
    """The shared worker, hibernating waiting runs after HIBERNATE_AFTER_S."""

    def start(model_url: str, **overrides: Any) -> WorkerThread:
        return worker(model_url, **{"hibernate_after_s": HIBERNATE_AFTER_S, **overrides})

    return start


def _workflow(conn: Conn, run_id: uuid.UUID) -> dict[str, Any]:
    row = conn.execute(
        "SELECT status, delay_until_epoch_ms, recovery_attempts, queue_name, executor_id "
        "FROM dbos.workflow_status WHERE workflow_uuid = %s",
        (str(run_id),),
    ).fetchone()
    assert row is not None
    return dict(row)


def _hibernated(conn: Conn, run_id: uuid.UUID, timeout: float = 20) -> dict[str, Any]:
    def parked() -> dict[str, Any] | None:
        wf = _workflow(conn, run_id)
        return wf if wf["status"] == "DELAYED" else None

    found: dict[str, Any] = wait_until(parked, timeout=timeout)  # type: ignore[assignment]
    return found


def _pending_approval(conn: Conn, run_id: uuid.UUID) -> Any:
    def pending() -> Any:
        found = approval_list(conn, run_id=run_id, status="pending")
        return found[0] if found else None

    return wait_until(pending, timeout=20)


def _stats(tickets: TicketServiceThread) -> dict[str, Any]:
    stats: dict[str, Any] = httpx.get(f"{tickets.url}/_stats").json()
    return stats


def _ticket_script(tool: str) -> str:
    return f"""
default:
  turns:
    - tool_use: {{name: {tool}, input: {{title: "db-1 disk full", priority: high}}}}
    - text: "Filed."
"""


@dataclass
class WaitingRun:
    model: Any
    approver: Any
    run_id: uuid.UUID
    approval: Any
    workflow: dict[str, Any]


def _hibernated_ticket_run(conn: Conn, scripted_model: Any, worker: Any) -> WaitingRun:
    """An ops run filing a ticket, hibernated while it waits for its approval."""
    model = scripted_model(_ticket_script("write_ticket"))
    worker(model.url)
    approver, _ = principal_create(conn, name="alice", roles=["approver"])
    run_id = start_test_run(conn, "ops", "db-1 disk is full")
    approval = _pending_approval(conn, run_id)
    return WaitingRun(model, approver, run_id, approval, _hibernated(conn, run_id))


def test_a_waiting_run_hibernates_and_its_approval_wakes_it(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    waiting = _hibernated_ticket_run(conn, scripted_model, worker)
    wf, expires_at = waiting.workflow, waiting.approval.expires_at
    # Parked until the approval's own expiry, on its queue, with the dispatch given back.
    assert expires_at is not None
    assert abs(wf["delay_until_epoch_ms"] / 1000 - expires_at.timestamp()) < 2
    assert wf["queue_name"] == "ledgerloop_runs"
    assert wf["recovery_attempts"] == 0  # counted at its dispatch, given back by the park
    assert len(waiting.model.requests()) == 1

    approval_decide(
        conn, approval_id=waiting.approval.id, principal=waiting.approver, decision="approve"
    )
    assert wait_terminal(conn, waiting.run_id).status is RunStatus.SUCCEEDED
    assert _stats(tickets)["created"] == 1
    # Resumed from the journal: the first turn was not asked again.
    assert len(waiting.model.requests()) == 2
    assert _workflow(conn, waiting.run_id)["status"] == "SUCCESS"


def test_many_hibernated_runs_each_wake_once(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    model = scripted_model(_ticket_script("write_ticket"))
    worker(model.url)
    approver, _ = principal_create(conn, name="alice", roles=["approver"])
    runs = [start_test_run(conn, "ops", f"disk {i} is full") for i in range(20)]
    approvals = [_pending_approval(conn, run_id) for run_id in runs]
    for run_id in runs:
        _hibernated(conn, run_id)
    for approval in approvals:
        approval_decide(conn, approval_id=approval.id, principal=approver, decision="approve")
    for run_id in runs:
        assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
    assert _stats(tickets)["created"] == 20
    assert len(model.requests()) == 40


def test_a_hibernated_approval_still_expires_on_time(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    model = scripted_model(_ticket_script("patient_ticket"))
    worker(model.url)
    run_id = start_test_run(conn, "writer", "file it")
    approval = _pending_approval(conn, run_id)
    _hibernated(conn, run_id)
    # Nobody decides: DBOS enqueues the run at the deadline and the replayed wait times out.
    run = wait_terminal(conn, run_id, timeout=30)
    assert run.status is RunStatus.CANCELLED
    assert run.state["reason"] == "approval_expired"
    (expired,) = approval_list(conn, run_id=run_id)
    assert expired.id == approval.id
    assert expired.status.value == "expired"
    assert _stats(tickets)["created"] == 0


def test_cancelling_a_hibernated_run_stops_it_for_good(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    waiting = _hibernated_ticket_run(conn, scripted_model, worker)
    cancelled = cancel_run(conn, waiting.run_id, workflows=DBOS, requested_by="test")
    assert cancelled.workflow_cancelled
    assert _workflow(conn, waiting.run_id)["status"] == "CANCELLED"
    with pytest.raises(Exception, match="cancelled"):
        approval_decide(
            conn, approval_id=waiting.approval.id, principal=waiting.approver, decision="approve"
        )
    assert wait_terminal(conn, waiting.run_id).status is RunStatus.CANCELLED
    assert _stats(tickets)["created"] == 0
    assert len(waiting.model.requests()) == 1


def test_an_effect_wait_hibernates_and_the_outcome_wakes_it(
    conn: Conn, db_url: str, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    # No relay at first: the effect stays pending and the run hibernates waiting for it.
    model = scripted_model(_ticket_script("ticket_idempotent"))
    worker(model.url, relay=False)
    run_id = start_test_run(conn, "writer", "file it")
    _hibernated(conn, run_id)
    (effect,) = effect_list(conn, run_id=run_id)
    assert effect.status.value == "pending"
    env = worker_env(
        db_url,
        LEDGERLOOP_POLICY_FILE=str(REPO / "tests" / "support" / "policy.yaml"),
        LEDGERLOOP_AGENT_MODULES="tests.support.agents",
        LEDGERLOOP_DESTINATIONS=json.dumps({"tickets": tickets.url}),
    )
    relay = start_relay(env)
    try:
        # The relay's outcome commit messages the run; the message wakes it.
        run = wait_terminal(conn, run_id, timeout=30)
    finally:
        stop_worker(relay)
    assert run.status is RunStatus.SUCCEEDED
    assert _stats(tickets)["created"] == 1
    assert len(model.requests()) == 2


def test_hibernation_off_keeps_waiting_runs_resident(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    model = scripted_model(_ticket_script("write_ticket"))
    worker(model.url, hibernate_after_s=0)
    run_id = start_test_run(conn, "ops", "db-1 disk is full")
    _pending_approval(conn, run_id)
    with pytest.raises(AssertionError, match="condition not met"):
        _hibernated(conn, run_id, timeout=1.5)
    assert _workflow(conn, run_id)["status"] == "PENDING"


def test_hibernated_runs_free_their_place_on_a_bounded_worker(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    model = scripted_model(_ticket_script("write_ticket"))
    worker(model.url, worker_concurrency=2)
    runs = [start_test_run(conn, "ops", f"disk {i} is full") for i in range(5)]
    # Two at a time, yet all five end up waiting: each hibernation frees a place.
    for run_id in runs:
        _hibernated(conn, run_id, timeout=30)
    assert all(_pending_approval(conn, run_id) for run_id in runs)


def test_a_bounded_worker_without_hibernation_holds_the_rest_on_the_queue(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    model = scripted_model(_ticket_script("write_ticket"))
    worker(model.url, worker_concurrency=2, hibernate_after_s=0)
    runs = [start_test_run(conn, "ops", f"disk {i} is full") for i in range(3)]
    for run_id in runs[:2]:
        _pending_approval(conn, run_id)
    statuses = [_workflow(conn, run_id)["status"] for run_id in runs]
    assert sorted(statuses) == ["ENQUEUED", "PENDING", "PENDING"]


def test_runs_a_stopped_worker_was_executing_go_to_the_next_worker(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    model = scripted_model(_ticket_script("write_ticket"))
    first = worker(model.url, hibernate_after_s=0)
    approver, _ = principal_create(conn, name="alice", roles=["approver"])
    run_id = start_test_run(conn, "ops", "db-1 disk is full")
    approval = _pending_approval(conn, run_id)
    first.stop()  # a clean stop (a deploy): the waiting run was resident in it
    assert _workflow(conn, run_id)["status"] == "ENQUEUED"
    worker(model.url)
    approval_decide(conn, approval_id=approval.id, principal=approver, decision="approve")
    assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
    assert _stats(tickets)["created"] == 1
    assert len(model.requests()) == 2


def test_a_hibernated_run_is_one_trace_with_its_approval_wait_and_delivery(
    conn: Conn,
    scripted_model: Any,
    worker: Any,
    captured: Captured,
    tickets: TicketServiceThread,
) -> None:
    waiting = _hibernated_ticket_run(conn, scripted_model, worker)
    approval_decide(
        conn, approval_id=waiting.approval.id, principal=waiting.approver, decision="approve"
    )
    assert wait_terminal(conn, waiting.run_id).status is RunStatus.SUCCEEDED
    spans = [s for s in captured.spans.get_finished_spans() if s.context is not None]
    trace_id = waiting.run_id.int
    # Everything of the run is in the trace whose id is the run id, under one root.
    mine = [s for s in spans if s.context.trace_id == trace_id]
    (root,) = [s for s in mine if s.parent is None]
    assert root.name == "invoke_agent ops"
    assert root.context.span_id == root_span_id(trace_id)
    ids = {s.context.span_id for s in mine}
    assert all(s.parent.span_id in ids for s in mine if s.parent is not None)
    assert len(ids) == len(mine)  # no span twice
    executions = sorted(
        (s for s in mine if s.name == "execution ops"), key=lambda s: s.start_time or 0
    )
    first, second = executions
    assert all(
        s.parent is not None and s.parent.span_id == root.context.span_id for s in executions
    )
    assert first.attributes is not None
    assert first.attributes.get("ledgerloop.run.hibernated") is True
    assert first.attributes.get("ledgerloop.execution.end") == "hibernated"
    assert first.status.status_code is not StatusCode.ERROR
    assert second.attributes is not None
    assert second.attributes.get("ledgerloop.execution.resumed") is True
    assert second.attributes.get("ledgerloop.execution.end") == "completed"
    # The wait for the person is a span of its own, spanning the hibernation.
    (wait,) = [s for s in mine if s.name == "await_approval write_ticket"]
    wait_attrs = dict(wait.attributes or {})
    assert wait_attrs["ledgerloop.approval.id"] == str(waiting.approval.id)
    assert wait_attrs["ledgerloop.approval.decision"] == "approved"
    assert wait_attrs["ledgerloop.wait.duration_s"] > 0
    assert wait.start_time is not None
    assert first.end_time is not None
    assert wait.start_time <= first.end_time
    # The write ran in the second execution, with the approval on it; the relay's delivery
    # is a CLIENT span in the same trace, linked to it.
    (tool,) = [s for s in mine if s.name == "execute_tool write_ticket"]
    assert tool.parent is not None
    assert tool.parent.span_id == second.context.span_id
    assert dict(tool.attributes or {})["ledgerloop.approval.id"] == str(waiting.approval.id)
    (post,) = [s for s in mine if s.name == "POST"]
    assert post.kind is SpanKind.CLIENT
    assert [link.context.span_id for link in post.links] == [tool.context.span_id]
    assert dict(post.attributes or {})["ledgerloop.effect.status"] == "succeeded"
    # The ticket service received that span's context.
    (sent,) = httpx.get(f"{tickets.url}/_traceparents").json()
    assert sent == f"00-{trace_id:032x}-{post.context.span_id:016x}-01"


def test_a_stopped_workers_execution_ends_its_own_span_and_is_not_rebuilt(
    conn: Conn,
    scripted_model: Any,
    worker: Any,
    captured: Captured,
    tickets: TicketServiceThread,
) -> None:
    model = scripted_model(_ticket_script("write_ticket"))
    first = worker(model.url, hibernate_after_s=0)
    approver, _ = principal_create(conn, name="alice", roles=["approver"])
    run_id = start_test_run(conn, "ops", "db-1 disk is full")
    approval = _pending_approval(conn, run_id)

    def waiting() -> bool:
        # The recv records its timeout (DBOS.sleep) before it waits: the run is in its wait.
        row = conn.execute(
            "SELECT count(*) AS n FROM dbos.operation_outputs "
            "WHERE workflow_uuid = %s AND function_name = 'DBOS.sleep'",
            (str(run_id),),
        ).fetchone()
        return row is not None and row["n"] > 0

    wait_until(waiting, timeout=20)
    first.stop()  # a clean stop: the execution ends its span, and the stop records it
    worker(model.url)
    approval_decide(conn, approval_id=approval.id, principal=approver, decision="approve")
    assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
    mine = [
        s
        for s in captured.spans.get_finished_spans()
        if s.context is not None and s.context.trace_id == run_id.int
    ]
    ids = [s.context.span_id for s in mine]
    assert len(ids) == len(set(ids))  # the stopped execution was not emitted a second time
    assert [s.name for s in mine if s.parent is None] == ["invoke_agent ops"]
    assert all(s.parent.span_id in set(ids) for s in mine if s.parent is not None)
    stopped, resumed = sorted(
        (s for s in mine if s.name == "execution ops"), key=lambda s: s.start_time or 0
    )
    assert dict(stopped.attributes or {})["ledgerloop.execution.end"] == "stopped"
    assert stopped.status.status_code is not StatusCode.ERROR
    assert dict(resumed.attributes or {})["ledgerloop.execution.resumed"] is True
