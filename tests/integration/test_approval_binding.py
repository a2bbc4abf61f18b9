"""An approval allows the one call it was asked for: handed to another call with the same
arguments, or to another run, it lets nothing run, and the refusal says what did not match.

The orchestration (tests/support/approval_agents.py) uses only the public primitives, as a
user's would: `wait_for_approval` for call pay-a, then `write_effect` for pay-a and for
pay-b with pay-a's `Approved`; a second run builds `Approved` from the first run's approval id
and hash. Both the one-statement record (this worker's relay sends the write) and the
transaction for a relay's claim (inline delivery off) are held to it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ledgerloop.approvals.principals import principal_create
from ledgerloop.approvals.store import approval_decide, approval_list
from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import effect_list
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.models.scripted_server import ScriptedModelServer
from ledgerloop.runs.start import start_run
from ledgerloop.runs.states import RunStatus
from ledgerloop.testing.postgres import wait_until
from tests.conftest import wait_terminal

MODULES = "tests.support.agents,tests.support.approval_agents"


def _created(tickets: TicketServiceThread) -> int:
    return int(httpx.get(f"{tickets.url}/_stats").json()["created"])


@pytest.mark.parametrize("inline_delivery", [True, False], ids=["one_statement", "relay_claim"])
def test_one_approval_pays_once_for_its_own_call_and_run(
    conn: Conn,
    scripted_model: Callable[[str], ScriptedModelServer],
    worker: Any,
    tickets: TicketServiceThread,
    inline_delivery: bool,
) -> None:
    model = scripted_model("default:\n  turns:\n    - text: never asked\n")
    worker(model.url, agent_modules=MODULES, inline_delivery=inline_delivery)
    first = start_run(conn, agent="approval_spender", input={})
    pending = wait_until(
        lambda: next(iter(approval_list(conn, run_id=first, status="pending")), None),
        timeout=30,
    )
    assert pending.tool_call_id == "pay-a"
    alice, _ = principal_create(conn, name="alice", roles=["approver"])
    approval_decide(conn, approval_id=pending.id, principal=alice, decision="approve")

    run = wait_terminal(conn, first)
    assert run.status is RunStatus.SUCCEEDED, run.state
    results = run.state["results"]
    assert results["pay-a"]["is_error"] is False, results  # its own call: delivered
    assert results["pay-b"]["is_error"] is True, results
    assert results["pay-b"]["content"] == (
        f"refused: approval {pending.id} was granted for run {first} call pay-a, "
        f"not run {first} call pay-b; a changed action needs a new approval"
    )
    assert [e.key for e in effect_list(conn, run_id=first)] == [f"{first}:pay-a"]
    assert _created(tickets) == 1

    # Another run, with no approval of its own, names pay-a's approval for its own pay-a.
    second = start_run(conn, agent="approval_spender", input={"approval": run.state["approval"]})
    other = wait_terminal(conn, second)
    assert other.status is RunStatus.SUCCEEDED, other.state
    refused = other.state["results"]["pay-a"]
    assert refused["is_error"] is True, refused
    assert refused["content"] == (
        f"refused: approval {pending.id} was granted for run {first} call pay-a, "
        f"not run {second} call pay-a; a changed action needs a new approval"
    )
    assert effect_list(conn, run_id=second) == []
    assert _created(tickets) == 1  # one approval, one payment
