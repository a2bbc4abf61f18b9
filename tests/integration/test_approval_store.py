"""Approvals on a real Postgres: bound to one action hash, decided once, and the decision and
the workflow's message committed together. Events arrive twice, out of order and late."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from ledgerloop.approvals import (
    ApprovalConflict,
    ApprovalNotFound,
    ApprovalStatus,
    ApprovalUndeliverable,
    Forbidden,
    InvalidApprovalInput,
    Principal,
    Unauthenticated,
    approval_cancel_for_run,
    approval_decide,
    approval_expire,
    approval_get,
    approval_list,
    approval_request,
    principal_create,
    principal_revoke,
    render_preview,
)
from ledgerloop.approvals.store import Approval
from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db.connect import Conn, connect, tenant_scope
from ledgerloop.effects.hashing import request_hash
from ledgerloop.runs.start import start_run
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import Outcome, Run, RunNotFound, run_create, run_require, run_transition
from ledgerloop.testing.postgres import wait_until

A = ApprovalStatus
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
ARGS = {"ticket_id": 4711, "priority": "high"}


def _waiting_run(conn: Conn, tenant: uuid.UUID = DEFAULT_TENANT, *, workflow: bool = True) -> Run:
    """A run in awaiting_approval; with a DBOS workflow row (via start_run) unless told not."""
    if workflow:
        run = run_require(conn, start_run(conn, agent="ops", input={}, tenant_id=tenant))
    else:
        run, _ = run_create(conn, agent="ops", input={}, tenant_id=tenant)
    run = run_transition(conn, run, RunStatus.PLANNING, "started").run
    return run_transition(conn, run, RunStatus.AWAITING_APPROVAL, "approval_requested").run


def _request(
    conn: Conn,
    run: Run,
    *,
    call: str = "call-1",
    args: dict[str, Any] = ARGS,
    roles: tuple[str, ...] = ("approver",),
    expires_at: datetime | None = T0 + timedelta(hours=8),
) -> Approval:
    return approval_request(
        conn,
        run_id=run.id,
        tenant_id=run.tenant_id,
        tool="close_ticket",
        tool_call_id=call,
        action_hash=request_hash("close_ticket", args, "tickets", "p1"),
        preview=render_preview("close_ticket", args),
        policy_version="p1",
        required_roles=roles,
        expires_at=expires_at,
        now=T0,
    )


def _approver(
    conn: Conn, name: str = "alice", *roles: str, tenant: uuid.UUID = DEFAULT_TENANT
) -> Principal:
    principal, _ = principal_create(conn, name=name, roles=roles or ("approver",), tenant_id=tenant)
    return principal


def _notifications(conn: Conn) -> list[dict[str, Any]]:
    return conn.execute(
        "SELECT destination_uuid, topic, message_uuid, message, serialization "
        "FROM dbos.notifications ORDER BY created_at_epoch_ms"
    ).fetchall()


def _decide(conn: Conn, approval: Approval, who: Principal, decision: str, **kw: Any) -> Any:
    return approval_decide(
        conn, approval_id=approval.id, principal=who, decision=decision, now=T0, **kw
    )


# -- requesting -------------------------------------------------------------------------------


def test_request_is_idempotent(conn: Conn) -> None:
    run = _waiting_run(conn)
    first = _request(conn, run)
    again = _request(conn, run)
    assert again == first
    assert first.status is A.PENDING
    assert first.requested_at == T0
    assert first.required_roles == ("approver",)
    assert first.preview["summary"].startswith("close_ticket(")
    assert len(approval_list(conn, run_id=run.id)) == 1


def test_new_hash_for_the_same_call_supersedes_the_pending_one(conn: Conn) -> None:
    run = _waiting_run(conn)
    old = _request(conn, run)
    new = _request(conn, run, args={**ARGS, "priority": "low"})
    other_call = _request(conn, run, call="call-2")
    assert new.action_hash != old.action_hash
    superseded = approval_get(conn, old.id)
    assert superseded is not None
    assert superseded.status is A.SUPERSEDED
    assert superseded.closed_at == T0
    assert approval_get(conn, new.id) == new
    assert new.status is A.PENDING
    assert other_call.status is A.PENDING  # another tool call is another question
    # Replaying the old request (a crashed step re-running) neither revives it nor
    # supersedes the newer one.
    assert _request(conn, run).status is A.SUPERSEDED
    assert approval_get(conn, new.id) == new

    with pytest.raises(ApprovalConflict, match="superseded") as info:
        _decide(conn, old, _approver(conn), "approve")
    assert info.value.state == "superseded"
    assert _notifications(conn) == []


def test_request_for_another_tenants_run_is_refused(conn: Conn) -> None:
    run = _waiting_run(conn)
    with pytest.raises(RunNotFound):
        approval_request(
            conn,
            run_id=run.id,
            tenant_id=uuid.uuid4(),
            tool="t",
            tool_call_id="c",
            action_hash="h",
            preview={},
            policy_version="p1",
        )
    _request(conn, run)
    with pytest.raises(RunNotFound):  # even when the same action already has a record
        approval_request(
            conn,
            run_id=run.id,
            tenant_id=uuid.uuid4(),
            tool="close_ticket",
            tool_call_id="call-1",
            action_hash=request_hash("close_ticket", ARGS, "tickets", "p1"),
            preview={},
            policy_version="p1",
        )


# -- deciding ---------------------------------------------------------------------------------


def test_approve_records_the_decision_and_sends_exactly_one_message(conn: Conn) -> None:
    run = _waiting_run(conn)
    approval = _request(conn, run)
    alice = _approver(conn)

    decided = _decide(conn, approval, alice, "approve", reason="checked the ticket")

    assert decided.outcome is Outcome.APPLIED
    row = approval_get(conn, approval.id)
    assert row == decided.approval
    assert row is not None
    assert (row.status, row.decision, row.reason) == (A.APPROVED, "approved", "checked the ticket")
    assert (row.decided_by_principal, row.decided_by_name) == (alice.id, "alice")
    assert (row.auth_token_id, row.auth_role) == (alice.id, "approver")
    assert row.decided_at == T0
    [note] = _notifications(conn)
    assert note["destination_uuid"] == str(run.id)
    assert note["topic"] == f"approval:{approval.id}"
    # A fresh message id: nobody can take it first and make DBOS drop the decision's message.
    assert note["message_uuid"].startswith(f"approval:{approval.id}:")
    assert note["serialization"] == "portable_json"
    assert json.loads(note["message"]) == {
        "approval_id": str(approval.id),
        "decision": "approved",
        "action_hash": approval.action_hash,
        "reason": "checked the ticket",
        "decided_by": "alice",
    }
    assert json.loads(note["message"]) == decided.message


def test_same_decision_twice_is_a_duplicate_with_one_message(conn: Conn) -> None:
    run = _waiting_run(conn)
    approval = _request(conn, run)
    alice, bob = _approver(conn, "alice"), _approver(conn, "bob")
    first = _decide(conn, approval, alice, "approve", reason="ok")
    again = _decide(conn, approval, alice, "approve", reason="ok")
    by_another = _decide(conn, approval, bob, "approve", reason="me too")
    assert again.outcome is by_another.outcome is Outcome.DUPLICATE
    assert again.approval == by_another.approval == first.approval  # the first one stands
    assert len(_notifications(conn)) == 1


def test_duplicate_still_counts_after_the_run_moved_on(conn: Conn) -> None:
    run = _waiting_run(conn)
    approval = _request(conn, run)
    alice = _approver(conn)
    _decide(conn, approval, alice, "approve")
    run_transition(conn, run_require(conn, run.id), RunStatus.EXECUTING, "approved")
    assert _decide(conn, approval, alice, "approve").outcome is Outcome.DUPLICATE


@pytest.mark.parametrize(("first", "second"), [("approve", "reject"), ("reject", "approve")])
def test_conflicting_decision_is_refused_in_either_order(
    conn: Conn, first: str, second: str
) -> None:
    run = _waiting_run(conn)
    approval = _request(conn, run)
    alice, bob = _approver(conn, "alice"), _approver(conn, "bob")
    _decide(conn, approval, alice, first)
    with pytest.raises(ApprovalConflict) as info:
        _decide(conn, approval, bob, second)
    past = {"approve": "approved", "reject": "rejected"}[first]
    assert f"already {past} by alice at {T0.isoformat()}" in info.value.message
    assert info.value.status_code == 409
    assert info.value.state == past
    assert not info.value.retryable
    row = approval_get(conn, approval.id)
    assert row is not None
    assert (row.status.value, row.decided_by_name) == (past, "alice")
    assert len(_notifications(conn)) == 1


def test_decision_after_expiry_is_refused_and_marks_it_expired(conn: Conn) -> None:
    run = _waiting_run(conn)
    approval = _request(conn, run, expires_at=T0 + timedelta(minutes=5))
    alice = _approver(conn)
    late = T0 + timedelta(minutes=5, seconds=1)
    with pytest.raises(ApprovalConflict, match="expired") as info:
        approval_decide(
            conn, approval_id=approval.id, principal=alice, decision="approve", now=late
        )
    assert info.value.state == "expired"
    row = approval_get(conn, approval.id)
    assert row is not None
    assert (row.status, row.decision, row.closed_at) == (A.EXPIRED, None, late)
    assert _notifications(conn) == []
    # Still refused once the status says so, whatever clock the caller brings.
    with pytest.raises(ApprovalConflict, match="is expired"):
        _decide(conn, approval, alice, "reject")


def test_decision_at_the_expiry_instant_still_counts(conn: Conn) -> None:
    run = _waiting_run(conn)
    approval = _request(conn, run, expires_at=T0 + timedelta(minutes=5))
    decided = approval_decide(
        conn,
        approval_id=approval.id,
        principal=_approver(conn),
        decision="approve",
        now=T0 + timedelta(minutes=5),
    )
    assert decided.outcome is Outcome.APPLIED


def test_expiry_is_judged_by_database_time_by_default(conn: Conn) -> None:
    run = _waiting_run(conn)
    approval = _request(conn, run, expires_at=datetime.now(UTC) - timedelta(seconds=1))
    with pytest.raises(ApprovalConflict, match="expired"):
        approval_decide(
            conn, approval_id=approval.id, principal=_approver(conn), decision="approve"
        )


def test_principal_without_a_required_role_is_forbidden(conn: Conn) -> None:
    run = _waiting_run(conn)
    approval = _request(conn, run, roles=("finance", "cfo"))
    viewer = _approver(conn, "val", "viewer", "approver")
    with pytest.raises(Forbidden) as info:
        _decide(conn, approval, viewer, "approve")
    assert info.value.status_code == 403
    assert "finance, cfo" in info.value.message
    assert info.value.needed == ("finance", "cfo")
    cfo = _approver(conn, "carol", "cfo")
    assert _decide(conn, approval, cfo, "approve").approval.auth_role == "cfo"
    assert len(_notifications(conn)) == 1


def test_another_tenants_approval_is_not_found(conn: Conn) -> None:
    run = _waiting_run(conn)
    approval = _request(conn, run)
    outsider = _approver(conn, "mallory", tenant=uuid.uuid4())
    with pytest.raises(ApprovalNotFound) as info:
        _decide(conn, approval, outsider, "approve")
    assert info.value.status_code == 404
    unknown = uuid.uuid4()
    with pytest.raises(ApprovalNotFound) as missing:
        approval_decide(conn, approval_id=unknown, principal=outsider, decision="approve")
    # Same words as for an id that does not exist: nothing says the approval is there.
    assert str(info.value).replace(str(approval.id), "ID") == str(missing.value).replace(
        str(unknown), "ID"
    )
    row = approval_get(conn, approval.id)
    assert row is not None
    assert row.status is A.PENDING


def test_decision_on_a_cancelled_run_is_refused(conn: Conn) -> None:
    run = _waiting_run(conn)
    approval = _request(conn, run)
    run_transition(conn, run, RunStatus.CANCELLED, "cancelled")
    with pytest.raises(ApprovalConflict, match=f"run {run.id} is cancelled") as info:
        _decide(conn, approval, _approver(conn), "approve")
    assert info.value.state == "run_cancelled"
    row = approval_get(conn, approval.id)
    assert row is not None
    assert row.status is A.PENDING
    assert _notifications(conn) == []


def test_cancelling_a_run_cancels_its_pending_approvals(conn: Conn) -> None:
    run = _waiting_run(conn)
    decided = _request(conn, run, call="call-1")
    pending = [_request(conn, run, call="call-2"), _request(conn, run, call="call-3")]
    alice = _approver(conn)
    _decide(conn, decided, alice, "approve")
    with conn.transaction():
        run_transition(conn, run_require(conn, run.id), RunStatus.CANCELLED, "cancelled")
        cancelled = approval_cancel_for_run(conn, run.id, now=T0)
    assert sorted(cancelled) == sorted(a.id for a in pending)
    assert {a.id for a in approval_list(conn, status=A.CANCELLED)} == set(cancelled)
    row = approval_get(conn, decided.id)
    assert row is not None
    assert row.status is A.APPROVED  # a decision already made is history, not undone
    with pytest.raises(ApprovalConflict, match="is cancelled") as info:
        _decide(conn, pending[0], alice, "reject")
    assert info.value.state == "cancelled"


def test_revoked_principal_cannot_decide_with_an_old_principal_object(conn: Conn) -> None:
    run = _waiting_run(conn)
    approval = _request(conn, run)
    alice = _approver(conn)
    principal_revoke(conn, alice.id)
    with pytest.raises(Unauthenticated):
        _decide(conn, approval, alice, "approve")


def test_decisions_use_the_stored_roles_not_the_object_handed_in(conn: Conn) -> None:
    run = _waiting_run(conn)
    approval = _request(conn, run)
    viewer = _approver(conn, "val", "viewer")
    forged = Principal(
        id=viewer.id,
        tenant_id=viewer.tenant_id,
        name="val",
        roles=("approver",),
        created_at=viewer.created_at,
        revoked_at=None,
    )
    with pytest.raises(Forbidden):
        _decide(conn, approval, forged, "approve")


def test_unknown_decision_word_is_invalid(conn: Conn) -> None:
    run = _waiting_run(conn)
    approval = _request(conn, run)
    with pytest.raises(InvalidApprovalInput, match="'approve' or 'reject'"):
        _decide(conn, approval, _approver(conn), "approved")


# -- atomicity --------------------------------------------------------------------------------


def test_failed_send_records_no_decision(conn: Conn) -> None:
    run = _waiting_run(conn, workflow=False)  # no dbos.workflow_status row to send to
    approval = _request(conn, run)
    with pytest.raises(ApprovalUndeliverable, match="nothing was recorded"):
        _decide(conn, approval, _approver(conn), "approve")
    row = approval_get(conn, approval.id)
    assert row is not None
    assert (row.status, row.decision, row.decided_by_principal, row.decided_at) == (
        A.PENDING,
        None,
        None,
        None,
    )
    assert _notifications(conn) == []


def test_decision_rolled_back_by_the_caller_leaves_no_message(conn: Conn) -> None:
    run = _waiting_run(conn)
    approval = _request(conn, run)
    with conn.transaction():  # psycopg.Rollback leaves the block quietly
        assert _decide(conn, approval, _approver(conn), "approve").outcome is Outcome.APPLIED
        assert len(_notifications(conn)) == 1
        raise psycopg.Rollback
    row = approval_get(conn, approval.id)
    assert row is not None
    assert row.status is A.PENDING
    assert _notifications(conn) == []


def test_concurrent_opposite_decisions_one_wins_the_other_waits_then_conflicts(
    conn: Conn, db_url: str
) -> None:
    run = _waiting_run(conn)
    approval = _request(conn, run)
    alice, bob = _approver(conn, "alice"), _approver(conn, "bob")
    outcome: dict[str, Any] = {}

    with connect(db_url) as first, connect(db_url, autocommit=True) as second:
        with first.transaction():
            _decide(first, approval, alice, "approve")

            def bob_rejects() -> None:
                try:
                    outcome["result"] = _decide(second, approval, bob, "reject")
                except Exception as exc:
                    outcome["result"] = exc

            thread = threading.Thread(target=bob_rejects)
            thread.start()
            # Bob's transaction must be parked on alice's row lock before she commits. Found
            # by what blocks it, not by his backend's pid: through a transaction-mode pooler
            # (LEDGERLOOP_TEST_POOLER) a client's statements may run on any server connection.
            mine = first.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]  # type: ignore[index]
            wait_until(
                lambda: (
                    conn.execute(
                        "SELECT count(*) AS n FROM pg_stat_activity "
                        "WHERE %s = ANY (pg_blocking_pids(pid))",
                        (mine,),
                    ).fetchone()
                    == {"n": 1}
                ),
                timeout=10,
            )
            assert "result" not in outcome
        thread.join(timeout=10)

    assert isinstance(outcome["result"], ApprovalConflict)
    assert "already approved by alice" in outcome["result"].message
    assert len(_notifications(conn)) == 1


# -- expiry, listing, tenants -----------------------------------------------------------------


def test_expire_marks_only_pending_approvals_past_their_time(conn: Conn) -> None:
    run = _waiting_run(conn)
    approval = _request(conn, run, expires_at=T0 + timedelta(hours=1))
    assert approval_expire(conn, approval.id, T0).status is A.PENDING
    expired = approval_expire(conn, approval.id, T0 + timedelta(hours=2))
    assert (expired.status, expired.closed_at) == (A.EXPIRED, T0 + timedelta(hours=2))

    decided = _request(conn, run, call="call-2", expires_at=T0 + timedelta(hours=1))
    _decide(conn, decided, _approver(conn), "approve")
    # A decision that committed before the timeout stands; the workflow then reads it.
    assert approval_expire(conn, decided.id, T0 + timedelta(hours=2)).status is A.APPROVED

    never = _request(conn, run, call="call-3", expires_at=None)
    assert approval_expire(conn, never.id, T0 + timedelta(days=365)).status is A.PENDING
    with pytest.raises(ApprovalNotFound):
        approval_expire(conn, uuid.uuid4(), T0)


def test_list_filters_and_tenant_scope(conn: Conn) -> None:
    tenant_a, tenant_b = uuid.uuid4(), uuid.uuid4()
    run_a, run_b = _waiting_run(conn, tenant_a), _waiting_run(conn, tenant_b)
    a1 = _request(conn, run_a, call="c1")
    a2 = _request(conn, run_a, call="c2")
    b1 = _request(conn, run_b, call="c1")
    _decide(conn, a2, _approver(conn, "ann", tenant=tenant_a), "reject")

    assert {a.id for a in approval_list(conn)} == {a1.id, a2.id, b1.id}
    assert {a.id for a in approval_list(conn, status="pending")} == {a1.id, b1.id}
    assert {a.id for a in approval_list(conn, run_id=run_a.id)} == {a1.id, a2.id}
    assert len(approval_list(conn, limit=1)) == 1
    with pytest.raises(InvalidApprovalInput, match="unknown approval status"):
        approval_list(conn, status="maybe")

    with tenant_scope(conn, tenant_a):
        assert {a.id for a in approval_list(conn)} == {a1.id, a2.id}
        assert approval_get(conn, b1.id) is None
    with tenant_scope(conn, tenant_b):
        assert [a.id for a in approval_list(conn)] == [b1.id]


def test_tenant_role_may_read_but_not_write_approvals(conn: Conn) -> None:
    run = _waiting_run(conn)
    approval = _request(conn, run)
    with tenant_scope(conn, run.tenant_id):
        assert approval_get(conn, approval.id) is not None
    with pytest.raises(psycopg.errors.InsufficientPrivilege), tenant_scope(conn, run.tenant_id):
        conn.execute("UPDATE ledgerloop.approval SET reason = 'x' WHERE id = %s", (approval.id,))


def test_statuses_match_the_table_constraint(conn: Conn) -> None:
    row = conn.execute(
        "SELECT pg_get_constraintdef(oid) AS def FROM pg_constraint "
        "WHERE conname = 'approval_status_check'"
    ).fetchone()
    assert row is not None
    in_db = set(row["def"].split("ARRAY[")[1].split("]")[0].replace("::text", "").split(", "))
    assert in_db == {f"'{s.value}'" for s in ApprovalStatus}


def test_a_row_cannot_claim_a_decision_without_a_decider(conn: Conn) -> None:
    run = _waiting_run(conn)
    approval = _request(conn, run)
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            "UPDATE ledgerloop.approval SET status = 'approved', closed_at = now() WHERE id = %s",
            (approval.id,),
        )
