"""The approval decision of a conditional rule is journaled: a worker killed right after the
approval step decided "no person needed" resumes on that decision, whatever the policy file
says by then, and the effect step still refuses what the rules in force do not allow.

Real worker subprocesses, SIGKILL at the fault point `loop.after_approval`, the real relay and
ticket service, the scripted model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledgerloop.approvals.store import approval_list
from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import effect_list
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.states import RunStatus
from ledgerloop.testing.processes import worker_env, worker_process
from tests.conftest import start_test_run, wait_terminal
from tests.support.refund_policy import REFUND_MODULES, write_refund_policy

pytestmark = pytest.mark.crash

SCRIPT = """
default:
  turns:
    - tool_use:
        name: refund
        input: {amount_cents: 2500, customer: {name: acme, country: DE}}
    - text: "done"
"""


@pytest.fixture
def tickets() -> Iterator[TicketServiceThread]:
    with TicketServiceThread() as service:
        yield service


@pytest.mark.parametrize("threshold_after", [5000, 1000], ids=["same-rules", "stricter-rules"])
def test_a_resumed_run_keeps_the_journaled_decision(
    threshold_after: int,
    conn: Conn,
    db_url: str,
    scripted_model: Any,
    tickets: TicketServiceThread,
    tmp_path: Path,
) -> None:
    model = scripted_model(SCRIPT)
    before, after = tmp_path / "before", tmp_path / "after"
    before.mkdir()
    after.mkdir()
    stricter = {"requires_approval": {"when": {"field": "amount_cents", "gte": threshold_after}}}
    env = worker_env(
        db_url,
        ANTHROPIC_BASE_URL=model.url,
        LEDGERLOOP_AGENT_MODULES=",".join(REFUND_MODULES),
        LEDGERLOOP_DESTINATIONS=json.dumps({"tickets": tickets.url}),
    )
    first_env = {
        **env,
        "LEDGERLOOP_POLICY_FILE": str(write_refund_policy(before)),
        "LEDGERLOOP_FAULTS": "loop.after_approval",
    }
    with worker_process(first_env, log=tmp_path / "w1.log") as first:
        run_id = start_test_run(conn, "refunder", "refund 25 euros")
        assert first.wait(timeout=60) == -9, (tmp_path / "w1.log").read_text()
    assert effect_list(conn, run_id=run_id) == []  # killed between the decision and the act

    second_env = {**env, "LEDGERLOOP_POLICY_FILE": str(write_refund_policy(after, **stricter))}
    with worker_process(second_env, log=tmp_path / "w2.log"):
        run = wait_terminal(conn, run_id, timeout=60)
    assert run.status is RunStatus.SUCCEEDED, (tmp_path / "w2.log").read_text()
    # The journaled decision stands: nobody was asked, on either side of the kill.
    assert approval_list(conn, run_id=run_id) == []
    created = httpx.get(f"{tickets.url}/_stats").json()["created"]
    last = model.requests()[-1]["request"]["messages"][-1]
    (result,) = [b for b in last["content"] if b.get("type") == "tool_result"]
    if threshold_after == 5000:
        assert created == 1
        assert not result.get("is_error")
    else:
        # The rules in force now ask for a person: the effect step records nothing and says so.
        assert created == 0
        assert effect_list(conn, run_id=run_id) == []
        assert result["is_error"]
        assert "the policy asks for an approval" in json.dumps(result["content"])
