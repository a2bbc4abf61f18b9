"""Write tools end to end: approval, effect + outbox, relay, reconciler, the run resuming.

Real Postgres, real DBOS worker (in-process), real relay and reconciler, the real ticket
service over HTTP, the real SDK against the scripted model.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import psycopg
import pytest

from ledgerloop.approvals.principals import principal_create
from ledgerloop.approvals.store import approval_decide, approval_list
from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import Effect, effect_list, effect_resolve
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_events, run_require
from ledgerloop.testing.postgres import wait_until
from tests.conftest import TICKET_SCRIPT, listen_url, start_test_run, wait_terminal


def _stats(tickets: TicketServiceThread) -> dict[str, Any]:
    stats: dict[str, Any] = httpx.get(f"{tickets.url}/_stats").json()
    return stats


def _fault(tickets: TicketServiceThread, **fault: Any) -> None:
    httpx.post(f"{tickets.url}/_faults", json=fault).raise_for_status()


def _tool_results(model: Any) -> list[dict[str, Any]]:
    last = model.requests()[-1]["request"]["messages"][-1]
    return [b for b in last["content"] if b.get("type") == "tool_result"]


def _status(conn: Conn, run_id: uuid.UUID) -> RunStatus:
    return run_require(conn, run_id).status


def _pending_approval(conn: Conn, run_id: uuid.UUID) -> Any:
    def pending() -> Any:
        found = approval_list(conn, run_id=run_id, status="pending")
        return found[0] if found else None

    return wait_until(pending, timeout=20)


def test_approved_write_files_exactly_one_ticket(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    model = scripted_model(TICKET_SCRIPT)
    worker(model.url)
    approver, _ = principal_create(conn, name="alice", roles=["approver"])
    run_id = start_test_run(conn, "ops", "db-1 disk is full")
    approval = _pending_approval(conn, run_id)
    assert _status(conn, run_id) is RunStatus.AWAITING_APPROVAL
    # No summary template in the policy: the tool's own preview is what the approver reads.
    assert approval.preview["summary"] == "[high] db-1 disk full"
    assert _stats(tickets)["created"] == 0  # nothing happens before the approval
    approval_decide(conn, approval_id=approval.id, principal=approver, decision="approve")
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.SUCCEEDED
    assert _stats(tickets)["created"] == 1
    (result,) = _tool_results(model)
    assert not result["is_error"]
    assert json.loads(result["content"])["title"] == "db-1 disk full"
    (effect,) = effect_list(conn, run_id=run_id)
    assert effect.status.value == "succeeded"
    assert effect.request_hash == approval.action_hash  # what ran is what was approved
    assert effect.key.startswith(f"{run_id}:")


def test_rejected_write_goes_back_to_the_model(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    model = scripted_model(TICKET_SCRIPT)
    worker(model.url)
    approver, _ = principal_create(conn, name="bob", roles=["approver"])
    run_id = start_test_run(conn, "ops", "db-1 disk is full")
    approval = _pending_approval(conn, run_id)
    approval_decide(
        conn, approval_id=approval.id, principal=approver, decision="reject", reason="not now"
    )
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.SUCCEEDED
    (result,) = _tool_results(model)
    assert result["is_error"]
    assert result["content"] == "rejected by bob: not now"
    assert _stats(tickets)["created"] == 0
    assert effect_list(conn, run_id=run_id) == []


def test_reject_with_on_reject_cancel_cancels_the_run(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    model = scripted_model(
        "default: {turns: [{tool_use: {name: urgent_ticket, input: {title: x}}}, {text: nope}]}"
    )
    worker(model.url)
    approver, _ = principal_create(conn, name="carol", roles=["approver"])
    run_id = start_test_run(conn, "writer", "urgent")
    approval = _pending_approval(conn, run_id)
    approval_decide(conn, approval_id=approval.id, principal=approver, decision="reject")
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.CANCELLED
    assert run.state["reason"] == "approval_rejected"
    assert len(model.requests()) == 1
    assert _stats(tickets)["created"] == 0


def test_unanswered_approval_expires_and_cancels(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    model = scripted_model(
        "default: {turns: [{tool_use: {name: urgent_ticket, input: {title: x}}}, {text: nope}]}"
    )
    worker(model.url)
    run_id = start_test_run(conn, "writer", "urgent")
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.CANCELLED
    assert run.state["reason"] == "approval_expired"
    (approval,) = approval_list(conn, run_id=run_id)
    assert approval.status == "expired"
    assert _stats(tickets)["created"] == 0


def test_downstream_4xx_is_an_error_result(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    model = scripted_model(
        """
        default:
          turns:
            - tool_use: {name: ticket_plain, input: {title: x, priority: urgent}}
            - text: "could not file it"
        """
    )
    worker(model.url)
    run = wait_terminal(conn, start_test_run(conn, "writer", "file"))
    assert run.status is RunStatus.SUCCEEDED
    (result,) = _tool_results(model)
    assert result["is_error"]
    assert "422" in result["content"]
    assert _stats(tickets)["created"] == 0


def test_unknown_outcome_is_reconciled_by_lookup(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    _fault(tickets, mode="commit_then_drop", kind="idempotent")
    model = scripted_model(
        "default: {turns: [{tool_use: {name: ticket_idempotent, input: {title: x}}}, {text: ok}]}"
    )
    worker(model.url)
    run_id = start_test_run(conn, "writer", "file")
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.SUCCEEDED
    assert _stats(tickets)["created"] == 1
    (result,) = _tool_results(model)
    assert not result["is_error"]
    events = [
        r["event_type"]
        for r in conn.execute(
            "SELECT event_type FROM ledgerloop.agent_run_event WHERE run_id = %s ORDER BY sequence",
            (run_id,),
        ).fetchall()
    ]
    assert "reconciling" in events


def test_unknown_outcome_without_lookup_waits_for_a_person(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    _fault(tickets, mode="commit_then_drop", kind="plain")
    model = scripted_model(
        "default: {turns: [{tool_use: {name: ticket_plain, input: {title: x}}}, {text: ok}]}"
    )
    worker(model.url)
    run_id = start_test_run(conn, "writer", "file")

    def parked() -> Any:
        found = effect_list(conn, run_id=run_id, status="needs_human")
        return found[0] if found else None

    effect = wait_until(parked, timeout=20)
    wait_until(lambda: _status(conn, run_id) is RunStatus.RECONCILING)
    assert _stats(tickets)["created"] == 1
    # Never resent on its own: no idempotency and no lookup make a resend unsafe.
    assert _stats(tickets)["requests"] == 1
    effect_resolve(conn, effect.key, succeeded_ref="TCK-000001", operator="ops-oncall")
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.SUCCEEDED
    assert _stats(tickets)["created"] == 1
    # Each round of reconciling is in the history, though the status stayed reconciling.
    rounds = [
        (e.payload["round"], e.payload["effect_status"])
        for e in run_events(conn, run_id)
        if e.event_type == "reconciling"
    ]
    assert rounds == [(1, "outcome_unknown"), (2, "needs_human")]


def test_failed_run_compensates_its_effects_as_new_effects(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    model = scripted_model(
        """
        default:
          turns:
            - tool_use: {name: ticket_undoable, input: {title: "to be undone"}}
            - status: 500
        """
    )
    worker(model.url)
    run_id = start_test_run(conn, "writer", "file then fail")
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.FAILED
    assert run.state["reason"] == "model_call_failed"
    stats = _stats(tickets)
    assert stats["created"] == 1
    assert stats["closed"] == 1
    effects = {e.key: e for e in effect_list(conn, run_id=run_id)}
    (original,) = [e for e in effects.values() if e.compensates is None]
    compensation = effects[original.key + ":compensate"]
    assert compensation.compensates == original.key
    assert compensation.status.value == "succeeded"
    assert run.state["compensations"] == [{"key": compensation.key, "status": "succeeded"}]


def _one_ticket(
    conn: Conn, scripted_model: Any, worker: Any, **settings: Any
) -> tuple[Any, uuid.UUID, Effect]:
    """A run that files one idempotent ticket and succeeds: its model, id and effect."""
    model = scripted_model(
        "default: {turns: [{tool_use: {name: ticket_idempotent, input: {title: x}}}, {text: done}]}"
    )
    worker(model.url, **settings)
    run_id = start_test_run(conn, "writer", "file")
    assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
    (effect,) = effect_list(conn, run_id=run_id)
    return model, run_id, effect


def test_a_quick_outcome_settles_the_act_step_itself(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    model, run_id, effect = _one_ticket(conn, scripted_model, worker)
    (result,) = _tool_results(model)
    assert json.loads(result["content"])["id"] == effect.external_reference
    # The step saw the outcome: no durable wait ran, and since no workflow waited for it
    # (its own worker's relay delivered it), no message was sent (migration 0021).
    functions = conn.execute(
        "SELECT function_name FROM dbos.operation_outputs WHERE workflow_uuid = %s",
        (str(run_id),),
    ).fetchall()
    assert "DBOS.recv" not in {row["function_name"] for row in functions}
    sent = conn.execute(
        "SELECT count(*) AS n FROM dbos.notifications WHERE topic = %s", (effect.key,)
    ).fetchone()
    assert sent == {"n": 0}


def test_every_write_call_of_a_turn_records_its_executing_event(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    model = scripted_model(
        """
        default:
          turns:
            - tool_use:
                - {name: ticket_idempotent, input: {title: one}}
                - {name: ticket_idempotent, input: {title: two}}
            - text: done
        """
    )
    worker(model.url)
    run = wait_terminal(conn, start_test_run(conn, "writer", "two tickets"))
    assert run.status is RunStatus.SUCCEEDED
    assert _stats(tickets)["created"] == 2
    calls = [b["tool_use_id"] for b in _tool_results(model)]
    events = run_events(conn, run.id)
    executing = [e for e in events if e.event_type == "executing"]
    assert [e.payload["tool_call_id"] for e in executing] == calls
    # The think after the write turn moved the run back to planning before it succeeded.
    assert [e.event_type for e in events][-2:] == ["planning", "succeeded"]


@pytest.mark.parametrize("inline", [True, False])
def test_a_worker_running_the_relay_sends_the_effect_from_its_act_step(
    inline: bool,
    conn: Conn,
    db_url: str,
    scripted_model: Any,
    worker: Any,
    tickets: TicketServiceThread,
) -> None:
    """Inline delivery: the act step records its outbox row already claimed and sends it
    itself, so the relay is never woken for it; with inline_delivery off, the relay's claim
    takes the row. Either way: one attempt, one ticket."""
    listener = psycopg.connect(listen_url(db_url), autocommit=True)
    listener.execute("LISTEN ledgerloop_outbox")
    _, _, effect = _one_ticket(conn, scripted_model, worker, inline_delivery=inline)
    assert (effect.status.value, effect.attempts) == ("succeeded", 1)
    outbox = conn.execute(
        "SELECT status, attempts FROM ledgerloop.outbox WHERE idempotency_key = %s", (effect.key,)
    ).fetchone()
    assert outbox == {"status": "done", "attempts": 1}
    wakes = list(listener.notifies(timeout=0.3))
    listener.close()
    assert len(wakes) == (0 if inline else 1)
    assert _stats(tickets)["created"] == 1


def test_a_refused_inline_attempt_is_retried_by_the_relay_at_once(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    """The act step's own attempt is refused (a 503 before anything is created): the retry is
    the relay's, due after a backoff of a fraction of a second. The relay is told, so the retry
    goes out then, not at its next safety poll (5 s)."""
    _fault(tickets, mode="fail_before_commit", kind="idempotent")
    _, _, effect = _one_ticket(conn, scripted_model, worker)
    assert (effect.status.value, effect.attempts) == ("succeeded", 2)
    assert (effect.updated_at - effect.created_at).total_seconds() < 3.5
    assert _stats(tickets)["created"] == 1
    assert _stats(tickets)["requests"] == 2


def test_a_stopping_worker_lets_its_act_steps_deliveries_finish(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    """A worker stopped while an act step's own delivery is under way (a slow downstream)
    lets that call finish and records its outcome before its relay closes: the effect is
    settled, not left started for the reconciler."""
    _fault(tickets, mode="slow", delay_ms=700, kind="idempotent")  # its timeout: 1 s
    model = scripted_model(
        "default: {turns: [{tool_use: {name: ticket_idempotent, input: {title: x}}}, {text: done}]}"
    )
    running = worker(model.url)
    run_id = start_test_run(conn, "writer", "file")
    wait_until(lambda: _stats(tickets)["requests"] == 1, timeout=20)
    running.stop()
    (effect,) = effect_list(conn, run_id=run_id)
    assert (effect.status.value, effect.attempts) == ("succeeded", 1)
    assert _stats(tickets)["created"] == 1
