"""The effect ledger on a real Postgres: one transaction, idempotent begin, key reuse, tenants."""

from __future__ import annotations

import re
import uuid
from typing import Any

import psycopg
import pytest
from dbos import DBOSClient

from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db.connect import Conn, tenant_scope
from ledgerloop.effects.errors import (
    EffectNotFound,
    EffectNotResolvable,
    InvalidCompensation,
    InvalidDeliveryRequest,
    KeyReuse,
)
from ledgerloop.effects.hashing import idempotency_key, request_hash
from ledgerloop.effects.ledger import (
    Effect,
    compensation_begin,
    effect_begin,
    effect_get,
    effect_list,
    effect_resolve,
)
from ledgerloop.effects.messages import REPORTED, DeliveryRequest, EffectStatus, OutboxStatus
from ledgerloop.effects.testing import messages_for, workflow_row
from ledgerloop.errors import LedgerloopError
from ledgerloop.runs.store import run_create

TENANT_A = DEFAULT_TENANT
TENANT_B = uuid.UUID(int=2)
BODY = {"title": "Printer on fire", "body": "third floor", "priority": "high"}
REQUEST = {"path": "/idempotent/tickets", "body": BODY, "honours_idempotency": True}


def new_run(conn: Conn, tenant: uuid.UUID = TENANT_A) -> uuid.UUID:
    return run_create(conn, agent="ops", input={}, tenant_id=tenant)[0].id


def begin(
    conn: Conn,
    run_id: uuid.UUID,
    call: str = "call-1",
    body: dict[str, Any] = BODY,
    tenant: uuid.UUID = TENANT_A,
    request: dict[str, Any] | None = None,
) -> Effect:
    return effect_begin(
        conn,
        key=idempotency_key(str(run_id), call),
        run_id=run_id,
        tenant_id=tenant,
        tool="write_ticket",
        request_hash=request_hash("write_ticket", body, "tickets", "v1"),
        destination="tickets",
        request=request or {**REQUEST, "body": body},
    )


def outbox_rows(conn: Conn, key: str) -> list[dict[str, Any]]:
    return conn.execute(
        "SELECT * FROM ledgerloop.outbox WHERE idempotency_key = %s", (key,)
    ).fetchall()


COUNTS = {
    "activity_effect": "SELECT count(*) AS n FROM ledgerloop.activity_effect",
    "outbox": "SELECT count(*) AS n FROM ledgerloop.outbox",
}


def count(conn: Conn, table: str) -> int:
    row = conn.execute(COUNTS[table]).fetchone()
    assert row is not None
    return int(row["n"])


def test_begin_writes_a_pending_effect_and_its_outbox_row(conn: Conn) -> None:
    run_id = new_run(conn)
    effect = begin(conn, run_id)

    assert effect.key == f"{run_id}:call-1"
    assert (effect.status, effect.attempts, effect.destination) == (
        EffectStatus.PENDING,
        0,
        "tickets",
    )
    [row] = outbox_rows(conn, effect.key)
    assert row["status"] == OutboxStatus.PENDING
    assert row["tenant_id"] == TENANT_A
    assert row["request"] == DeliveryRequest.from_json({**REQUEST}).to_json()
    assert row["request"]["idempotency_header"] == "Idempotency-Key"
    assert row["deadline_at"] > row["available_at"]


def test_outbox_insert_failing_leaves_no_effect(conn: Conn) -> None:
    # Force the outbox insert (only) to fail, as a full disk or a bug would.
    conn.execute(
        """
        CREATE FUNCTION pg_temp.refuse() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN RAISE EXCEPTION 'outbox refused'; END $$;
        CREATE TRIGGER refuse BEFORE INSERT ON ledgerloop.outbox
        FOR EACH ROW EXECUTE FUNCTION pg_temp.refuse();
        """
    )
    run_id = new_run(conn)

    with pytest.raises(psycopg.errors.RaiseException, match="outbox refused"):
        begin(conn, run_id)

    assert count(conn, "activity_effect") == 0
    assert count(conn, "outbox") == 0


def test_same_key_and_hash_returns_the_existing_effect_without_a_second_row(conn: Conn) -> None:
    run_id = new_run(conn)
    first = begin(conn, run_id)
    again = begin(conn, run_id)
    assert again == first

    # Whatever its status: a replay after the outcome gets the outcome, not a new effect.
    conn.execute(
        "UPDATE ledgerloop.activity_effect SET status = 'succeeded', external_reference = 'T-1'"
    )
    settled = begin(conn, run_id)
    assert (settled.status, settled.external_reference) == (EffectStatus.SUCCEEDED, "T-1")
    assert len(outbox_rows(conn, first.key)) == 1
    assert count(conn, "activity_effect") == 1


def test_same_key_with_another_hash_is_key_reuse_naming_both_hashes(conn: Conn) -> None:
    run_id = new_run(conn)
    first = begin(conn, run_id)
    changed = {**BODY, "title": "Printer still on fire"}
    new_hash = request_hash("write_ticket", changed, "tickets", "v1")

    with pytest.raises(KeyReuse) as caught:
        begin(conn, run_id, body=changed)

    assert first.request_hash in str(caught.value)
    assert new_hash in str(caught.value)
    assert first.request_hash != new_hash
    assert not caught.value.retryable
    assert len(outbox_rows(conn, first.key)) == 1


def test_invalid_request_is_refused_before_writing(conn: Conn) -> None:
    run_id = new_run(conn)
    with pytest.raises(InvalidDeliveryRequest, match="path must start with '/'"):
        begin(conn, run_id, request={"path": "tickets"})
    with pytest.raises(InvalidDeliveryRequest, match="unknown delivery request field"):
        begin(conn, run_id, request={"path": "/t", "retries": 3})
    assert count(conn, "activity_effect") == 0


def test_tenant_sees_only_its_own_effects(conn: Conn) -> None:
    run_a = new_run(conn, TENANT_A)
    run_b = new_run(conn, TENANT_B)
    with tenant_scope(conn, TENANT_A):
        effect_a = begin(conn, run_a, tenant=TENANT_A)
    with tenant_scope(conn, TENANT_B):
        effect_b = begin(conn, run_b, tenant=TENANT_B)

    with tenant_scope(conn, TENANT_B):
        assert effect_get(conn, effect_a.key) is None
        assert [e.key for e in effect_list(conn)] == [effect_b.key]
        assert conn.execute("SELECT count(*) AS n FROM ledgerloop.outbox").fetchone() == {"n": 1}
        with pytest.raises(EffectNotFound):
            effect_resolve(conn, effect_a.key, failed_reason="not mine", operator="mallory")
    with tenant_scope(conn, TENANT_A):
        assert effect_get(conn, effect_a.key) == effect_a
    # The owner role (relay, reconciler) sees both.
    assert {e.key for e in effect_list(conn)} == {effect_a.key, effect_b.key}


def test_tenant_cannot_write_an_effect_for_another_tenant(conn: Conn) -> None:
    run_a = new_run(conn, TENANT_A)
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"),
        tenant_scope(conn, TENANT_B),
    ):
        begin(conn, run_a, tenant=TENANT_A)
    assert count(conn, "activity_effect") == 0


def test_list_filters_by_status_and_run(conn: Conn) -> None:
    run_1, run_2 = new_run(conn), new_run(conn)
    e1 = begin(conn, run_1)
    e2 = begin(conn, run_2)
    conn.execute(
        "UPDATE ledgerloop.activity_effect SET status = 'needs_human' WHERE idempotency_key = %s",
        (e2.key,),
    )

    assert [e.key for e in effect_list(conn, run_id=run_1)] == [e1.key]
    assert [e.key for e in effect_list(conn, status="needs_human")] == [e2.key]
    assert effect_list(conn, status=EffectStatus.FAILED) == []
    assert len(effect_list(conn, limit=1)) == 1


def test_schema_statuses_match_the_code(conn: Conn) -> None:
    def quoted(definition: str) -> set[str]:
        return set(re.findall(r"'(\w+)'::text", definition))

    checks = conn.execute(
        "SELECT conrelid::regclass::text AS tbl, pg_get_constraintdef(oid) AS def "
        "FROM pg_constraint WHERE conname IN ('activity_effect_status_check', "
        "'outbox_status_check')"
    ).fetchall()
    defs = {row["tbl"]: row["def"] for row in checks}
    assert quoted(defs["ledgerloop.activity_effect"]) == {s.value for s in EffectStatus}
    assert quoted(defs["ledgerloop.outbox"]) == {s.value for s in OutboxStatus}
    trigger = conn.execute(
        "SELECT pg_get_triggerdef(oid) AS def FROM pg_trigger "
        "WHERE tgname = 'activity_effect_reported'"
    ).fetchone()
    assert trigger is not None
    assert quoted(trigger["def"]) == {s.value for s in REPORTED}


def test_a_recorded_outcome_messages_the_workflow_once(conn: Conn) -> None:
    run_id = new_run(conn)
    workflow_row(conn, run_id)
    effect = begin(conn, run_id)
    assert messages_for(conn, run_id) == []  # pending and started are not reported

    conn.execute(
        "UPDATE ledgerloop.activity_effect SET status = 'succeeded', attempts = 1, "
        "external_reference = 'T-9', result = '{\"id\": \"T-9\"}' WHERE idempotency_key = %s",
        (effect.key,),
    )
    # Sending again for the same (key, status, attempt) is a no-op.
    conn.execute(
        "SELECT ledgerloop.effect_send_message(e) FROM ledgerloop.activity_effect e "
        "WHERE idempotency_key = %s",
        (effect.key,),
    )

    [sent] = messages_for(conn, run_id)
    assert sent["topic"] == effect.key
    assert sent["message_id"] == f"{effect.key}:succeeded:1"
    assert sent["serialization"] == "portable_json"
    assert sent["message"] == {
        "key": effect.key,
        "status": "succeeded",
        "result": {"id": "T-9"},
        "error": None,
        "external_reference": "T-9",
    }


def test_a_run_without_a_workflow_still_records_its_outcome(conn: Conn) -> None:
    run_id = new_run(conn)  # no DBOS workflow row: nobody to tell, nothing must fail
    effect = begin(conn, run_id)
    conn.execute(
        "UPDATE ledgerloop.activity_effect SET status = 'failed' WHERE idempotency_key = %s",
        (effect.key,),
    )
    assert effect_get(conn, effect.key).status == EffectStatus.FAILED  # type: ignore[union-attr]
    assert messages_for(conn, run_id) == []


def test_compensation_is_a_new_linked_effect(conn: Conn) -> None:
    run_id = new_run(conn)
    original = begin(conn, run_id)
    with pytest.raises(InvalidCompensation, match="wait until it settles"):
        compensation_begin(conn, original, {"path": "/tickets/T-1", "method": "DELETE"})
    conn.execute("UPDATE ledgerloop.activity_effect SET status = 'succeeded'")
    original = effect_get(conn, original.key)  # type: ignore[assignment]

    undo = compensation_begin(conn, original, {"path": "/tickets/T-1", "method": "DELETE"})

    assert undo.key == original.key + ":compensate"
    assert (undo.compensates, undo.status, undo.tool) == (
        original.key,
        EffectStatus.PENDING,
        "compensate:write_ticket",
    )
    assert len(outbox_rows(conn, undo.key)) == 1
    # Idempotent like any effect; and a compensation is not compensated automatically.
    assert compensation_begin(conn, original, {"path": "/tickets/T-1", "method": "DELETE"}) == undo
    with pytest.raises(InvalidCompensation, match="itself a compensation"):
        compensation_begin(conn, undo, {"path": "/x"})


def test_compensation_key_is_enforced(conn: Conn) -> None:
    run_id = new_run(conn)
    original = begin(conn, run_id)
    with pytest.raises(InvalidCompensation, match=":compensate"):
        effect_begin(
            conn,
            key=f"{run_id}:other",
            run_id=run_id,
            tenant_id=TENANT_A,
            tool="undo",
            request_hash="h",
            destination="tickets",
            request={"path": "/x"},
            compensates=original.key,
        )
    # The database holds the same rule for writers that bypass the ledger.
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            "INSERT INTO ledgerloop.activity_effect (idempotency_key, run_id, tenant_id, tool, "
            "request_hash, destination, compensates) VALUES (%s, %s, %s, 'undo', 'h', 't', %s)",
            (f"{run_id}:other", run_id, TENANT_A, original.key),
        )


def test_compensating_a_failed_effect_is_refused(conn: Conn) -> None:
    run_id = new_run(conn)
    original = begin(conn, run_id)
    conn.execute("UPDATE ledgerloop.activity_effect SET status = 'failed'")
    failed = effect_get(conn, original.key)
    assert failed is not None
    with pytest.raises(InvalidCompensation, match="nothing to undo"):
        compensation_begin(conn, failed, {"path": "/x"})


@pytest.mark.parametrize("status", ["pending", "started", "succeeded", "failed"])
def test_resolve_refuses_effects_that_are_not_stuck(conn: Conn, status: str) -> None:
    run_id = new_run(conn)
    effect = begin(conn, run_id)
    conn.execute("UPDATE ledgerloop.activity_effect SET status = %s", (status,))

    with pytest.raises(EffectNotResolvable, match=f"is {status}"):
        effect_resolve(conn, effect.key, succeeded_ref="T-1", operator="ops@example.com")
    assert effect_get(conn, effect.key).status == status  # type: ignore[union-attr]


def test_resolve_needs_exactly_one_decision_and_an_operator(conn: Conn) -> None:
    run_id = new_run(conn)
    effect = begin(conn, run_id)
    conn.execute("UPDATE ledgerloop.activity_effect SET status = 'needs_human'")
    with pytest.raises(LedgerloopError, match="exactly one decision"):
        effect_resolve(conn, effect.key, succeeded_ref="T-1", retry=True, operator="ops")
    with pytest.raises(LedgerloopError, match="exactly one decision"):
        effect_resolve(conn, effect.key, operator="ops")
    with pytest.raises(LedgerloopError, match="operator"):
        effect_resolve(conn, effect.key, failed_reason="no", operator=" ")
    with pytest.raises(EffectNotFound):
        effect_resolve(conn, "nope", failed_reason="no", operator="ops")


def test_an_operator_in_a_tenant_scope_resolves_and_the_workflow_hears(conn: Conn) -> None:
    """The tenant role has no rights on schema dbos; the message goes out all the same."""
    run_id = new_run(conn, TENANT_B)
    workflow_row(conn, run_id)
    with tenant_scope(conn, TENANT_B):
        effect = begin(conn, run_id, tenant=TENANT_B)
    conn.execute(
        "UPDATE ledgerloop.activity_effect SET status = 'needs_human', attempts = 1 "
        "WHERE idempotency_key = %s",
        (effect.key,),
    )

    with tenant_scope(conn, TENANT_B):
        resolved = effect_resolve(conn, effect.key, succeeded_ref="T-7", operator="ops@b.example")
    # ...though it cannot message a workflow directly.
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege),
        tenant_scope(conn, TENANT_B),
    ):
        conn.execute("SELECT ledgerloop.effect_send_message(e) FROM ledgerloop.activity_effect e")

    assert (resolved.status, resolved.resolved_by) == (EffectStatus.SUCCEEDED, "ops@b.example")
    [*_, sent] = messages_for(conn, run_id)
    assert sent["message"]["status"] == "succeeded"
    assert sent["message"]["external_reference"] == "T-7"


def test_cancelling_a_run_closes_its_undelivered_effects_only(
    conn: Conn, dbos_client: DBOSClient
) -> None:
    from ledgerloop.control.cancel import cancel_run
    from ledgerloop.effects.ledger import effect_require
    from ledgerloop.runs.states import RunStatus
    from ledgerloop.runs.store import run_require, run_transition

    run_id = new_run(conn)
    run_transition(conn, run_require(conn, run_id), RunStatus.PLANNING, "planning")
    waiting = begin(conn, run_id, "call-1")
    in_flight = begin(conn, run_id, "call-2", body={**BODY, "title": "second"})
    conn.execute(
        "UPDATE ledgerloop.outbox SET status = 'claimed' WHERE idempotency_key = %s",
        (in_flight.key,),
    )
    cancel_run(conn, run_id, workflows=dbos_client, requested_by="test")
    closed = effect_require(conn, waiting.key)
    assert closed.status is EffectStatus.FAILED
    assert closed.error == "run cancelled before delivery"
    assert [r["status"] for r in outbox_rows(conn, waiting.key)] == ["dead"]
    # Work a relay already claimed is in flight: cancelling undoes nothing.
    assert effect_require(conn, in_flight.key).status is EffectStatus.PENDING
    assert [r["status"] for r in outbox_rows(conn, in_flight.key)] == ["claimed"]
