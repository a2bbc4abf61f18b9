"""A write's one-statement record (agent.effect_record) on a real Postgres, through a real
relay's connection: what it writes, and what it refuses to write.

The rules are those of the transaction a write delivered elsewhere is recorded in
(not_granted, run_ensure_status, effect_begin): these tests hold the statement to them, row
by row. Approvals reach it from the approval tests (test_approval_mismatch and the write
path), through a worker.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import uuid
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from ledgerloop.agent.effect_record import NotGranted, record_claimed_write
from ledgerloop.approvals.preview import render_preview
from ledgerloop.approvals.principals import principal_create
from ledgerloop.approvals.store import approval_decide, approval_request
from ledgerloop.db.connect import Conn, connect, make_pool
from ledgerloop.db.errors import DatabaseUnreachable
from ledgerloop.effects.errors import KeyReuse
from ledgerloop.effects.hashing import idempotency_key, request_hash
from ledgerloop.effects.ledger import Claim, Effect, effect_await
from ledgerloop.effects.messages import DeliveryRequest, EffectStatus, OutboxStatus
from ledgerloop.effects.outbox import Claimed, Outcome, connect_async, outbox_record
from ledgerloop.effects.outbox import Q as OUTBOX_Q
from ledgerloop.effects.relay import Relay
from ledgerloop.effects.testing import messages_for
from ledgerloop.failures import is_transient
from ledgerloop.runs.start import start_run
from ledgerloop.runs.states import InvalidTransition, RunStatus
from ledgerloop.runs.store import RunNotFound, RunStopped, run_ensure_status

BODY = {"title": "disk full", "body": "clean up", "priority": "normal"}
REQUEST = DeliveryRequest(path="/idempotent/tickets", body=BODY, honours_idempotency=True)
#: The runs' tenant (start_run's default).
TENANT = uuid.UUID(int=0)


def _hash(body: dict[str, Any] = BODY) -> str:
    return request_hash("write_ticket", body, "tickets", "v1")


def _record(
    url: str,
    run_id: uuid.UUID,
    step: str = "tool-0-c1",
    body: dict[str, Any] = BODY,
    approval_id: uuid.UUID | None = None,
    call_id: str = "c1",
    tenant_id: uuid.UUID = TENANT,
) -> tuple[Effect, Claim | None]:
    """One record through a real relay (its event loop, its connection), as an act step
    makes it."""

    async def go() -> tuple[Effect, Claim | None]:
        async with Relay(url, {"tickets": "http://127.0.0.1:9"}) as relay:
            with make_pool(url, max_size=1) as pool:
                return await record_claimed_write(
                    relay,
                    pool,
                    step=step,
                    payload={"tool_call_id": "c1"},
                    tool_call_id=call_id,
                    approval_id=approval_id,
                    key=idempotency_key(str(run_id), call_id),
                    run_id=run_id,
                    tenant_id=tenant_id,
                    tool="write_ticket",
                    request_hash=_hash(body),
                    destination="tickets",
                    request=REQUEST,
                )

    return asyncio.run(go())


def _run_in(conn: Conn, status: RunStatus | None) -> uuid.UUID:
    """A run (with its queued workflow, which approvals need) moved to `status`."""
    run_id = start_run(conn, agent="ops", input={})
    if status is not None:
        run_ensure_status(conn, run_id, RunStatus.PLANNING, "planning")
        if status is not RunStatus.PLANNING:
            run_ensure_status(conn, run_id, status, status.value)
    return run_id


def _rows(conn: Conn, run_id: uuid.UUID) -> dict[str, list[dict[str, Any]]]:
    q = {
        "events": "SELECT event_type, step, payload, xmin::text AS xid "
        "FROM ledgerloop.agent_run_event WHERE run_id = %s ORDER BY sequence",
        "effects": "SELECT status, attempts, lease_until IS NOT NULL AS leased, xmin::text AS xid "
        "FROM ledgerloop.activity_effect WHERE run_id = %s",
        "outbox": "SELECT o.status, o.attempts, o.xmin::text AS xid FROM ledgerloop.outbox o "
        "JOIN ledgerloop.activity_effect e USING (idempotency_key) WHERE e.run_id = %s",
        "run": "SELECT status, xmin::text AS xid FROM ledgerloop.agent_run WHERE id = %s",
    }
    return {name: conn.execute(sql, (run_id,)).fetchall() for name, sql in q.items()}  # type: ignore[arg-type]


def test_the_move_the_effect_and_its_claimed_outbox_row_commit_as_one(
    conn: Conn, db_url: str
) -> None:
    run_id = _run_in(conn, RunStatus.PLANNING)
    effect, claim = _record(db_url, run_id)
    assert effect.status is EffectStatus.STARTED
    assert effect.attempts == 1
    assert claim is not None
    assert claim.deadline_in_s > 0
    rows = _rows(conn, run_id)
    assert rows["run"][0]["status"] == "executing"
    moved = rows["events"][-1]
    assert (moved["event_type"], moved["step"]) == ("executing", "tool-0-c1")
    assert moved["payload"] == {"tool_call_id": "c1"}
    assert [(e["status"], e["attempts"], e["leased"]) for e in rows["effects"]] == [
        ("started", 1, True)
    ]
    assert [(o["status"], o["attempts"]) for o in rows["outbox"]] == [("claimed", 1)]
    # One transaction: the run, its event, the effect and its outbox row share one xid.
    xids = {rows["run"][0]["xid"], moved["xid"], rows["effects"][0]["xid"]}
    assert xids == {rows["outbox"][0]["xid"]}


def test_a_repeated_step_gets_the_recorded_effect_and_no_second_claim(
    conn: Conn, db_url: str
) -> None:
    run_id = _run_in(conn, RunStatus.PLANNING)
    first, _ = _record(db_url, run_id)
    again, claim = _record(db_url, run_id)
    assert claim is None  # whoever holds the first claim delivers it
    assert again.key == first.key
    assert again.created_at == first.created_at
    rows = _rows(conn, run_id)
    assert [e["event_type"] for e in rows["events"]].count("executing") == 1
    assert len(rows["effects"]) == 1
    assert len(rows["outbox"]) == 1


def test_the_same_key_for_another_action_is_refused(conn: Conn, db_url: str) -> None:
    run_id = _run_in(conn, RunStatus.PLANNING)
    _record(db_url, run_id)
    with pytest.raises(KeyReuse):
        _record(db_url, run_id, body={**BODY, "priority": "high"})
    assert len(_rows(conn, run_id)["effects"]) == 1


def test_a_cancelled_run_gets_no_effect(conn: Conn, db_url: str) -> None:
    run_id = _run_in(conn, RunStatus.CANCELLED)
    with pytest.raises(RunStopped):
        _record(db_url, run_id)
    rows = _rows(conn, run_id)
    assert rows["effects"] == []
    assert rows["outbox"] == []
    assert rows["run"][0]["status"] == "cancelled"
    assert "executing" not in [e["event_type"] for e in rows["events"]]


def test_a_move_the_table_forbids_writes_nothing(conn: Conn, db_url: str) -> None:
    run_id = _run_in(conn, None)  # received: it has not planned anything yet
    with pytest.raises(InvalidTransition):
        _record(db_url, run_id)
    rows = _rows(conn, run_id)
    assert rows["effects"] == []
    assert rows["run"][0]["status"] == "received"


def test_an_unknown_run_is_named(db_url: str) -> None:
    with pytest.raises(RunNotFound, match="no run"):
        _record(db_url, uuid.uuid4())


def _approval(conn: Conn, run_id: uuid.UUID, action_hash: str, decision: str | None) -> uuid.UUID:
    """An approval of `action_hash` for call c1, decided by an authenticated approver."""
    approval = approval_request(
        conn,
        run_id=run_id,
        tenant_id=uuid.UUID(int=0),
        tool="write_ticket",
        tool_call_id="c1",
        action_hash=action_hash,
        preview=render_preview("write_ticket", BODY),
        policy_version="v1",
    )
    if decision is not None:
        alice, _ = principal_create(conn, name="alice", roles=["approver"])
        approval_decide(conn, approval_id=approval.id, principal=alice, decision=decision)
    return approval.id


def test_an_approved_write_is_recorded(conn: Conn, db_url: str) -> None:
    run_id = _run_in(conn, RunStatus.AWAITING_APPROVAL)
    approval_id = _approval(conn, run_id, _hash(), "approve")
    effect, claim = _record(db_url, run_id, approval_id=approval_id)
    assert effect.status is EffectStatus.STARTED
    assert claim is not None
    assert _rows(conn, run_id)["run"][0]["status"] == "executing"


@pytest.mark.parametrize(
    ("decision", "other_action", "problem"),
    [
        (None, False, "is pending, not approved"),
        ("reject", False, "is rejected, not approved"),
        ("approve", True, "covers the action"),
    ],
)
def test_a_write_its_approval_does_not_allow_writes_nothing(
    conn: Conn, db_url: str, decision: str | None, other_action: bool, problem: str
) -> None:
    run_id = _run_in(conn, RunStatus.AWAITING_APPROVAL)
    approved = _hash({**BODY, "priority": "high"}) if other_action else _hash()
    approval_id = _approval(conn, run_id, approved, decision)
    with pytest.raises(NotGranted, match=problem):
        _record(db_url, run_id, approval_id=approval_id)
    rows = _rows(conn, run_id)
    # Not even the run's move: the approval is read before anything is written.
    assert rows["effects"] == []
    assert rows["outbox"] == []
    assert rows["run"][0]["status"] == "awaiting_approval"


@pytest.mark.parametrize("other", ["call", "run", "tenant"])
def test_an_approval_allows_only_the_call_it_was_asked_for(
    conn: Conn, db_url: str, other: str
) -> None:
    """The hash says what the action is, not who takes it: the same action for another call,
    another run or another tenant is refused (migration 0025), with what did not match."""
    granted_run = _run_in(conn, RunStatus.AWAITING_APPROVAL)
    approval_id = _approval(conn, granted_run, _hash(), "approve")
    run_id, call_id, tenant = granted_run, "c1", uuid.UUID(int=0)
    if other == "call":
        call_id = "c2"
    elif other == "run":
        run_id = _run_in(conn, RunStatus.AWAITING_APPROVAL)
    else:
        tenant = uuid.UUID(int=7)
    expected = {
        "call": f"was granted for run {granted_run} call c1, not run {run_id} call c2",
        "run": f"was granted for run {granted_run} call c1, not run {run_id} call c1",
        "tenant": f"was granted for tenant {uuid.UUID(int=0)}, not tenant {tenant}",
    }[other]
    with pytest.raises(NotGranted) as refused:
        _record(db_url, run_id, approval_id=approval_id, call_id=call_id, tenant_id=tenant)
    assert refused.value.problem == f"approval {approval_id} {expected}"
    for run in {granted_run, run_id}:
        rows = _rows(conn, run)
        assert rows["effects"] == []
        assert rows["outbox"] == []
        assert rows["run"][0]["status"] == "awaiting_approval"
    # Its own call still may run: the refusals spent nothing.
    effect, _ = _record(db_url, granted_run, approval_id=approval_id)
    assert effect.status is EffectStatus.STARTED


def test_a_record_after_its_relay_stopped_is_transient_and_opens_nothing(db_url: str) -> None:
    """A step that saw this worker's relay running a moment before it stopped: its record
    fails as transient (the step runs again and records for a relay elsewhere), and no pool
    is opened that nothing would close."""

    async def go() -> None:
        relay = Relay(db_url, {"tickets": "http://127.0.0.1:9"})
        async with relay:
            pass
        with pytest.raises(DatabaseUnreachable) as raised:
            async with relay.records():
                pass
        assert is_transient(raised.value)
        assert relay._steps_pool is None

    asyncio.run(go())


# -- awaited: an outcome's message only for a workflow that waits (migration 0021) ----------


def _record_outcome(url: str, effect: Effect, claim: Claim, status: EffectStatus) -> set[str]:
    """The relay's record of the delivery's outcome (effects.outbox.outbox_record)."""

    async def go() -> set[str]:
        async with await connect_async(url) as aconn:
            claimed = Claimed.at_insert(effect, claim, REQUEST.to_json())
            outcome = Outcome(claimed, status, OutboxStatus.DONE, result={"id": 7})
            return await outbox_record(aconn, [outcome])

    return asyncio.run(go())


def _heard(conn: Conn, effect: Effect) -> list[str]:
    return [m["message"]["status"] for m in messages_for(conn, effect.run_id, effect.key)]


def _xmin(conn: Conn, effect: Effect) -> str:
    row = conn.execute(
        "SELECT xmin::text AS x FROM ledgerloop.activity_effect WHERE idempotency_key = %s",
        (effect.key,),
    ).fetchone()
    assert row is not None
    return str(row["x"])


def test_an_outcome_its_own_step_reads_back_is_told_only_once_a_workflow_waits(
    conn: Conn, db_url: str
) -> None:
    run_id = _run_in(conn, RunStatus.PLANNING)
    effect, claim = _record(db_url, run_id)
    assert claim is not None
    assert _record_outcome(db_url, effect, claim, EffectStatus.SUCCEEDED) == {effect.key}
    assert _heard(conn, effect) == []  # the step that sent it took the outcome from its send
    marked = effect_await(conn, effect.key)
    assert marked.status is EffectStatus.SUCCEEDED
    assert _heard(conn, effect) == ["succeeded"]  # the status recorded before the wait began
    # Marked already: read only, no new row version and no second message.
    before = _xmin(conn, effect)
    assert effect_await(conn, effect.key).status is EffectStatus.SUCCEEDED
    assert _xmin(conn, effect) == before
    assert _heard(conn, effect) == ["succeeded"]


def test_an_effect_marked_before_its_outcome_is_told_it(conn: Conn, db_url: str) -> None:
    run_id = _run_in(conn, RunStatus.PLANNING)
    effect, claim = _record(db_url, run_id)
    assert claim is not None
    assert effect_await(conn, effect.key).status is EffectStatus.STARTED
    assert _heard(conn, effect) == []  # started is not reported
    _record_outcome(db_url, effect, claim, EffectStatus.OUTCOME_UNKNOWN)
    assert _heard(conn, effect) == ["outcome_unknown"]


@pytest.mark.parametrize("first", ["outcome", "mark"])
def test_a_mark_and_an_outcome_at_once_tell_the_workflow_exactly_once(
    conn: Conn, db_url: str, first: str
) -> None:
    """Both lock the row: whichever commits second sees the other's row, so the message is
    sent once, by the outcome's trigger or by the mark's."""
    run_id = _run_in(conn, RunStatus.PLANNING)
    effect, claim = _record(db_url, run_id)
    assert claim is not None
    outcome_sql = (
        "UPDATE ledgerloop.activity_effect SET status = 'succeeded', updated_at = now() "
        "WHERE idempotency_key = %s AND status = 'started'"
    )
    with connect(db_url) as holder:
        # The first one's transaction holds the row while the second one runs.
        if first == "outcome":
            holder.execute(outcome_sql, (effect.key,))
        else:
            effect_await(holder, effect.key)

        def second() -> EffectStatus | None:
            with connect(db_url, autocommit=True) as other:
                if first == "outcome":
                    return effect_await(other, effect.key).status
                other.execute(outcome_sql, (effect.key,))
                return None

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(second)
            with pytest.raises(concurrent.futures.TimeoutError):
                waiting.result(timeout=0.3)  # blocked on the row
            holder.commit()
            answer = waiting.result(timeout=10)
    if first == "outcome":
        assert answer is EffectStatus.SUCCEEDED  # the mark read the committed outcome
    assert _heard(conn, effect) == ["succeeded"]


# -- an outcome among many effects in flight: found by its key (migration 0022) ------------


def _scans(plan: dict[str, Any]) -> list[tuple[str, str | None]]:
    """Every (node type, index) that reads activity_effect in an EXPLAIN (FORMAT JSON) plan."""
    found = []
    if plan.get("Relation Name") == "activity_effect" and plan["Node Type"] != "ModifyTable":
        found.append((plan["Node Type"], plan.get("Index Name")))
    for child in plan.get("Plans", ()):
        found += _scans(child)
    return found


@pytest.mark.parametrize("statistics", ["fresh", "stale"])
def test_an_outcome_among_thousands_in_flight_reads_its_effect_by_key(
    conn: Conn, db_url: str, statistics: str
) -> None:
    run_id = _run_in(conn, RunStatus.PLANNING)
    effect, claim = _record(db_url, run_id)
    assert claim is not None
    if statistics == "stale":  # the planner believes almost nothing is in flight
        conn.execute("ANALYZE ledgerloop.activity_effect")
    conn.execute(
        "INSERT INTO ledgerloop.activity_effect (idempotency_key, run_id, tenant_id, tool, "
        "request_hash, destination, status, attempts, lease_until) "
        "SELECT 'other-' || g, %s, %s, 'write_ticket', 'h', 'tickets', 'started', 1, "
        "now() + interval '1 hour' FROM generate_series(1, 3000) AS g",
        (run_id, uuid.UUID(int=0)),
    )
    if statistics == "fresh":
        conn.execute("ANALYZE ledgerloop.activity_effect")
    claimed = Claimed.at_insert(effect, claim, REQUEST.to_json())
    outcome = Outcome(claimed, EffectStatus.SUCCEEDED, OutboxStatus.DONE, result={"id": 7})
    with conn.transaction(force_rollback=True):
        row = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)\n" + OUTBOX_Q["outbox_record"],
            {"outcomes": Jsonb([outcome.as_json()])},
        ).fetchone()
        assert row is not None
        plan = next(iter(row.values()))[0]["Plan"]
        settled = conn.execute(
            "SELECT status FROM ledgerloop.activity_effect WHERE idempotency_key = %s",
            (effect.key,),
        ).fetchone()
    assert settled == {"status": "succeeded"}  # the statement did record it
    # One lookup by primary key, not a pass over the 3,001 unsettled effects.
    assert _scans(plan) == [("Index Scan", "activity_effect_pkey")]
    assert plan["Shared Hit Blocks"] + plan.get("Shared Read Blocks", 0) < 200
