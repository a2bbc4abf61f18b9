"""Behind the role boundary, the parts still check each other (docs/security.md).

The writer here is a superuser, which no privilege stops: it stands for a role that was
granted too much, or a bug. The relay sends only effects a run's act step recorded (and, for
a call put to a person, only the exact action that person approved), and a run's workflow
executes only under the run's own id.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ledgerloop.approvals.principals import principal_create
from ledgerloop.db.connect import Conn
from ledgerloop.effects.hashing import request_hash
from ledgerloop.effects.ledger import Effect, effect_begin, effect_require
from ledgerloop.effects.messages import EffectStatus
from ledgerloop.effects.outbox import UNVOUCHED
from ledgerloop.effects.testing import act_event, drain_outbox, workflow_row
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.fleet.views import runs_stuck
from ledgerloop.runs.store import DEFAULT_TENANT, run_create
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.worker import WorkerThread
from tests.conftest import start_test_run, wait_terminal

BODY = {"title": "forged", "body": "x", "priority": "high"}


def _created(tickets: TicketServiceThread) -> int:
    created: int = httpx.get(f"{tickets.url}/_stats").json()["created"]
    return created


def _effect(conn: Conn, *, vouched: bool, call_id: str = "call-1") -> Effect:
    run_id = run_create(conn, agent="ops", input={})[0].id
    workflow_row(conn, run_id)
    key = f"{run_id}:{call_id}"
    if vouched:
        act_event(conn, run_id, key, call_id=call_id)
    request = {"path": "/idempotent/tickets", "body": BODY, "honours_idempotency": True}
    return effect_begin(
        conn,
        key=key,
        run_id=run_id,
        tenant_id=DEFAULT_TENANT,
        tool="write_ticket",
        request_hash=request_hash("write_ticket", BODY, "tickets", "v1"),
        destination="tickets",
        request=request,
    )


def _approval(conn: Conn, effect: Effect, *, status: str, action_hash: str) -> None:
    """An approval row for the effect's call, decided as a principal would have."""
    principal, _ = principal_create(conn, name="ana", roles=["approver"])
    decided = status in ("approved", "rejected")
    conn.execute(
        "INSERT INTO ledgerloop.approval (id, run_id, tenant_id, tool, tool_call_id, "
        "action_hash, policy_version, required_roles, status, decision, "
        "decided_by_principal, auth_role, decided_at, closed_at) "
        "VALUES (gen_random_uuid(), %(run)s, %(tenant)s, 'write_ticket', 'call-1', %(hash)s, "
        "'v1', ARRAY['approver'], %(status)s, %(decision)s, %(by)s, %(role)s, "
        "CASE WHEN %(decided)s THEN now() END, CASE WHEN %(closed)s THEN now() END)",
        {
            "run": effect.run_id,
            "tenant": effect.tenant_id,
            "hash": action_hash,
            "status": status,
            "decision": status if decided else None,
            "by": principal.id if decided else None,
            "role": "approver" if decided else None,
            "decided": decided,
            "closed": status != "pending",
        },
    )


def test_an_effect_no_act_step_recorded_is_never_sent(
    conn: Conn, db_url: str, tickets: TicketServiceThread
) -> None:
    forged = _effect(conn, vouched=False)
    drain_outbox(db_url, {"tickets": tickets.url})
    assert _created(tickets) == 0
    refused = effect_require(conn, forged.key)
    assert refused.status == EffectStatus.FAILED
    assert refused.error == UNVOUCHED
    row = conn.execute(
        "SELECT status, last_error FROM ledgerloop.outbox WHERE idempotency_key = %s",
        (forged.key,),
    ).fetchone()
    assert row == {"status": "dead", "last_error": UNVOUCHED}
    # The control: the same effect, recorded with its step's event, is sent once.
    recorded = _effect(conn, vouched=True)
    drain_outbox(db_url, {"tickets": tickets.url})
    assert _created(tickets) == 1
    assert effect_require(conn, recorded.key).status == EffectStatus.SUCCEEDED


@pytest.mark.parametrize(
    ("status", "same_action", "sent"),
    [
        ("approved", True, True),
        ("approved", False, False),
        ("pending", True, False),
        ("rejected", True, False),
    ],
    ids=["approved", "approved-another-action", "pending", "rejected"],
)
def test_a_call_put_to_a_person_is_sent_only_as_approved(
    conn: Conn,
    db_url: str,
    tickets: TicketServiceThread,
    status: str,
    same_action: bool,
    sent: bool,
) -> None:
    effect = _effect(conn, vouched=True)
    other = request_hash("write_ticket", {**BODY, "title": "other"}, "tickets", "v1")
    _approval(
        conn, effect, status=status, action_hash=effect.request_hash if same_action else other
    )
    drain_outbox(db_url, {"tickets": tickets.url})
    assert _created(tickets) == (1 if sent else 0)
    expected = EffectStatus.SUCCEEDED if sent else EffectStatus.FAILED
    assert effect_require(conn, effect.key).status == expected


def test_a_second_workflow_of_a_run_does_nothing_and_is_listed(
    conn: Conn, worker: Callable[..., WorkerThread], scripted_model: Any
) -> None:
    model = scripted_model("default:\n  turns:\n    - text: all done\n")
    worker(model.url)
    run_id = start_test_run(conn, "looper", "hi")
    wait_terminal(conn, run_id)
    calls = len(model.requests())
    assert calls == 1
    version = conn.execute(
        "SELECT application_version FROM dbos.workflow_status WHERE workflow_uuid = %s",
        (str(run_id),),
    ).fetchone()
    assert version is not None
    stray = f"stray-{uuid.uuid4()}"
    conn.execute(
        "SELECT dbos.enqueue_workflow('ledgerloop_run', 'ledgerloop_runs', "
        "ARRAY[to_json(%(run)s::text)], workflow_id => %(id)s, app_version => %(v)s)",
        {"run": str(run_id), "id": stray, "v": version["application_version"]},
    )
    conn.execute("SELECT pg_notify('ledgerloop_runs', %s)", (str(run_id),))
    wait_until(
        lambda: conn.execute(
            "SELECT 1 FROM dbos.workflow_status WHERE workflow_uuid = %s AND status = 'ERROR'",
            (stray,),
        ).fetchone(),
        timeout=30,
    )
    assert len(model.requests()) == calls  # no model call paid again
    steps = conn.execute(
        "SELECT count(*) AS n FROM dbos.operation_outputs WHERE workflow_uuid = %s", (stray,)
    ).fetchone()
    assert steps == {"n": 0}
    listed = [s for s in runs_stuck(conn, stale_after_s=5) if s.run_id == run_id]
    assert [s.problem for s in listed] == [f"a second workflow of the run, {stray}, refused to run"]
