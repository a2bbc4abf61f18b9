"""The run store on a real Postgres: transitions, classification, tenants, property tests."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerloop.db.connect import Conn, tenant_scope
from ledgerloop.runs.states import TERMINAL, TRANSITIONS, InvalidTransition, RunStatus
from ledgerloop.runs.store import (
    Outcome,
    RunNotFound,
    StaleRun,
    run_create,
    run_ensure_status,
    run_events,
    run_get,
    run_list,
    run_require,
    run_transition,
)

S = RunStatus


def test_create_records_received_event(conn: Conn) -> None:
    run, created = run_create(conn, agent="ops", input={"message": "hi"})
    assert created
    assert run.status is S.RECEIVED
    assert run.version == 0
    events = run_events(conn, run.id)
    assert [(e.sequence, e.event_type) for e in events] == [(0, "received")]


def test_idempotency_key_returns_the_same_run(conn: Conn) -> None:
    first, created = run_create(conn, agent="ops", input={"a": 1}, idempotency_key="k1")
    again, created_again = run_create(conn, agent="ops", input={"a": 1}, idempotency_key="k1")
    assert created
    assert not created_again
    assert again.id == first.id
    assert len(run_list(conn)) == 1


def test_transition_updates_snapshot_and_history_together(conn: Conn) -> None:
    run, _ = run_create(conn, agent="ops", input={})
    moved = run_transition(conn, run, S.PLANNING, "started", {"worker": "w1"}, {"turn": 0})
    assert moved.outcome is Outcome.APPLIED
    assert moved.run.status is S.PLANNING
    assert moved.run.version == 1
    assert moved.run.state == {"turn": 0}
    events = run_events(conn, run.id)
    assert [(e.sequence, e.event_type, e.payload) for e in events][-1] == (
        1,
        "started",
        {"worker": "w1"},
    )


def test_same_event_twice_is_a_duplicate_and_writes_nothing(conn: Conn) -> None:
    run, _ = run_create(conn, agent="ops", input={})
    run_transition(conn, run, S.PLANNING, "started")
    # The caller still holds the old snapshot: the re-delivery is recognised, not re-applied.
    again = run_transition(conn, run, S.PLANNING, "started")
    assert again.outcome is Outcome.DUPLICATE
    assert again.run.version == 1
    assert len(run_events(conn, run.id)) == 2


def test_stale_snapshot_with_a_still_legal_move_is_stale(conn: Conn) -> None:
    run, _ = run_create(conn, agent="ops", input={})
    planning = run_transition(conn, run, S.PLANNING, "started").run
    run_transition(conn, planning, S.EXECUTING, "tools")
    # Another writer still believes the run is planning; executing -> planning is legal,
    # so the answer is "reload", with the current snapshot attached.
    with pytest.raises(StaleRun) as info:
        run_transition(conn, planning, S.AWAITING_APPROVAL, "approval_requested")
    assert info.value.current.status is S.EXECUTING
    assert info.value.retryable


def test_late_approval_of_cancelled_run_is_invalid(conn: Conn) -> None:
    run, _ = run_create(conn, agent="ops", input={})
    planning = run_transition(conn, run, S.PLANNING, "started").run
    waiting = run_transition(conn, planning, S.AWAITING_APPROVAL, "approval_requested").run
    run_transition(conn, waiting, S.CANCELLED, "cancel_requested")
    with pytest.raises(InvalidTransition) as info:
        run_transition(conn, waiting, S.EXECUTING, "approved")
    assert "cancelled" in str(info.value)
    assert run_require(conn, run.id).status is S.CANCELLED


def test_move_outside_the_table_is_refused_without_writing(conn: Conn) -> None:
    run, _ = run_create(conn, agent="ops", input={})
    with pytest.raises(InvalidTransition):
        run_transition(conn, run, S.SUCCEEDED, "done")
    assert run_require(conn, run.id).version == 0
    assert len(run_events(conn, run.id)) == 1


def test_status_check_constraint_matches_the_enum(conn: Conn) -> None:
    row = conn.execute(
        "SELECT pg_get_constraintdef(oid) AS d FROM pg_constraint "
        "WHERE conrelid = 'ledgerloop.agent_run'::regclass AND contype = 'c'"
    ).fetchone()
    assert row is not None
    in_db = set(__import__("re").findall(r"'(\w+)'", row["d"]))
    assert in_db == {s.value for s in RunStatus}


def test_database_refuses_an_unknown_status(conn: Conn) -> None:
    import psycopg

    run, _ = run_create(conn, agent="ops", input={})
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("UPDATE ledgerloop.agent_run SET status = 'paused' WHERE id = %s", (run.id,))


class TestTenantIsolation:
    def test_tenant_cannot_read_or_change_another_tenants_run(self, conn: Conn) -> None:
        tenant_a, tenant_b = uuid.uuid4(), uuid.uuid4()
        with tenant_scope(conn, tenant_a):
            run, _ = run_create(conn, agent="ops", input={"secret": "a"}, tenant_id=tenant_a)
        with tenant_scope(conn, tenant_b):
            assert run_get(conn, run.id) is None
            assert run_list(conn) == []
            with pytest.raises(RunNotFound):
                run_transition(conn, run, S.PLANNING, "started")
            changed = conn.execute(
                "UPDATE ledgerloop.agent_run SET agent = 'stolen' WHERE id = %s", (run.id,)
            ).rowcount
            assert changed == 0
            assert conn.execute(
                "SELECT count(*) AS n FROM ledgerloop.agent_run_event WHERE run_id = %s",
                (run.id,),
            ).fetchone() == {"n": 0}
        with tenant_scope(conn, tenant_a):
            mine = run_require(conn, run.id)
            assert mine.agent == "ops"
            assert mine.status is S.RECEIVED

    def test_tenant_cannot_insert_rows_for_another_tenant(self, conn: Conn) -> None:
        import psycopg

        tenant_a, tenant_b = uuid.uuid4(), uuid.uuid4()
        with pytest.raises(psycopg.errors.InsufficientPrivilege), tenant_scope(conn, tenant_b):
            run_create(conn, agent="ops", input={}, tenant_id=tenant_a)

    def test_scope_ends_with_the_transaction(self, conn: Conn) -> None:
        tenant_a = uuid.uuid4()
        with tenant_scope(conn, tenant_a):
            run_create(conn, agent="ops", input={}, tenant_id=tenant_a)
        row = conn.execute("SELECT current_user AS u, ledgerloop.current_tenant() AS t").fetchone()
        assert row is not None
        assert row["t"] is None
        assert row["u"] != "ledgerloop_tenant"


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.lists(st.sampled_from(list(RunStatus)), min_size=1, max_size=12))
def test_random_event_sequences_never_leave_the_table(conn: Conn, targets: list[RunStatus]) -> None:
    run, _ = run_create(conn, agent="prop", input={})
    applied = 0
    for i, target in enumerate(targets):
        before = run_require(conn, run.id)
        try:
            result = run_transition(conn, before, target, f"e{i}")
        except InvalidTransition:
            assert target not in TRANSITIONS[before.status]
            after = run_require(conn, run.id)
            assert after.status is before.status
            assert after.version == before.version
            continue
        assert result.outcome is Outcome.APPLIED
        assert target in TRANSITIONS[before.status]
        assert before.status not in TERMINAL
        applied += 1
    final = run_require(conn, run.id)
    events = run_events(conn, run.id)
    assert final.version == applied == len(events) - 1
    assert [e.sequence for e in events] == list(range(applied + 1))


def test_same_state_event_is_recorded_once_per_step(conn: Conn) -> None:
    run, _ = run_create(conn, agent="ops", input={})
    planning = run_transition(conn, run, S.PLANNING, "planning", step="memory-load").run
    rejected = run_transition(
        conn, planning, S.PLANNING, "answer_rejected", {"reason": "r"}, step="memory-save-0"
    )
    assert rejected.outcome is Outcome.APPLIED
    assert rejected.run.status is S.PLANNING
    assert rejected.run.version == planning.version + 1
    # The step runs again after a crash: its event is found, nothing is written.
    again = run_transition(
        conn, planning, S.PLANNING, "answer_rejected", {"reason": "r"}, step="memory-save-0"
    )
    assert again.outcome is Outcome.DUPLICATE
    # The next step's identical event is a new observable decision.
    next_round = run_ensure_status(
        conn, run.id, S.PLANNING, "answer_rejected", {"reason": "r"}, step="memory-save-1"
    )
    assert next_round.version == rejected.run.version + 1
    assert [e.event_type for e in run_events(conn, run.id)] == [
        "received",
        "planning",
        "answer_rejected",
        "answer_rejected",
    ]
