"""An approval that does not cover the action the run is about to take lets nothing run, and
the run's history says so: a mismatch with both hashes, never a rejection nobody made.

The approval row is altered behind the API (as a database superuser could), then decided by
a real approver: the row says `approved`, by alice, for another action than the run's."""

from __future__ import annotations

from typing import Any

import httpx

from ledgerloop.approvals.principals import principal_create
from ledgerloop.approvals.store import ApprovalStatus, approval_decide, approval_get, approval_list
from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import effect_list
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_events
from ledgerloop.testing.postgres import wait_until
from tests.conftest import TICKET_SCRIPT, start_test_run, wait_terminal

OTHER_ACTION = "0" * 64


def test_an_approval_of_another_action_runs_nothing_and_is_recorded_as_a_mismatch(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    model = scripted_model(TICKET_SCRIPT)
    worker(model.url)
    run_id = start_test_run(conn, "ops", "db-1 disk is full")
    approval = wait_until(
        lambda: next(iter(approval_list(conn, run_id=run_id, status="pending")), None),
        timeout=20,
    )
    own_hash = approval.action_hash
    assert own_hash != OTHER_ACTION
    conn.execute(
        "UPDATE ledgerloop.approval SET action_hash = %s WHERE id = %s", (OTHER_ACTION, approval.id)
    )
    alice, _ = principal_create(conn, name="alice", roles=["approver"])
    approval_decide(conn, approval_id=approval.id, principal=alice, decision="approve")

    run = wait_terminal(conn, run_id)
    assert (run.status, run.state.get("reason")) == (RunStatus.FAILED, "approval_mismatch"), run
    # Nothing was written or sent: the gated action never ran.
    assert effect_list(conn, run_id=run_id) == []
    assert httpx.get(f"{tickets.url}/_stats").json()["created"] == 0
    # The audit trail agrees with itself: the row says what alice approved, the run's history
    # says why that did not cover its action (both hashes), and nobody rejected anything.
    row = approval_get(conn, approval.id)
    assert row is not None
    assert (row.status, row.decided_by_name) == (ApprovalStatus.APPROVED, "alice")
    events = run_events(conn, run_id)
    assert not [e for e in events if e.event_type == "approval_rejected"], events
    failed = next(e for e in events if e.payload.get("reason") == "approval_mismatch")
    problem = str(failed.payload)
    assert OTHER_ACTION in problem, failed.payload
    assert own_hash in problem, failed.payload
    # The model was never told the ticket was filed: it got no second turn.
    assert len(model.requests()) == 1
