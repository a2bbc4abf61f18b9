"""The DBOS behaviours Ledgerloop relies on beyond DBOS's public API: one test per entry of
ledgerloop.dbos_internals.INTERNALS, each failing with a message that names the behaviour.

These are what a DBOS upgrade is checked by (docs/operations.md). They drive DBOS with the
test's own small workflows on a real worker, and use Ledgerloop's own SQL (the hibernation park
and requeue, the stop-time requeue) where that is what relies on the behaviour.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from dbos import DBOS, DBOSClient, DBOSPortableJSONSerializer

from ledgerloop.agent.loop import QUEUE_NAME
from ledgerloop.db.connect import Conn
from ledgerloop.db.dbos_checkpoint import dbos_own_checkpoint
from ledgerloop.db.sql import load_queries
from ledgerloop.dbos_internals import internal
from ledgerloop.testing.postgres import DatabaseFactory, wait_until

HIBERNATION = load_queries("ledgerloop.agent", "hibernation.sql")
FLEET = load_queries("ledgerloop.fleet")
WAITER = "ll_contract_waiter"
#: The contract workflows' executions waiting in recv, by workflow id.
_WAITING: dict[str, asyncio.Task[Any]] = {}


def broken(name: str, observed: str) -> str:
    entry = internal(name)
    return (
        f"DBOS no longer behaves as Ledgerloop relies on ({entry.name}): {entry.relies_on}. "
        f"Observed: {observed}. Used by {', '.join(entry.used_in)}; see "
        "ledgerloop/dbos_internals.py for why it stays and docs/operations.md for the upgrade."
    )


async def _mark() -> str:
    return "marked"


@DBOS.workflow(name=WAITER, max_recovery_attempts=1)
async def contract_waiter(topic: str) -> Any:
    """One step, then a wait for a message on `topic`; returns the message."""
    await DBOS.run_step_async({"name": "mark"}, _mark)
    task = asyncio.current_task()
    assert task is not None
    assert DBOS.workflow_id is not None
    _WAITING[DBOS.workflow_id] = task
    try:
        return await DBOS.recv_async(topic, 60)
    finally:
        _WAITING.pop(DBOS.workflow_id, None)


@DBOS.workflow(name="ll_contract_recv_id")
async def contract_recv_id() -> dict[str, int | None]:
    """A step, a recv; returns their operation ids as Ledgerloop's tracing reads them."""
    from ledgerloop.agent.dbos_waiters import last_recv_id, last_step_id

    await DBOS.run_step_async({"name": "mark"}, _mark)
    step_id = last_step_id()
    await DBOS.recv_async("t", 0.1)
    return {"step": step_id, "recv": last_recv_id()}


def _start(conn: Conn, topic: str = "t") -> str:
    workflow_id = str(uuid.uuid4())
    conn.execute(
        "SELECT dbos.enqueue_workflow(%(name)s, %(queue)s, ARRAY[to_json(%(topic)s::text)], "
        "workflow_id => %(id)s)",
        {"name": WAITER, "queue": QUEUE_NAME, "topic": topic, "id": workflow_id},
    )
    _waiting(workflow_id)
    return workflow_id


def _waiting(workflow_id: str, timeout: float = 20) -> asyncio.Task[Any]:
    """The workflow's current execution, once it waits in recv."""
    task: asyncio.Task[Any] = wait_until(lambda: _WAITING.get(workflow_id), timeout=timeout)  # type: ignore[assignment]
    return task


def _evict(workflow_id: str) -> None:
    """What hibernation does first: cancel the waiting execution's task."""
    task = _waiting(workflow_id)
    task.get_loop().call_soon_threadsafe(task.cancel)
    wait_until(lambda: task.done() and workflow_id not in _WAITING, timeout=10)


def _row(conn: Conn, workflow_id: str) -> dict[str, Any]:
    row = conn.execute(
        "SELECT status, owner_xid, recovery_attempts, delay_until_epoch_ms, queue_name, "
        "executor_id FROM dbos.workflow_status WHERE workflow_uuid = %s",
        (workflow_id,),
    ).fetchone()
    assert row is not None, f"no workflow {workflow_id}"
    return dict(row)


def _hibernation(conn: Conn, query: str, workflow_id: str, executor_id: str, **extra: Any) -> int:
    """Run one of the hibernation's statements (`workflow_park`, `workflow_requeue`) as the
    park does: under the row lock."""
    params = {
        "queue": QUEUE_NAME,
        "workflow_id": workflow_id,
        "topic": "t",
        "executor_id": executor_id,
        "until_ms": int((time.time() + 3600) * 1000),
        **extra,
    }
    with conn.transaction():
        conn.execute(HIBERNATION["workflow_lock"], params)
        return conn.execute(HIBERNATION[query], params).rowcount


def _send(conn: Conn, workflow_id: str, message: str, topic: str = "t") -> None:
    conn.execute(
        "SELECT dbos.send_message(%s, to_json(%s::text), %s)", (workflow_id, message, topic)
    )


def _result(workflow_id: str, name: str, timeout: float = 20) -> Any:
    def done() -> Any:
        status = DBOS.get_workflow_status(workflow_id)
        return status if status and status.status not in ("PENDING", "ENQUEUED") else None

    status = wait_until(done, timeout=timeout)
    assert status.status == "SUCCESS", broken(name, f"the workflow ended {status.status}")
    return status.output


pytestmark = pytest.mark.usefixtures("contract_worker")


def test_notification_waiters(cconn: Conn) -> None:
    from ledgerloop.agent.dbos_waiters import arriving, watch

    name = "notification-waiters"
    workflow_id = _start(cconn)
    try:
        assert not arriving(workflow_id, "watched"), broken(
            name, "the waiter map could not be read (arriving() fell back to yes)"
        )

        async def watched() -> bool:
            with watch(workflow_id, "watched") as seen:
                await asyncio.to_thread(_send, cconn, workflow_id, "hello", "watched")
                signalled = await seen.wait(10)
                return signalled and arriving(workflow_id, "watched")

        assert asyncio.run(watched()), broken(
            name, "a message sent to the watched topic never set the registered event"
        )
    finally:
        _send(cconn, workflow_id, "done")
    assert _result(workflow_id, name) == "done"


def test_shared_listener(cconn: Conn) -> None:
    import inspect

    from dbos._dbos import _get_dbos_instance
    from dbos._sys_db import SystemDatabase
    from dbos._sys_db_postgres import PostgresSystemDatabase

    from ledgerloop.fleet import dbos_internals

    name = "shared-listener"
    starts = inspect.getsource(SystemDatabase.run_notification_listener)
    assert "_listener_running = True" in starts, broken(
        name, "run_notification_listener no longer marks the listener running"
    )
    assert "self._notification_listener()" in starts, broken(
        name, "run_notification_listener no longer calls _notification_listener"
    )
    own = inspect.getsource(dbos_internals._own_listener)
    for channel in ("_dbos_notifications_channel", "_dbos_workflow_events_channel"):
        assert f"LISTEN {{{channel}}}" in own, broken(name, f"DBOS no longer LISTENs on {channel}")
    assert "LISTEN {_dbos_streams_channel}" in own, broken(name, "no LISTEN on streams")
    for mapped in ("notifications_map", "workflow_events_map", "streams_map"):
        assert mapped in own, broken(name, f"DBOS's listener no longer sets {mapped}")
    sys_db = _get_dbos_instance()._sys_db
    assert isinstance(sys_db, PostgresSystemDatabase)
    assert dbos_internals.dbos_listener_shared()
    assert sys_db._listener_running, broken(name, "DBOS did not mark its listener running")
    # With DBOS's own listener off, only the forwarded notification can wake a waiting recv
    # this soon: DBOS's fallback re-check comes every 60 s.
    workflow_id = _start(cconn)
    sent = time.monotonic()
    _send(cconn, workflow_id, "forwarded")
    assert _result(workflow_id, name, timeout=20) == "forwarded"
    assert time.monotonic() - sent < 10, broken(
        name, "a sent message reached its waiting workflow only by DBOS's fallback poll"
    )


def test_operation_counter(cconn: Conn) -> None:
    name = "operation-counter"
    workflow_id = str(uuid.uuid4())
    cconn.execute(
        "SELECT dbos.enqueue_workflow('ll_contract_recv_id', %(queue)s, ARRAY[]::json[], "
        "workflow_id => %(id)s)",
        {"queue": QUEUE_NAME, "id": workflow_id},
    )
    ids = _result(workflow_id, name)
    recv_id, step_id = ids["recv"], ids["step"]
    steps = {s["function_id"]: s["function_name"] for s in DBOS.list_workflow_steps(workflow_id)}
    assert recv_id is not None, broken(name, "no workflow context in workflow code")
    assert step_id is not None, broken(name, "no workflow context after a step")
    assert steps.get(step_id) == "mark", broken(
        name, f"read {step_id} right after the step 'mark'; the journal is {steps}"
    )
    assert steps.get(recv_id) == "DBOS.recv", broken(
        name, f"read {recv_id} after the recv; the journal is {steps}"
    )
    assert steps.get(recv_id + 1) == "DBOS.sleep", broken(
        name, f"the recv's timeout is not the next operation: {steps}"
    )


def test_journal_read(cconn: Conn) -> None:
    name = "journal-read"
    tracing = load_queries("ledgerloop.agent", "tracing.sql")
    workflow_id = str(uuid.uuid4())
    cconn.execute(
        "SELECT dbos.enqueue_workflow('ll_contract_recv_id', %(queue)s, ARRAY[]::json[], "
        "workflow_id => %(id)s)",
        {"queue": QUEUE_NAME, "id": workflow_id},
    )
    recv_id = _result(workflow_id, name)["recv"]
    steps = DBOS.list_workflow_steps(workflow_id, load_output=False)
    read = cconn.execute(tracing["journal_end"], {"workflow_id": workflow_id}).fetchone()
    assert read is not None
    assert read["journal_end"] == recv_id, broken(
        name, f"the journal read ends at {read['journal_end']}; DBOS lists {steps}"
    )
    assert read["last_checkpoint_ms"] == max(s["completed_at_epoch_ms"] or 0 for s in steps), (
        broken(name, f"last checkpoint {read['last_checkpoint_ms']}; DBOS lists {steps}")
    )


async def _refuse() -> str:
    raise ValueError("refused")


@DBOS.workflow(name="ll_contract_journal_child")
async def contract_journal_child() -> str:
    return "child"


@DBOS.workflow(name="ll_contract_journal")
async def contract_journal() -> str:
    """One operation of each kind the journal check answers for: a step's output, a step's
    error, a child workflow, a recv and its timeout."""
    await DBOS.run_step_async({"name": "mark"}, _mark)
    with contextlib.suppress(ValueError):
        await DBOS.run_step_async({"name": "refuse"}, _refuse)
    child = await DBOS.start_workflow_async(contract_journal_child)
    await child.get_result()
    await DBOS.recv_async("t", 0.1)
    return "journaled"


def _both_checks(*args: Any) -> list[Any]:
    """What DBOS's own check and Ledgerloop's (installed on the worker's instance) answer."""
    from dbos._dbos import _get_dbos_instance
    from dbos._error import DBOSWorkflowCancelledError

    sys_db = _get_dbos_instance()._sys_db
    answers = []
    for check in (
        type(sys_db).check_operation_execution.__get__(sys_db),
        vars(sys_db)["check_operation_execution"],
    ):
        try:
            answers.append(check(*args))
        # DBOS's cancellation error is not an Exception (it must get past `except Exception`).
        except (Exception, DBOSWorkflowCancelledError) as exc:  # compared by type and message
            answers.append((type(exc).__name__, str(exc)))
    return answers


def test_journal_check(cconn: Conn) -> None:
    from dbos._dbos import _get_dbos_instance

    name = "journal-check"
    sys_db = _get_dbos_instance()._sys_db
    assert "check_operation_execution" in vars(sys_db), broken(
        name, "the worker did not install the one-statement check (db/dbos_journal.applies)"
    )
    installed = vars(sys_db)["check_operation_execution"]
    asked: list[tuple[str, int]] = []

    def counted(workflow_id: str, function_id: int, *args: Any, **kwargs: Any) -> Any:
        asked.append((workflow_id, function_id))
        return installed(workflow_id, function_id, *args, **kwargs)

    workflow_id = str(uuid.uuid4())
    sys_db.check_operation_execution = counted
    try:
        cconn.execute(
            "SELECT dbos.enqueue_workflow('ll_contract_journal', %(queue)s, ARRAY[]::json[], "
            "workflow_id => %(id)s)",
            {"queue": QUEUE_NAME, "id": workflow_id},
        )
        assert _result(workflow_id, name) == "journaled"
    finally:
        sys_db.check_operation_execution = installed
    steps = DBOS.list_workflow_steps(workflow_id, load_output=False)
    names = {s["function_id"]: s["function_name"] for s in steps}
    assert {"mark", "refuse", "DBOS.sleep"} <= set(names.values()), names
    # Each step, the child's start and the recv asked before running (the recv's timeout is
    # recorded by the recv itself).
    ours = sorted(f for w, f in asked if w == workflow_id)
    assert len(ours) >= len(names) - 1, broken(
        name, f"DBOS asked the check for operations {ours} of a journal of {sorted(names)}"
    )
    kinds = set()
    for function_id in range(max(names) + 3):
        recorded = names.get(function_id, "never-recorded")
        dbos_answer, ours = _both_checks(workflow_id, function_id, recorded)
        assert ours == dbos_answer, broken(
            name, f"at operation {function_id} ({recorded}) DBOS says {dbos_answer}, ours {ours}"
        )
        if dbos_answer is None:
            kinds.add("none")
        else:
            kinds.update(k for k in ("output", "error", "child_workflow_id") if dbos_answer[k])
    assert kinds == {"none", "output", "error", "child_workflow_id"}, kinds
    # Another step's name where one is recorded, a workflow that does not exist, and one that
    # is cancelled: the same exceptions, the same messages.
    first = min(names)
    wrong_name = _both_checks(workflow_id, first, "another")
    no_workflow = _both_checks(str(uuid.uuid4()), first, "mark")
    waiting = _start(cconn)
    DBOS.cancel_workflow(waiting)
    cancelled = _both_checks(waiting, first, "mark")
    for case, (dbos_answer, ours), raised in (
        ("another step's name", wrong_name, "DBOSUnexpectedStepError"),
        ("no such workflow", no_workflow, "AssertionError"),
        ("a cancelled workflow", cancelled, "DBOSWorkflowCancelledError"),
    ):
        assert isinstance(dbos_answer, tuple), (case, dbos_answer)
        assert dbos_answer[0] == raised, (case, dbos_answer)
        assert ours == dbos_answer, broken(name, f"{case}: DBOS {dbos_answer}, ours {ours}")


class _Marker:
    """A checkpoint rider (db.dbos_checkpoint.Rider) that inserts one row, through a function
    (`contract_rider_mark`, made by test_step_checkpoint): a rider is a SELECT."""

    query = "SELECT marked FROM contract_rider_mark(%(marker_value)s)"

    def __init__(self, value: str) -> None:
        self.params = {"marker_value": value}
        self.rows: list[dict[str, Any]] = []

    def committed(self, row: dict[str, Any]) -> None:
        self.rows.append(row)


class _Broken(_Marker):
    """A rider whose statement fails."""

    query = "SELECT contract_rider_mark(%(marker_value)s) AS marked, 1 / 0 AS broken"


#: The rider each contract_rider workflow's step hands over, by workflow id.
_MARKERS: dict[str, _Marker] = {}


async def _ridden(kind: str) -> str:
    from ledgerloop.db import dbos_checkpoint

    workflow_id, step_id = DBOS.workflow_id, DBOS.step_id
    assert workflow_id is not None
    assert step_id is not None
    if kind != "none":
        dbos_checkpoint.ride(workflow_id, step_id, _MARKERS[workflow_id])
    if kind == "fails":
        raise ValueError("the step failed")
    return "ridden"


@DBOS.workflow(name="ll_contract_rider")
async def contract_rider(kind: str) -> str:
    """One step, which hands a rider to its checkpoint ("rides"), fails after handing it
    over ("fails") or hands none ("none")."""
    await DBOS.run_step_async({"name": "mark"}, _mark)
    try:
        return await DBOS.run_step_async({"name": "ridden"}, _ridden, kind)
    except ValueError:
        return "failed"


async def _after() -> str:
    return "after"


@DBOS.workflow(name="ll_contract_ahead")
async def contract_ahead(kind: str) -> list[str]:
    """A step that hands a rider to its checkpoint ("rides") or none ("none"), then another:
    the second's journal check is answered by the first's checkpoint when it carried one."""
    first = await DBOS.run_step_async({"name": "ridden"}, _ridden, kind)
    return [first, await DBOS.run_step_async({"name": "after"}, _after)]


def _rider_run(cconn: Conn, kind: str) -> tuple[str, _Marker]:
    workflow_id = str(uuid.uuid4())
    marker = _MARKERS[workflow_id] = _Marker(workflow_id)
    cconn.execute(
        "SELECT dbos.enqueue_workflow('ll_contract_rider', %(queue)s, "
        "ARRAY[to_json(%(kind)s::text)], workflow_id => %(id)s)",
        {"queue": QUEUE_NAME, "kind": kind, "id": workflow_id},
    )
    _result(workflow_id, "step-checkpoint")
    return workflow_id, marker


def _ridden_row(cconn: Conn, workflow_id: str) -> dict[str, Any]:
    row = cconn.execute(
        "SELECT xmin::text AS xid, * FROM dbos.operation_outputs "
        "WHERE workflow_uuid = %s AND function_name = 'ridden'",
        (workflow_id,),
    ).fetchone()
    assert row is not None, f"no checkpoint of the step of {workflow_id}"
    return dict(row)


def _marked(cconn: Conn, workflow_id: str) -> list[str]:
    rows = cconn.execute(
        "SELECT xmin::text AS xid FROM contract_rider WHERE value = %s", (workflow_id,)
    ).fetchall()
    return [r["xid"] for r in rows]


def test_step_checkpoint(cconn: Conn) -> None:
    from dbos._dbos import _get_dbos_instance
    from dbos._error import DBOSStepNondeterminismError, DBOSWorkflowConflictIDError

    from ledgerloop.db import dbos_checkpoint

    name = "step-checkpoint"
    sys_db = _get_dbos_instance()._sys_db
    assert dbos_checkpoint.installed(), broken(
        name, "the worker did not install the checkpoint (db/dbos_checkpoint.applies)"
    )
    cconn.execute("CREATE TABLE IF NOT EXISTS contract_rider (value text)")
    cconn.execute(
        "CREATE OR REPLACE FUNCTION contract_rider_mark(p_value text) RETURNS TABLE (marked text)"
        " LANGUAGE sql AS $$ INSERT INTO contract_rider (value) VALUES (p_value)"
        " RETURNING value $$"
    )

    # A rider commits in the step's checkpoint transaction, once, after DBOS's own row.
    ridden, marker = _rider_run(cconn, "rides")
    row = _ridden_row(cconn, ridden)
    assert _marked(cconn, ridden) == [row["xid"]], broken(
        name, f"the rider's row and the checkpoint were not one transaction: {row}"
    )
    answers = [(r["written"], r["completed_at_epoch_ms"], r["marked"]) for r in marker.rows]
    assert answers == [(True, row["completed_at_epoch_ms"], ridden)], broken(
        name, f"the rider's answer was not the checkpoint's with its row: {marker.rows}"
    )
    # The same row as DBOS's own checkpoint of the same step writes, but for the times.
    alone, _ = _rider_run(cconn, "none")
    times = {"xid", "workflow_uuid", "started_at_epoch_ms", "completed_at_epoch_ms"}
    ours = {k: v for k, v in row.items() if k not in times and k != "retention_timestamp"}
    theirs = {
        k: v
        for k, v in _ridden_row(cconn, alone).items()
        if k not in times and k != "retention_timestamp"
    }
    assert ours == theirs, broken(name, f"with a rider {ours}, DBOS alone {theirs}")
    assert row["completed_at_epoch_ms"] is not None

    # A step that fails after handing a rider over: its error is recorded alone.
    failed, marker = _rider_run(cconn, "fails")
    assert _ridden_row(cconn, failed)["error"] is not None
    assert _marked(cconn, failed) == [], broken(name, "a failed step's rider was committed")
    assert marker.rows == []

    # An execution that no longer owns its workflow commits neither the row nor the rider.
    lost = _Marker(failed)
    dbos_checkpoint.ride(failed, 99, lost)
    result = {
        "workflow_uuid": failed,
        "function_id": 99,
        "function_name": "ridden",
        "output": '"late"',
        "error": None,
        "serialization": None,
        "started_at_epoch_ms": int(time.time() * 1000),
        "child_workflow_id": None,
    }
    with pytest.raises(DBOSWorkflowConflictIDError):
        sys_db.record_operation_result(result, owner_xid=str(uuid.uuid4()))
    assert lost.rows == [], broken(name, f"a lost execution's rider committed: {lost.rows}")
    assert _marked(cconn, failed) == [], broken(name, "a lost execution's rider was committed")
    late = cconn.execute(
        "SELECT 1 FROM dbos.operation_outputs WHERE workflow_uuid = %s AND function_id = 99",
        (failed,),
    ).fetchall()
    assert late == [], broken(name, "a lost execution's checkpoint was written")

    # A step recorded already with another time (nondeterminism): DBOS's error, no rider.
    # The same time (a retry after a commit whose answer was lost) runs the rider again.
    at = int(time.time() * 1000)

    def checkpoint_98(completed_at: int) -> _Marker:
        marker = _Marker(failed)
        dbos_checkpoint.ride(failed, 98, marker)
        sys_db.record_operation_result(
            {**result, "function_id": 98}, completed_at_epoch_ms=completed_at
        )
        return marker

    assert [r["marked"] for r in checkpoint_98(at).rows] == [failed]
    with pytest.raises(DBOSStepNondeterminismError):
        checkpoint_98(at + 1)
    assert len(_marked(cconn, failed)) == 1, broken(name, "a nondeterministic step's rider ran")
    assert [r["marked"] for r in checkpoint_98(at).rows] == [failed]

    # A rider whose statement fails: the checkpoint is written alone, the rider not at all.
    broke = _Broken(failed)
    dbos_checkpoint.ride(failed, 97, broke)
    sys_db.record_operation_result({**result, "function_id": 97})
    assert broke.rows == []
    assert len(_marked(cconn, failed)) == 2, broken(name, "a failed rider's row was committed")
    alone_row = cconn.execute(
        "SELECT output FROM dbos.operation_outputs WHERE workflow_uuid = %s AND function_id = 97",
        (failed,),
    ).fetchone()
    assert alone_row == {"output": '"late"'}, broken(name, "a failed rider lost the checkpoint")

    # A rider's parameters may not shadow the checkpoint's.
    clash = _Marker(failed)
    clash.params = {"workflow_uuid": "x"}
    with pytest.raises(ValueError, match="workflow_uuid"):
        dbos_checkpoint.ride(failed, 96, clash)


def test_journal_check_answered_ahead(cconn: Conn) -> None:
    """A checkpoint that carries a rider answers the next step's journal check (nothing
    recorded, not cancelled) and that step starts without DBOS's check; otherwise DBOS checks
    (db.dbos_checkpoint, db.dbos_journal.answer_ahead, agent.dbos_step_start)."""
    from dbos._dbos import _get_dbos_instance

    from ledgerloop.agent import dbos_step_start
    from ledgerloop.db import dbos_checkpoint, dbos_journal

    assert dbos_step_start.installed(), broken("step-start", "the worker did not install it")
    cconn.execute("CREATE TABLE IF NOT EXISTS contract_rider (value text)")
    cconn.execute(
        "CREATE OR REPLACE FUNCTION contract_rider_mark(p_value text) RETURNS TABLE (marked text)"
        " LANGUAGE sql AS $$ INSERT INTO contract_rider (value) VALUES (p_value)"
        " RETURNING value $$"
    )
    sys_db = _get_dbos_instance()._sys_db
    ours = vars(sys_db)["check_operation_execution"]
    checked: list[tuple[str, int, str]] = []

    def counting(workflow_id: str, function_id: int, function_name: str, **kw: Any) -> Any:
        checked.append((workflow_id, function_id, function_name))
        return ours(workflow_id, function_id, function_name, **kw)

    def run(kind: str) -> tuple[str, list[str]]:
        workflow_id = str(uuid.uuid4())
        _MARKERS[workflow_id] = _Marker(workflow_id)
        cconn.execute(
            "SELECT dbos.enqueue_workflow('ll_contract_ahead', %(queue)s, "
            "ARRAY[to_json(%(kind)s::text)], workflow_id => %(id)s)",
            {"queue": QUEUE_NAME, "kind": kind, "id": workflow_id},
        )
        assert _result(workflow_id, "step-start") == ["ridden", "after"]
        return workflow_id, [name for wf, _, name in checked if wf == workflow_id]

    setattr(sys_db, "check_operation_execution", counting)  # noqa: B010
    try:
        rides, rides_checked = run("rides")
        alone, alone_checked = run("none")
    finally:
        setattr(sys_db, "check_operation_execution", ours)  # noqa: B010
    assert alone_checked == ["ridden", "after"], broken("journal-check", f"{alone_checked}")
    assert rides_checked == ["ridden"], f"the step after a rider was checked: {rides_checked}"
    for workflow_id in (rides, alone):
        names = [r["function_name"] for r in _journal_rows(cconn, workflow_id)]
        assert names == ["ridden", "after"], broken("step-checkpoint", f"{names}")

    # The statement's own answer: given for the next operation only when nothing is
    # recorded there and the workflow is not cancelled; taken once, by the same owner.
    result = {
        "workflow_uuid": rides,
        "function_name": "late",
        "output": '"late"',
        "error": None,
        "serialization": None,
        "started_at_epoch_ms": int(time.time() * 1000),
        "child_workflow_id": None,
    }

    def checkpoint(function_id: int) -> None:
        dbos_checkpoint.ride(rides, function_id, _Marker(rides))
        sys_db.record_operation_result({**result, "function_id": function_id})

    checkpoint(50)
    assert dbos_journal.take_ahead(rides, 51, None), "a checkpoint with a rider answered nothing"
    assert not dbos_journal.take_ahead(rides, 51, None), "an answer was taken twice"
    checkpoint(52)
    assert not dbos_journal.take_ahead(rides, 53, "another execution")
    sys_db.record_operation_result({**result, "function_id": 61})  # no rider: no answer
    assert not dbos_journal.take_ahead(rides, 62, None), "a checkpoint without a rider answered"
    checkpoint(60)  # 61 is recorded: its check must find it and replay it
    assert not dbos_journal.take_ahead(rides, 61, None), "answered for a recorded operation"
    cconn.execute(
        "UPDATE dbos.workflow_status SET status = 'CANCELLED' WHERE workflow_uuid = %s", (rides,)
    )
    checkpoint(80)
    assert not dbos_journal.take_ahead(rides, 81, None), "answered for a cancelled workflow"


def _journal_rows(cconn: Conn, workflow_id: str) -> list[dict[str, Any]]:
    """A workflow's checkpoints as written, its own id (in child ids) made generic."""
    rows = cconn.execute(
        "SELECT * FROM dbos.operation_outputs WHERE workflow_uuid = %s ORDER BY function_id",
        (workflow_id,),
    ).fetchall()
    made = []
    for row in rows:
        for column in ("started_at_epoch_ms", "completed_at_epoch_ms", "retention_timestamp"):
            assert row[column] is not None, (column, row)
        kept = {
            k: v.replace(workflow_id, "W") if isinstance(v, str) else v
            for k, v in row.items()
            if k not in ("started_at_epoch_ms", "completed_at_epoch_ms", "retention_timestamp")
        }
        if kept["function_name"] == "DBOS.sleep":  # its output is the wake-up time
            kept["output"] = type(json.loads(kept["output"])).__name__
        made.append(kept)
    return made


def test_step_checkpoint_writes_what_dbos_writes(cconn: Conn) -> None:
    from dbos._dbos import _get_dbos_instance
    from dbos._error import DBOSStepNondeterminismError, DBOSWorkflowConflictIDError

    name = "step-checkpoint"
    journals = []
    for own in (False, True):
        workflow_id = str(uuid.uuid4())
        with dbos_own_checkpoint() if own else contextlib.nullcontext():
            cconn.execute(
                "SELECT dbos.enqueue_workflow('ll_contract_journal', %(queue)s, "
                "ARRAY[]::json[], workflow_id => %(id)s)",
                {"queue": QUEUE_NAME, "id": workflow_id},
            )
            assert _result(workflow_id, name) == "journaled"
        journals.append((workflow_id, _journal_rows(cconn, workflow_id)))
    (ours_id, ours), (_, dbos) = journals
    assert ours == dbos, broken(name, f"ours wrote {ours}, DBOS {dbos}")
    kinds = {k for row in ours for k in ("output", "error", "child_workflow_id") if row[k]}
    assert kinds == {"output", "error", "child_workflow_id"}, ours

    # The same answers to a retry (the same time), another time, and another owner.
    sys_db = _get_dbos_instance()._sys_db
    (first,) = cconn.execute(
        "SELECT * FROM dbos.operation_outputs WHERE workflow_uuid = %s AND function_id = "
        "(SELECT min(function_id) FROM dbos.operation_outputs WHERE workflow_uuid = %s)",
        (ours_id, ours_id),
    ).fetchall()
    result = {
        k: first[k]
        for k in (
            "workflow_uuid",
            "function_id",
            "function_name",
            "output",
            "error",
            "serialization",
            "started_at_epoch_ms",
            "child_workflow_id",
        )
    }
    same = first["completed_at_epoch_ms"]
    owner = _row(cconn, ours_id)["owner_xid"]
    for label, kwargs, raised in (
        ("a retry", {"completed_at_epoch_ms": same, "owner_xid": owner}, None),
        ("another time", {"completed_at_epoch_ms": same + 1, "owner_xid": owner}, "nondet"),
        ("another owner", {"owner_xid": str(uuid.uuid4())}, "conflict"),
    ):
        answers = []
        for own in (False, True):
            with dbos_own_checkpoint() if own else contextlib.nullcontext():
                try:
                    sys_db.record_operation_result(dict(result), **kwargs)
                    answers.append(None)
                except DBOSStepNondeterminismError as exc:
                    answers.append(("nondet", str(exc)))
                except DBOSWorkflowConflictIDError as exc:
                    answers.append(("conflict", str(exc)))
        assert answers[0] == answers[1], broken(
            name, f"{label}: ours {answers[0]}, DBOS {answers[1]}"
        )
        assert (answers[0] or (None,))[0] == raised, (label, answers)
    assert _journal_rows(cconn, ours_id) == ours, broken(name, "a refused checkpoint wrote")


def test_cancelled_task_records_nothing(cconn: Conn, contract_worker: str) -> None:
    name = "cancelled-task-records-nothing"
    workflow_id = _start(cconn)
    _evict(workflow_id)
    status = DBOS.get_workflow_status(workflow_id)
    assert status is not None
    assert status.status == "PENDING", broken(name, f"the workflow became {status.status}")
    assert status.error is None, broken(name, f"an error was recorded: {status.error!r}")
    steps = [s["function_name"] for s in DBOS.list_workflow_steps(workflow_id)]
    assert "mark" in steps, broken(name, f"the step before the wait is missing: {steps}")
    assert not any("recv" in s.lower() for s in steps), broken(
        name, f"the cancelled recv was recorded as a step: {steps}"
    )
    # The next execution replays the journal and waits again; the message then ends it.
    assert _hibernation(cconn, "workflow_requeue", workflow_id, contract_worker) == 1
    _waiting(workflow_id)
    _send(cconn, workflow_id, "replayed")
    assert _result(workflow_id, name) == "replayed"


def test_delayed_park(cconn: Conn, contract_worker: str) -> None:
    name = "delayed-park"
    due, later = _start(cconn), _start(cconn)
    for workflow_id in (due, later):
        _evict(workflow_id)
    past = int((time.time() - 1) * 1000)
    assert _hibernation(cconn, "workflow_park", due, contract_worker, until_ms=past) == 1
    assert _hibernation(cconn, "workflow_park", later, contract_worker) == 1
    assert _row(cconn, later)["status"] == "DELAYED"
    try:
        # DBOS moves due DELAYED rows in a background job (every second by default; a
        # fleet worker may run it less often), so allow it a generous deadline.
        _waiting(due, timeout=40)
    except AssertionError:
        pytest.fail(broken(name, f"a DELAYED workflow past its delay stayed {_row(cconn, due)}"))
    # The pass that dispatched `due` saw `later` too, and left it parked.
    assert _row(cconn, later)["status"] == "DELAYED", broken(
        name, f"a DELAYED workflow was taken before its delay: {_row(cconn, later)}"
    )
    _send(cconn, due, "woken")
    assert _result(due, name) == "woken"
    DBOS.set_workflow_delay(later, delay_seconds=0)  # public: only for a DELAYED workflow
    _waiting(later, timeout=40)
    _send(cconn, later, "woken")
    assert _result(later, name) == "woken"


def test_requeue_owner_token(cconn: Conn, contract_worker: str) -> None:
    name = "requeue-owner-token"
    workflow_id = _start(cconn)
    first_owner = _row(cconn, workflow_id)["owner_xid"]
    assert first_owner, broken(name, "a dispatched workflow has no owner_xid")
    _evict(workflow_id)
    assert _hibernation(cconn, "workflow_requeue", workflow_id, contract_worker) == 1
    try:
        _waiting(workflow_id)
    except AssertionError:
        row = _row(cconn, workflow_id)
        pytest.fail(broken(name, f"the requeued row was never dispatched: {row}"))
    second_owner = _row(cconn, workflow_id)["owner_xid"]
    assert second_owner not in (None, first_owner), broken(
        name, f"the new dispatch kept owner_xid {first_owner!r} (now {second_owner!r})"
    )
    _send(cconn, workflow_id, "owned")
    assert _result(workflow_id, name) == "owned"


def test_recovery_attempts(cconn: Conn, contract_worker: str) -> None:
    """WAITER allows one recovery: DBOS dead-letters it at its third dispatch unless each
    hibernation gives its dispatch back, which the park and the requeue do."""
    name = "recovery-attempts"
    kept = _start(cconn)
    assert _row(cconn, kept)["recovery_attempts"] == 1, broken(
        name, f"the first dispatch counted {_row(cconn, kept)['recovery_attempts']}"
    )
    for _ in range(3):
        _evict(kept)
        # Read in the requeue's own transaction: once it commits, the worker may dispatch
        # the row again (counting 1) before a separate read could see the 0.
        with cconn.transaction():
            assert _hibernation(cconn, "workflow_requeue", kept, contract_worker) == 1
            given_back = _row(cconn, kept)["recovery_attempts"]
        assert given_back == 0, broken(name, f"the requeue left recovery_attempts {given_back}")
        _waiting(kept)
        assert _row(cconn, kept)["recovery_attempts"] == 1, broken(
            name, f"a dispatch counted {_row(cconn, kept)['recovery_attempts']} (expected 1)"
        )
    _send(cconn, kept, "kept")
    assert _result(kept, name) == "kept"

    # The same dispatches without giving any back: DBOS dead-letters the workflow at its
    # third (so the decrement is still needed).
    dropped = _start(cconn)
    for dispatch in (2, 3):
        _evict(dropped)
        cconn.execute(
            "UPDATE dbos.workflow_status SET status = 'ENQUEUED', owner_xid = NULL, "
            "started_at_epoch_ms = NULL WHERE workflow_uuid = %s",
            (dropped,),
        )
        if dispatch == 2:
            _waiting(dropped)

    def settled() -> str | None:
        if dropped in _WAITING:
            return "dispatched again"
        status = str(_row(cconn, dropped)["status"])
        return status if status not in ("ENQUEUED", "PENDING") else None

    outcome = wait_until(settled, timeout=15)
    if outcome == "dispatched again":
        _send(cconn, dropped, "end")
    assert outcome == "MAX_RECOVERY_ATTEMPTS_EXCEEDED", broken(
        name, f"a third dispatch of a workflow allowing one recovery was {outcome}"
    )


def test_notifications_trigger(cconn: Conn, contract_db: str) -> None:
    """Each way of sending wakes a parked run through the trigger on dbos.notifications."""
    name = "notifications-trigger"
    far = int((time.time() + 3600) * 1000)

    def parked_run() -> str:
        # A run's workflow parked on a queue nobody listens to: only the trigger moves it.
        run_id = str(uuid.uuid4())
        cconn.execute(
            "SELECT dbos.enqueue_workflow('ledgerloop_run', 'll_contract_idle', "
            "ARRAY[to_json(%(id)s::text)], workflow_id => %(id)s, "
            "delay_until_epoch_ms => %(far)s)",
            {"id": run_id, "far": far},
        )
        assert _row(cconn, run_id)["status"] == "DELAYED"
        return run_id

    client = DBOSClient(
        system_database_url=contract_db,
        serializer=DBOSPortableJSONSerializer(),
        system_database_pool_size=1,
    )
    try:
        senders = {
            "DBOS.send": lambda run_id: DBOS.send(run_id, "m", "t"),
            "DBOSClient.send": lambda run_id: client.send(run_id, "m", "t"),
            "dbos.send_message": lambda run_id: _send(cconn, run_id, "m"),
        }
        for sender, send in senders.items():
            run_id = parked_run()
            send(run_id)
            row = _row(cconn, run_id)
            woken = (row["status"], row["delay_until_epoch_ms"])
            assert woken == ("ENQUEUED", None), broken(
                name, f"{sender} to a parked run left it {row['status']}"
            )
    finally:
        client.destroy()


def test_unconsumed_messages(cconn: Conn) -> None:
    from ledgerloop.effects.testing import messages_for

    name = "unconsumed-messages"
    workflow_id = _start(cconn)
    params = {"workflow_id": workflow_id}
    _send(cconn, workflow_id, "later", "other")
    waiting = cconn.execute(HIBERNATION["message_waiting"], {**params, "topic": "other"})
    assert waiting.fetchone() == {"waiting": True}, broken(name, "a sent message was not seen")
    assert [m["message"] for m in messages_for(cconn, uuid.UUID(workflow_id), "other")] == [
        "later"
    ], broken(name, "the test helper could not read the message back")
    _send(cconn, workflow_id, "now")
    assert _result(workflow_id, name) == "now"
    consumed = cconn.execute(HIBERNATION["message_waiting"], {**params, "topic": "t"})
    assert consumed.fetchone() == {"waiting": False}, broken(
        name, "a message recv consumed still reads as unconsumed"
    )


#: The columns Ledgerloop's SQL names in DBOS's tables, with their types.
_COLUMNS = {
    "workflow_status": {
        "workflow_uuid": "text",
        "status": "text",
        "name": "text",
        "executor_id": "text",
        "queue_name": "text",
        "owner_xid": "text",
        "started_at_epoch_ms": "bigint",
        "delay_until_epoch_ms": "bigint",
        "recovery_attempts": "bigint",
        "updated_at": "bigint",
        "parent_workflow_id": "text",
        "application_version": "text",
    },
    "notifications": {
        "destination_uuid": "text",
        "topic": "text",
        "consumed": "boolean",
        "message_uuid": "text",
        "message": "text",
        "serialization": "text",
        "created_at_epoch_ms": "bigint",
    },
}


def test_workflow_status_columns(cconn: Conn) -> None:
    name = "workflow-status-columns"
    rows = cconn.execute(
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = 'dbos' AND table_name = ANY(%s)",
        (list(_COLUMNS),),
    ).fetchall()
    found = {(r["table_name"], r["column_name"]): r["data_type"] for r in rows}
    for table, columns in _COLUMNS.items():
        for column, data_type in columns.items():
            assert found.get((table, column)) == data_type, broken(
                name, f"dbos.{table}.{column} is {found.get((table, column)) or 'missing'}"
            )
    # Every statement of the hibernation plans against the installed tables.
    for query in ("workflow_lock", "message_waiting", "workflow_park", "workflow_requeue"):
        params = {"queue": "q", "workflow_id": "w", "topic": "t", "executor_id": "e"}
        cconn.execute(f"EXPLAIN {HIBERNATION[query]}", {**params, "until_ms": 0})


def test_migration_versions(cconn: Conn, contract_db: str, db_factory: DatabaseFactory) -> None:
    from dbos._migration import get_migration_versions

    from ledgerloop.db.url import sqlalchemy_url

    def migration_versions(engine: sa.Engine) -> tuple[int, int]:
        return get_migration_versions(engine, "dbos", True)

    name = "migration-versions"
    recorded = cconn.execute("SELECT version FROM dbos.dbos_migrations").fetchone()
    assert recorded is not None
    engine = sa.create_engine(sqlalchemy_url(contract_db), poolclass=sa.NullPool)
    try:
        current = migration_versions(engine)
    finally:
        engine.dispose()
    assert current == (recorded["version"], recorded["version"]), broken(
        name, f"it read {current} on a database at version {recorded['version']}"
    )
    empty = db_factory.create(migrated=False)
    engine = sa.create_engine(sqlalchemy_url(empty), poolclass=sa.NullPool)
    try:
        assert migration_versions(engine) == (0, recorded["version"]), broken(
            name, "an empty database did not read as (0, latest)"
        )
    finally:
        engine.dispose()
        db_factory.drop(empty)


def test_stopped_worker_requeue(cconn: Conn) -> None:
    from ledgerloop.fleet.heartbeat import Q as FLEET

    name = "stopped-worker-requeue"
    workflow_id = _start(cconn)
    _evict(workflow_id)
    # As if a worker that stopped cleanly had been executing it (it is not on any queue now).
    cconn.execute(
        "UPDATE dbos.workflow_status SET executor_id = 'contract-stopped', queue_name = NULL "
        "WHERE workflow_uuid = %s",
        (workflow_id,),
    )
    cconn.execute(FLEET["executor_unregister"], {"id": "contract-stopped"})
    try:
        _waiting(workflow_id)
    except AssertionError:
        pytest.fail(broken(name, f"nobody dispatched it: {_row(cconn, workflow_id)}"))
    _send(cconn, workflow_id, "requeued")
    assert _result(workflow_id, name) == "requeued"


@DBOS.workflow(name="ll_contract_fenced", max_recovery_attempts=1)
async def contract_fenced() -> Any:
    """A step that reads its execution's owner token and the row's; then a step whose body
    raises DBOS's lost-ownership error, as the fence does (caught here, so the workflow ends
    instead of being parked by DBOS)."""
    from dbos._error import DBOSWorkflowConflictIDError

    from ledgerloop.fleet import dbos_internals

    token = await DBOS.run_step_async({"name": "token"}, _token)

    async def lost() -> str:
        raise dbos_internals.lost_ownership(DBOS.workflow_id or "")

    try:
        await DBOS.run_step_async({"name": "lost"}, lost)
    except DBOSWorkflowConflictIDError:
        return {"token": token, "stopped": True}
    return {"token": token, "stopped": False}


async def _token() -> list[str | None]:
    """This execution's token as the fence reads it, and the one its row holds."""
    from ledgerloop.db.connect import connect
    from ledgerloop.fleet.dbos_internals import execution_owner
    from ledgerloop.runtime import get_runtime

    with connect(get_runtime().database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT owner_xid FROM dbos.workflow_status WHERE workflow_uuid = %s",
            (DBOS.workflow_id,),
        ).fetchone()
    return [execution_owner(), row["owner_xid"] if row else None]


@pytest.mark.parametrize("one_statement", [False, True], ids=["dbos-claim", "one-statement"])
def test_fleet_dispatch(cconn: Conn, contract_worker: str, one_statement: bool) -> None:
    """A bounded claim in DBOS's order, then the claimed runs started with the token; the
    same with the claim as one statement on the caller's connection (fleet-claim)."""
    from ledgerloop.fleet import dbos_internals

    name = "fleet-dispatch"
    via = cconn if one_statement else None
    queue = DBOS.register_queue(f"ll_contract_dispatch_{one_statement}", worker_concurrency=100)
    ids = [str(uuid.uuid4()) for _ in range(3)]
    for workflow_id in ids:
        cconn.execute(
            "SELECT dbos.enqueue_workflow(%s, %s, ARRAY[to_json('t'::text)], workflow_id => %s)",
            (WAITER, queue.name, workflow_id),
        )
    batch = dbos_internals.claim_batch(queue, 2, via)
    owner, claimed = batch.owner, batch.ids
    assert claimed == ids[:2], broken(name, f"a claim bounded to 2 took {claimed}")
    for workflow_id in claimed:
        row = _row(cconn, workflow_id)
        assert (row["status"], row["owner_xid"], row["executor_id"]) == (
            "PENDING",
            owner,
            contract_worker,
        ), broken(name, f"a claimed row reads {row}")
    dbos_internals.start_claimed(batch)
    for workflow_id in claimed:
        _waiting(workflow_id)
        _send(cconn, workflow_id, "dispatched")
        assert _result(workflow_id, name) == "dispatched"
    batch = dbos_internals.claim_batch(queue, 2, via)
    rest = batch.ids
    assert rest == [i for i in ids if i not in claimed], broken(name, f"then it took {rest}")
    dbos_internals.start_claimed(batch)
    _waiting(rest[0])
    _send(cconn, rest[0], "dispatched")
    assert _result(rest[0], name) == "dispatched"


def test_fleet_dispatch_background_job_lock(cconn: Conn, contract_worker: str) -> None:
    """fleet-dispatch, its background jobs' period: DBOS holds their advisory lock in an
    open transaction for the whole period, under an idle timeout. The worker's period (10 s)
    is longer than DBOS's 5 s timeout, which the worker raises: a lock held idle for longer
    than 5 s keeps its session (else Postgres ends it every round and DBOS reconnects)."""
    import hashlib

    import dbos._sys_db_postgres as postgres
    import dbos._workflow_commands as commands
    from dbos._dbos import _get_dbos_instance

    name = "fleet-dispatch"
    period_ms = commands._BACKGROUND_JOBS_INTERVAL_SEC * 1000
    timeout_ms = postgres.BACKGROUND_JOB_LOCK_IDLE_TIMEOUT_MS
    assert timeout_ms > period_ms, broken(name, f"a {timeout_ms} ms timeout, {period_ms} ms period")
    sys_db = _get_dbos_instance()._sys_db
    job = "ll-contract-hold"
    # The lock's key as DBOS derives it; Postgres shows a bigint advisory lock as two oids.
    label = f"dbos.background_job.{sys_db.schema}.{sys_db.app_name or ''}.{job}"
    key = int.from_bytes(hashlib.sha256(label.encode()).digest()[:8], "big", signed=True)
    high, low = (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF
    with sys_db.background_job_lock(job) as acquired:
        assert acquired, broken(name, "a free background-job lock was not granted")
        time.sleep(6.0)  # idle in its transaction past DBOS's own 5 s timeout
        row = cconn.execute(
            "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND classid = %s AND objid = %s",
            (high, low),
        ).fetchone()
    assert row is not None
    assert row["n"] == 1, broken(name, "the lock's session was ended while it held the lock")


@pytest.mark.parametrize("one_statement", [False, True], ids=["dbos-claim", "one-statement"])
def test_fleet_dispatch_latest_version(
    cconn: Conn, contract_worker: str, monkeypatch: pytest.MonkeyPatch, one_statement: bool
) -> None:
    """The claim is told whether this worker runs the latest version (read at most once per
    LatestVersion.ttl_s): a version-less run goes to the latest version's workers only, as
    in DBOS's own claim."""
    from dbos._dbos import _get_dbos_instance

    from ledgerloop.fleet import dbos_internals

    name = "fleet-dispatch"
    sys_db = _get_dbos_instance()._sys_db
    assert dbos_internals._takes_latest_version(sys_db), broken(
        name, "start_queued_workflows no longer takes is_latest_version="
    )
    # Read on every claim here (a fresh cache: the dispatch test's answer may be cached).
    monkeypatch.setattr(dbos_internals, "_LATEST", dbos_internals.LatestVersion(ttl_s=0.0))
    via = cconn if one_statement else None
    queue = DBOS.register_queue(f"ll_contract_latest_{one_statement}", worker_concurrency=100)
    mine = DBOS.application_version
    workflow_id = str(uuid.uuid4())
    cconn.execute(
        "SELECT dbos.enqueue_workflow(%s, %s, ARRAY[to_json('t'::text)], workflow_id => %s)",
        (WAITER, queue.name, workflow_id),
    )
    sys_db.create_application_version("ll-contract-newer")
    DBOS.set_latest_application_version("ll-contract-newer")
    try:
        claimed = dbos_internals.claim_batch(queue, 5, via).ids
        assert claimed == [], broken(name, f"a worker of an older version claimed {claimed}")
    finally:
        DBOS.set_latest_application_version(mine)
    batch = dbos_internals.claim_batch(queue, 5, via)
    assert batch.ids == [workflow_id], broken(name, f"the latest version's worker took {batch}")
    dbos_internals.start_claimed(batch)
    _waiting(workflow_id)
    _send(cconn, workflow_id, "dispatched")
    assert _result(workflow_id, name) == "dispatched"


def test_fleet_start(cconn: Conn, contract_worker: str) -> None:
    """Claimed runs are handed to the event loop without waiting for it (the loop is held
    busy here), count as starting until their tasks exist, then run; another thread's
    hand-over still waits for its coroutine's result."""
    from dbos._dbos import _get_dbos_instance

    from ledgerloop.fleet import dbos_internals

    name = "fleet-start"
    dbos = _get_dbos_instance()
    queue = DBOS.register_queue("ll_contract_start", worker_concurrency=100)
    ids = [str(uuid.uuid4()) for _ in range(3)]
    for workflow_id in ids:
        cconn.execute(
            "SELECT dbos.enqueue_workflow(%s, %s, ARRAY[to_json('t'::text)], workflow_id => %s)",
            (WAITER, queue.name, workflow_id),
        )
    batch = dbos_internals.claim_batch(queue, 3, cconn)
    assert batch.ids == ids
    loop = dbos._background_event_loop.target_loop()
    assert loop is not None
    busy = threading.Event()
    loop.call_soon_threadsafe(lambda: (busy.set(), time.sleep(1.0)))
    busy.wait(5)
    began = time.monotonic()
    dbos_internals.start_claimed(batch)
    returned_s = time.monotonic() - began
    assert returned_s < 0.5, broken(
        name, f"starting a batch waited {returned_s:.2f} s for the loop"
    )
    assert dbos_internals.starting() == 3, broken(
        name, f"{dbos_internals.starting()} runs counted as starting, not 3"
    )
    assert dbos_internals.claim_batch(queue, 3, cconn).ids == []
    wait_until(lambda: dbos_internals.starting() == 0, timeout=10)
    assert dbos_internals.running_on_queue(queue.name) == 3, broken(
        name, "the started runs are not counted as running on the queue"
    )
    for workflow_id in ids:
        _waiting(workflow_id)
        _send(cconn, workflow_id, "started")
        assert _result(workflow_id, name) == "started"

    async def answer() -> str:
        return "waited"

    assert dbos._background_event_loop.submit_coroutine(answer()) == "waited", broken(
        name, "a hand-over outside start_claimed no longer waits for its result"
    )


def test_fleet_claim(cconn: Conn, contract_worker: str) -> None:
    """The one-statement claim leaves a row as DBOS's claim leaves its twin (priority order,
    timeout deadline, recovery attempt, executor, version) and returns exactly what DBOS's
    get_workflow_statuses reads for it."""
    from dbos._dbos import _get_dbos_instance

    from ledgerloop.fleet import dbos_internals

    name = "fleet-claim"
    sys_db = _get_dbos_instance()._sys_db
    queue = DBOS.register_queue("ll_contract_claim", worker_concurrency=100)
    assert dbos_internals.claims_in_one_statement(sys_db, queue), broken(
        name, "a queue with only a worker concurrency is no longer claimed in one statement"
    )
    limited = DBOS.register_queue("ll_contract_claim_limited", worker_concurrency=5, concurrency=50)
    assert not dbos_internals.claims_in_one_statement(sys_db, limited), broken(
        name, "a queue with a global concurrency was taken for one without"
    )
    twins = {}
    for label, priority in (("low", 5), ("dbos", 1), ("ours", 1)):
        twins[label] = str(uuid.uuid4())
        cconn.execute(
            "SELECT dbos.enqueue_workflow(%s, %s, ARRAY[to_json('t'::text)], "
            "workflow_id => %s, timeout_ms => 60000, priority => %s)",
            (WAITER, queue.name, twins[label], priority),
        )
    by_dbos = dbos_internals.claim_batch(queue, 1)
    by_statement = dbos_internals.claim_batch(queue, 1, cconn)
    assert (by_dbos.ids, by_statement.ids) == ([twins["dbos"]], [twins["ours"]]), broken(
        name, f"claims took {by_dbos.ids} then {by_statement.ids}, not in priority order"
    )
    (read,) = sys_db.get_workflow_statuses([twins["ours"]])
    assert by_statement.statuses == [dict(read)], broken(
        name, f"the statement returned {by_statement.statuses}, DBOS reads {dict(read)}"
    )
    varying = {
        "workflow_uuid",
        "owner_xid",
        "created_at",
        "updated_at",
        "started_at_epoch_ms",
        "workflow_deadline_epoch_ms",
    }
    rows = {
        label: cconn.execute(
            "SELECT * FROM dbos.workflow_status WHERE workflow_uuid = %s", (twins[label],)
        ).fetchone()
        for label in ("dbos", "ours")
    }
    same = {
        label: {k: v for k, v in row.items() if k not in varying} for label, row in rows.items()
    }
    assert same["ours"] == same["dbos"], broken(
        name, f"claimed rows differ: DBOS {same['dbos']}, the statement {same['ours']}"
    )
    for label, claim in (("dbos", by_dbos), ("ours", by_statement)):
        row = rows[label]
        assert row["owner_xid"] == claim.owner, broken(name, f"{label} row {row}")
        deadline = row["workflow_deadline_epoch_ms"] - row["started_at_epoch_ms"]
        assert 59_000 <= deadline <= 61_000, broken(name, f"{label} deadline {deadline} ms")
    dbos_internals.start_claimed(by_statement)
    dbos_internals.start_claimed(by_dbos)
    for label in ("dbos", "ours"):
        _waiting(twins[label])
        _send(cconn, twins[label], "claimed")
        assert _result(twins[label], name) == "claimed"


def test_fleet_owner_token(cconn: Conn) -> None:
    name = "fleet-owner-token"
    handle = DBOS.start_workflow(contract_fenced)
    result = handle.get_result()
    steps = cconn.execute(
        "SELECT function_name FROM dbos.operation_outputs WHERE workflow_uuid = %s",
        (handle.get_workflow_id(),),
    ).fetchall()
    assert result["stopped"], broken(name, "the lost-ownership error did not reach the workflow")
    assert [s["function_name"] for s in steps] == ["token"], broken(
        name, f"the stopped step was recorded: {steps}"
    )
    token, row_owner = result["token"]
    assert token is not None, broken(name, "no owner token in a step body")
    assert token == row_owner, broken(name, f"the step saw {token}, the row held {row_owner}")


def test_adopt_version(cconn: Conn) -> None:
    name = "adopt-version"
    adopt = load_queries("ledgerloop.deploy")["workflows_adopt"]
    workflow_id = str(uuid.uuid4())
    cconn.execute(
        "SELECT dbos.enqueue_workflow(%(name)s, %(queue)s, ARRAY[to_json('t'::text)], "
        "workflow_id => %(id)s, app_version => 'll-contract-old')",
        {"name": WAITER, "queue": QUEUE_NAME, "id": workflow_id},
    )
    from ledgerloop.config import load_settings

    version = load_settings().application_version  # as the contract worker's
    adopted = cconn.execute(
        adopt,
        {
            "ids": [workflow_id],
            "statuses": ["ENQUEUED"],
            "executors": [None],
            "last_ops": [0],
            "to_version": version,
            "queue": QUEUE_NAME,
            "stale_s": 5,
        },
    ).fetchall()
    assert [r["workflow_uuid"] for r in adopted] == [workflow_id]
    try:
        _waiting(workflow_id)
    except AssertionError:
        row = _row(cconn, workflow_id)
        pytest.fail(broken(name, f"the adopted workflow was never dispatched: {row}"))
    _send(cconn, workflow_id, "adopted")
    assert _result(workflow_id, name) == "adopted"


def test_replay_harness() -> None:
    name = "replay-harness"
    for attribute in (
        "run_step_async",
        "recv_async",
        "sleep_async",
        "patch_async",
        "deprecate_patch_async",
        "start_workflow_async",
    ):
        assert callable(DBOS.__dict__.get(attribute) and getattr(DBOS, attribute)), broken(
            name, f"DBOS.{attribute} is not a class attribute"
        )
    from ledgerloop.agent.episodes import EPISODE_WORKFLOW, episode_workflow

    assert getattr(episode_workflow, "dbos_function_name", None) == EPISODE_WORKFLOW, broken(
        name, "a workflow function does not carry its registered name as dbos_function_name"
    )
    descriptor = DBOS.__dict__.get("workflow_id")
    assert hasattr(descriptor, "__get__"), broken(name, "DBOS.__dict__ has no workflow_id")
    assert descriptor.__get__(None, DBOS) is None, broken(
        name, "outside a workflow DBOS.workflow_id read through its descriptor is not None"
    )


def test_workflow_input(cconn: Conn) -> None:
    name = "workflow-input"
    # The pattern runs_stuck reads a run id from a workflow's inputs with, as it stands.
    found = re.search(r"substring\(i\.inputs FROM ('[^']*')\)", FLEET["runs_stuck"])
    assert found is not None
    pattern = found.group(1)[1:-1]  # the literal's text: no quote or backslash to undo
    run_id, stray = str(uuid.uuid4()), f"ll-contract-{uuid.uuid4()}"
    cconn.execute(
        "SELECT dbos.enqueue_workflow('ll_contract_never', 'll_contract_none', "
        "ARRAY[to_json(%s::text)], workflow_id => %s)",
        (run_id, stray),
    )
    row = cconn.execute(
        "SELECT substring(i.inputs FROM %s) AS run "
        "FROM dbos.workflow_input i WHERE i.workflow_uuid = %s",
        (pattern, stray),
    ).fetchone()
    assert row is not None, broken(name, "no dbos.workflow_input row for an enqueued workflow")
    assert row["run"] == run_id, broken(name, f"its inputs do not name the run: {row}")


def test_dispatch_trigger(cconn: Conn, contract_db: str) -> None:
    name = "dispatch-trigger"
    client = DBOSClient(system_database_url=contract_db)
    try:
        with psycopg.connect(contract_db, autocommit=True) as listener:
            listener.execute("LISTEN ledgerloop_runs")
            workflow_id = str(uuid.uuid4())
            client.enqueue(
                {
                    "workflow_name": "ll_contract_recv_id",
                    "queue_name": QUEUE_NAME,
                    "workflow_id": workflow_id,
                }
            )
            woken = [n.channel for n in listener.notifies(timeout=5, stop_after=1)]
    finally:
        client.destroy()
    row = _row(cconn, workflow_id)
    assert woken == ["ledgerloop_runs"], broken(
        name, f"enqueueing sent no notification; the workflow's row is {row}"
    )
    _result(workflow_id, name)  # and the contract worker ran it


def test_step_start() -> None:
    """Ledgerloop's `Pending.then` gives what DBOS's gives, for a value, an exception and the
    pool's configuration, with one trip through the thread pool fewer (dbos_step_start)."""
    from concurrent.futures import ThreadPoolExecutor

    from dbos._outcome import Pending

    from ledgerloop.agent import dbos_step_start

    class Dbos:
        configured = 0

        async def _configure_asyncio_thread_pool(self) -> None:
            self.configured += 1

    class Counting(ThreadPoolExecutor):
        submitted = 0

        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            Counting.submitted += 1
            return super().submit(fn, *args, **kwargs)

    async def value() -> int:
        return 41

    async def failing() -> int:
        raise KeyError("body")

    def plus_one(got: Any) -> Any:
        try:
            return got() + 1
        except KeyError as exc:
            return f"raised {exc}"

    def compose(then: Any, body: Any) -> tuple[Any, int, int]:
        dbos = Dbos()

        async def go() -> Any:
            asyncio.get_running_loop().set_default_executor(Counting(2))
            return await then(Pending(body), plus_one, dbos=dbos)()

        Counting.submitted = 0
        answer = asyncio.run(go())
        return answer, Counting.submitted, dbos.configured

    installed = dbos_step_start.installed()
    dbos_step_start.uninstall()
    try:
        theirs = [compose(Pending.then, body) for body in (value, failing)]
        assert dbos_step_start.applies(), broken("step-start", "Pending is not the one replaced")
        assert dbos_step_start.install()
        ours = [compose(Pending.then, body) for body in (value, failing)]
    finally:
        dbos_step_start.uninstall()
        if installed:
            dbos_step_start.install()
    assert [t[0] for t in theirs] == [42, "raised 'body'"], broken("step-start", f"{theirs}")
    assert [o[0] for o in ours] == [t[0] for t in theirs], broken("step-start", f"{ours}")
    assert [o[2] for o in ours] == [t[2] for t in theirs] == [1, 1], broken(
        "step-start", f"pool configured {theirs}"
    )
    # DBOS's: `before` on a thread, then `next`; ours: `next` only.
    assert [t[1] for t in theirs] == [2, 2], broken("step-start", f"thread trips {theirs}")
    assert [o[1] for o in ours] == [1, 1], f"thread trips with the patch: {ours}"
