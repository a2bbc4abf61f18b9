"""Approval that depends on the arguments, through a real worker: below the policy's threshold
the refund runs without a person; at it, the run waits for an approval as any gated write.

Real Postgres, real DBOS worker, relay and ticket service, the real SDK against the scripted
model. The refund agent and its rules: tests/support/refund_agents.py.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledgerloop.approvals.principals import principal_create
from ledgerloop.approvals.store import approval_decide, approval_list
from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import effect_list
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_events, run_require
from ledgerloop.testing.postgres import wait_until
from tests.conftest import start_test_run, wait_terminal
from tests.support.refund_policy import REFUND_MODULES, write_refund_policy

SCRIPT = """
conversations:
  - match: "small refund"
    turns:
      - tool_use:
          name: refund
          input: {amount_cents: 4999, customer: {name: acme, country: DE}, reason: late}
      - text: "Refunded."
  - match: "large refund"
    turns:
      - tool_use:
          name: refund
          input: {amount_cents: 5000, customer: {name: acme, country: DE}, reason: broken}
      - text: "Refunded."
default:
  turns: [{text: "nothing to do"}]
"""


def _created(tickets: TicketServiceThread) -> int:
    return int(httpx.get(f"{tickets.url}/_stats").json()["created"])


@pytest.fixture
def refund_worker(scripted_model: Any, worker: Any, tmp_path: Path) -> Any:
    model = scripted_model(SCRIPT)
    worker(
        model.url,
        policy_file=write_refund_policy(tmp_path),
        agent_modules=REFUND_MODULES,
    )
    return model


def _events(conn: Conn, run_id: uuid.UUID) -> list[str]:
    return [event.event_type for event in run_events(conn, run_id)]


def test_below_the_threshold_the_refund_runs_without_an_approval(
    conn: Conn, refund_worker: Any, tickets: TicketServiceThread
) -> None:
    run_id = start_test_run(conn, "refunder", "small refund for acme")
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.SUCCEEDED
    assert approval_list(conn, run_id=run_id) == []
    assert "approval_requested" not in _events(conn, run_id)
    assert _created(tickets) == 1
    (effect,) = effect_list(conn, run_id=run_id)
    assert effect.status.value == "succeeded"


def test_at_the_threshold_the_refund_waits_for_an_approval(
    conn: Conn, refund_worker: Any, tickets: TicketServiceThread
) -> None:
    approver, _ = principal_create(conn, name="alice", roles=["approver"])
    run_id = start_test_run(conn, "refunder", "large refund for acme")

    def pending() -> Any:
        found = approval_list(conn, run_id=run_id, status="pending")
        return found[0] if found else None

    approval = wait_until(pending, timeout=20)
    assert run_require(conn, run_id).status is RunStatus.AWAITING_APPROVAL
    # The policy's template makes the summary (it wins over the tool's own preview).
    assert approval.preview["summary"] == "Refund 5000 cents to acme (DE)"
    assert _created(tickets) == 0  # nothing happens before the approval
    approval_decide(conn, approval_id=approval.id, principal=approver, decision="approve")
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.SUCCEEDED
    assert _created(tickets) == 1
    (effect,) = effect_list(conn, run_id=run_id)
    assert effect.request_hash == approval.action_hash  # what ran is what was approved
    assert "approval_requested" in _events(conn, run_id)
