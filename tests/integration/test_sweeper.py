"""The sweeper settles runs whose workflow ended, vanished or outlived the run."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from ledgerloop.approvals.store import approval_list
from ledgerloop.control.sweeper import Verdict, run_settle
from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import effect_list, effect_require
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_create, run_events, run_require, run_transition
from ledgerloop.testing.postgres import wait_until
from tests.conftest import start_test_run
from tests.support.telemetry import Captured

SLOW_FIRST_TURN = "default: {turns: [{text: done, delay_ms: 4000}]}"
FAST = {"sweep_interval_s": 0.1, "sweep_min_age_s": 0.0, "sweep_deadline_grace_s": 0.0}


def _swept(captured: Captured) -> dict[str, int]:
    counts: dict[str, int] = {}
    for rm in captured.metrics.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == "ledgerloop.runs.swept":
                    for point in metric.data.data_points:
                        reason = str(point.attributes["ledgerloop.run.sweep_reason"])
                        counts[reason] = counts.get(reason, 0) + int(point.value)
    return counts


def _swept_soon(captured: Captured, expected: dict[str, int]) -> None:
    """The count is added after the settling transaction commits, so a test that saw the run
    settled can still be a moment ahead of it."""
    wait_until(lambda: _swept(captured) == expected, timeout=10)
    assert _swept(captured) == expected


def _settled(conn: Conn, run_id: uuid.UUID) -> Any:
    run = wait_until(
        lambda: (
            (r := run_require(conn, run_id)).status in (RunStatus.FAILED, RunStatus.CANCELLED) and r
        ),
        # An idle sweeper backs off (ledgerloop/idle.py) and the wake-up comes from a timer:
        # a loaded machine takes longer than a quiet one, the outcome is the same.
        timeout=30,
    )
    return run


def _in_planning(conn: Conn, run_id: uuid.UUID) -> None:
    wait_until(lambda: run_require(conn, run_id).status is RunStatus.PLANNING, timeout=20)


def test_a_workflow_forced_to_error_behind_the_runs_back_is_settled(
    conn: Conn, scripted_model: Any, worker: Any, captured: Captured
) -> None:
    model = scripted_model(SLOW_FIRST_TURN)
    worker(model.url, **FAST)
    run_id = start_test_run(conn, "looper", "hello")
    _in_planning(conn, run_id)
    conn.execute(
        "UPDATE dbos.workflow_status SET status = 'ERROR' WHERE workflow_uuid = %s",
        (str(run_id),),
    )
    run = _settled(conn, run_id)
    assert run.status is RunStatus.FAILED
    assert run.state["reason"] == "workflow_error"
    assert run.state["swept"] is True
    last = run_events(conn, run_id)[-1]
    assert (last.event_type, last.payload["workflow_status"]) == ("workflow_error", "ERROR")
    _swept_soon(captured, {"workflow_error": 1})


def test_a_cancelled_or_missing_workflow_settles_its_run(
    conn: Conn, scripted_model: Any, worker: Any, captured: Captured
) -> None:
    model = scripted_model(SLOW_FIRST_TURN)
    worker(model.url, **FAST)
    cancelled = start_test_run(conn, "looper", "one")
    missing = start_test_run(conn, "looper", "two")
    _in_planning(conn, cancelled)
    _in_planning(conn, missing)
    conn.execute(
        "UPDATE dbos.workflow_status SET status = 'CANCELLED' WHERE workflow_uuid = %s",
        (str(cancelled),),
    )
    conn.execute("DELETE FROM dbos.workflow_status WHERE workflow_uuid = %s", (str(missing),))
    assert _settled(conn, cancelled).state["reason"] == "workflow_cancelled"
    assert run_require(conn, cancelled).status is RunStatus.CANCELLED
    gone = _settled(conn, missing)
    assert (gone.status, gone.state["reason"]) == (RunStatus.FAILED, "workflow_missing")
    _swept_soon(captured, {"workflow_cancelled": 1, "workflow_missing": 1})


def test_a_run_no_worker_takes_is_failed_past_its_deadline(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model(SLOW_FIRST_TURN)
    worker(model.url, run_deadline_s=1.0, **FAST)
    with conn.transaction():
        # Pinned to a version no worker runs: it stays on the queue.
        conn.execute("SET LOCAL ledgerloop.application_version = 'nobody-runs-this'")
        run_id = start_test_run(conn, "looper", "stranded")
    run = _settled(conn, run_id)
    assert (run.status, run.state["reason"]) == (RunStatus.FAILED, "deadline_exceeded")
    # Its workflow is cancelled through DBOS's API, right after the settling commit.
    wait_until(
        lambda: (
            conn.execute(
                "SELECT status FROM dbos.workflow_status WHERE workflow_uuid = %s", (str(run_id),)
            ).fetchone()
            == {"status": "CANCELLED"}
        ),
        timeout=10,
    )
    requests = "SELECT run_id FROM ledgerloop.workflow_cancel_request"
    wait_until(lambda: conn.execute(requests).fetchall() == [], timeout=10)
    assert model.requests() == []


def test_healthy_runs_are_left_alone(conn: Conn, scripted_model: Any, worker: Any) -> None:
    model = scripted_model("default: {turns: [{text: done, delay_ms: 1500}]}")
    worker(model.url, **FAST)
    run_id = start_test_run(conn, "looper", "fine")
    wait_until(lambda: run_require(conn, run_id).status is RunStatus.SUCCEEDED, timeout=20)
    assert not any(e.payload.get("swept") for e in run_events(conn, run_id))


def test_a_settled_failed_run_has_its_compensable_effects_undone(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    model = scripted_model(
        """
        default:
          turns:
            - tool_use: {name: ticket_undoable, input: {title: "to be undone"}}
            - {text: done, delay_ms: 4000}
        """
    )
    worker(model.url, **FAST)
    run_id = start_test_run(conn, "writer", "file, then stall")
    # The ticket is filed and the run is thinking about its second turn.
    wait_until(lambda: any(r["turn"] == 1 for r in model.requests()), 20)
    conn.execute(
        "UPDATE dbos.workflow_status SET status = 'ERROR' WHERE workflow_uuid = %s",
        (str(run_id),),
    )
    run = _settled(conn, run_id)
    assert run.state["reason"] == "workflow_error"
    (original,) = [e for e in effect_list(conn, run_id=run_id) if e.compensates is None]
    key = original.key + ":compensate"
    assert [c["key"] for c in run.state["compensations"]] == [key]
    # Nobody waits for it: the relay delivers it on its own.
    wait_until(lambda: effect_require(conn, key).status.value == "succeeded", timeout=20)
    stats = httpx.get(f"{tickets.url}/_stats").json()
    assert (stats["created"], stats["closed"]) == (1, 1)


def test_a_run_whose_journal_no_longer_matches_the_code_is_settled(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    # A deploy that changes a run's step sequence under the same version: the replay meets
    # DBOSUnexpectedStepError, DBOS ends the workflow in ERROR, and the sweeper ends the run.
    model = scripted_model(
        """
        default:
          turns:
            - tool_use: {name: patient_ticket, input: {title: "needs a person"}}
            - text: done
        """
    )
    worker(model.url, hibernate_after_s=0.5, **FAST)
    run_id = start_test_run(conn, "writer", "wait for approval")
    wait_until(
        lambda: conn.execute(
            "SELECT 1 FROM dbos.workflow_status WHERE workflow_uuid = %s AND status = 'DELAYED'",
            (str(run_id),),
        ).fetchone(),
        timeout=20,
    )
    conn.execute(
        "UPDATE dbos.operation_outputs SET function_name = 'memory-load-v2' "
        "WHERE workflow_uuid = %s AND function_name = 'memory-load'",
        (str(run_id),),
    )
    # The approval's expiry wakes it; it replays and no longer matches.
    run = _settled(conn, run_id)
    assert (run.status, run.state["reason"]) == (RunStatus.FAILED, "workflow_error")
    assert run.state["error"]["type"] == "DBOSUnexpectedStepError"
    assert model.requests()[-1]["turn"] == 0  # the model was not asked again
    # Nobody can grant an approval for a run that has ended.
    (approval,) = approval_list(conn, run_id=run_id)
    assert approval.status.value == "cancelled"


def test_compensations_that_cannot_begin_do_not_keep_a_run_unsettled(conn: Conn) -> None:
    run, _ = run_create(conn, agent="writer", input={})
    run_transition(conn, run, RunStatus.PLANNING, "planning")

    def broken(conn: Conn, run_id: uuid.UUID) -> list[dict[str, Any]]:
        conn.execute("SELECT 1")  # inside the savepoint, then a bug
        raise KeyError("ticket_undoable")

    verdict = Verdict(run.id, RunStatus.FAILED, "workflow_error", {"workflow_status": "ERROR"})
    assert run_settle(conn, verdict, broken)
    settled = run_require(conn, run.id)
    assert settled.status is RunStatus.FAILED
    assert settled.state["compensation_error"]["type"] == "KeyError"
    # Settled once: a second pass finds it finished.
    assert not run_settle(conn, verdict, broken)
