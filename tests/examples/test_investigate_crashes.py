"""The investigate example through the crash matrix: a real worker SIGKILLed inside its child
episode (after each kind of recorded step), while the parent waits for approval, after the
approval, and around the change ticket's delivery; restarted, the run must end as it would
have. Besides the harness's invariants (no recorded model turn asked again, at most one
ticket per key), the child's proposal is recorded once and attached to the parent once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from ledgerloop.testing.crash import APPROVAL_BOUNDARIES, crash_matrix

pytestmark = pytest.mark.crash

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "app" / "ledgerloop" / "models" / "scripts" / "investigate.yaml"

# The parent calls wait_for_approval itself (not through `act`, whose fault point marks
# "after approval"): the kill after the decision is the step that reads it.
WHILE_WAITING = APPROVAL_BOUNDARIES[0]
MATRIX = [
    WHILE_WAITING,
    *crash_matrix(
        effects=True,
        steps=[
            "investigator.p0.think-1",  # a tool turn's model call, inside the child
            "investigator.p0.tool-2-*",  # a confined read, inside the child
            "investigator.p0.think-3",  # the answer that is rejected
            "investigator.p0.think-4",  # the accepted answer, before the child's result
            "approve-0-remediation",  # the parent, after the approval was requested
            "approve-0-remediation-1",  # the parent, after reading the decision
        ],
    ),
]


@pytest.mark.parametrize("boundary", MATRIX, ids=str)
def test_investigate_survives(boundary: Any, ledgerloop_crash: Any) -> None:
    harness = ledgerloop_crash(
        script=SCRIPT,
        destinations=["tickets"],
        agent_modules=["ledgerloop.examples.investigate"],
        policy_file=REPO / "tool_policy.yaml",
    )
    outcome = harness.check(
        boundary,
        agent="investigate",
        input={"message": "Checkout answers 503 since 09:14. Why, and what should change?"},
    )
    assert outcome.status == "succeeded", outcome.timeline
    assert outcome.state["applied"] is True, outcome.state
    assert outcome.state["proposal"]["key"] == "database.pool.max_size"
    # Exactly one change ticket, under the parent's key for its one write call.
    assert [(e["idempotency_key"], e["status"]) for e in outcome.effects] == [
        (f"{outcome.run_id}:remediation", "succeeded")
    ]
    assert harness.downstream.count_by_key()[f"{outcome.run_id}:remediation"] == 1
    # The model answered each of the investigator's five turns once.
    answered = [r for r in harness.model.requests() if r.get("status") == 200]
    assert sorted(r["turn"] for r in answered) == [0, 1, 2, 3, 4]
    episode = f"{outcome.run_id}.episode-0"
    with psycopg.connect(harness.database_url, row_factory=dict_row) as conn:
        attached = conn.execute(
            "SELECT function_name FROM dbos.operation_outputs WHERE workflow_uuid = %s "
            "AND child_workflow_id = %s ORDER BY function_id",
            (str(outcome.run_id), episode),
        ).fetchall()
        child = conn.execute(
            "SELECT status, output FROM dbos.workflow_status WHERE workflow_uuid = %s",
            (episode,),
        ).fetchone()
        children = conn.execute(
            "SELECT count(*) AS n FROM dbos.workflow_status WHERE workflow_uuid LIKE %s",
            (f"{outcome.run_id}.episode-%",),
        ).fetchone()
    assert [a["function_name"] for a in attached] == ["ledgerloop_episode", "DBOS.getResult"]
    assert child is not None
    assert child["status"] == "SUCCESS"
    assert children is not None
    assert children["n"] == 1  # a resumed parent attached to its child, never a second one
