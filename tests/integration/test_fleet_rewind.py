"""A database that went back in time under a live worker (fleet/heartbeat.py, the rewind
check; migration 0027). A real in-process worker; the database is made to say what a failover
to a lagging replica leaves behind, and the worker's heartbeat connection is cut, as the
failover cuts it.

- A run whose end was lost (its workflow PENDING again under the worker, which no longer
  executes it) is listed by `runs stuck`, and resumed from the journal once the heartbeat
  reconnects: it ends again, no model turn asked twice.
- A write recorded for a run the rewind check named is found again by its key: the ticket
  the downstream already holds under that key is found by the lookup, not created twice.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import psycopg

from ledgerloop.db.connect import Conn
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.fleet.views import runs_stuck
from ledgerloop.models.scripted_server import _digest, _text_of
from ledgerloop.runs.states import RunStatus
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.worker import WorkerThread
from tests.conftest import start_test_run, wait_terminal


def _cut_heartbeat(conn: Conn) -> None:
    """End the heartbeat's session, as a failover ends every session to the old primary."""
    wait_until(
        lambda: conn.execute(
            "SELECT pg_terminate_backend(pid) AS ended FROM pg_stat_activity "
            "WHERE application_name LIKE 'ledgerloop%heartbeat' AND datname = current_database()"
        ).fetchall(),
        timeout=10,
    )


def _workflow(conn: Conn, run_id: uuid.UUID) -> dict[str, Any]:
    row = conn.execute(
        "SELECT status, executor_id, owner_xid FROM dbos.workflow_status WHERE workflow_uuid = %s",
        (str(run_id),),
    ).fetchone()
    assert row is not None
    return dict(row)


def test_a_run_whose_end_was_lost_is_listed_then_resumed(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model("default: {turns: [{text: done}]}")
    thread: WorkerThread = worker(model.url, heartbeat_s=0.1, stale_after_s=1.0)
    run_id = start_test_run(conn, "looper", "the end is lost")
    assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
    wait_until(lambda: _workflow(conn, run_id)["status"] == "SUCCESS", timeout=10)
    assert len(model.requests()) == 1
    # What the new primary holds when the workflow's end did not reach it: PENDING, under
    # this live worker, claimed a while ago.
    conn.execute(
        "UPDATE dbos.workflow_status SET status = 'PENDING', "
        "started_at_epoch_ms = started_at_epoch_ms - 10000 WHERE workflow_uuid = %s",
        (str(run_id),),
    )
    conn.execute("DELETE FROM dbos.workflow_output WHERE workflow_uuid = %s", (str(run_id),))
    # With the run's own last move lost too (the run finished but its workflow PENDING is
    # listed as such already): the run looks under way.
    conn.execute("UPDATE ledgerloop.agent_run SET status = 'planning' WHERE id = %s", (run_id,))

    def listed() -> list[Any]:
        stuck = runs_stuck(conn, stale_after_s=1.0)
        return [s for s in stuck if s.run_id == run_id]

    (stuck,) = wait_until(listed, timeout=10)  # type: ignore[misc]
    assert stuck.problem == "pending, its live worker does not execute it"

    _cut_heartbeat(conn)
    # The heartbeat that lands again puts it back on the queue; it is claimed and replayed
    # from the journal to its end.
    wait_until(lambda: _workflow(conn, run_id)["status"] == "SUCCESS", timeout=20)
    # No longer PENDING under a worker that does not execute it (what this test made of the
    # run's own status stays for `runs stuck` to show).
    # (Listed once the disagreement has lasted stale_after_s: the run's end is committed a
    # moment before its workflow's.)
    wait_until(
        lambda: [s.problem for s in listed()] == ["run planning, workflow SUCCESS"], timeout=10
    )
    assert len(model.requests()) == 1  # every step answered from the journal
    assert thread.runtime is not None


def test_a_write_of_a_rewound_run_is_found_again_by_its_key(
    conn: Conn, scripted_model: Any, worker: Any, tickets: TicketServiceThread
) -> None:
    model = scripted_model(
        """
default:
  turns:
    - {tool_use: {name: ticket_lookup, input: {title: rewound}}, delay_ms: 1500}
    - {text: filed}
"""
    )
    worker(model.url)
    run_id = start_test_run(conn, "writer", "file it once")
    (asked,) = wait_until(model.requests, timeout=20)  # type: ignore[misc]
    # While the model answers: the key its call will carry, as the scripted server makes it.
    first_user = next(m for m in asked["request"]["messages"] if m["role"] == "user")
    conversation = _digest("conversation", _text_of(first_user["content"]))[:16]
    key = f"{run_id}:toolu_{_digest(conversation, 0, 0)[:24]}"
    # The ticket the old primary's relay delivered, whose record the failover lost; and the
    # rewind check's note that this run lost its recent past.
    created = httpx.post(
        f"{tickets.url}/lookup/tickets",
        json={"title": "rewound", "body": "filed by a test", "priority": "normal"},
        headers={"Idempotency-Key": key},
    )
    assert created.status_code == 201, created.text
    conn.execute("INSERT INTO ledgerloop.run_rewound (run_id) VALUES (%s)", (run_id,))

    assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
    # Found by the lookup, not sent again.
    assert httpx.get(f"{tickets.url}/_stats").json()["by_kind"]["lookup"] == 1
    row = conn.execute(
        "SELECT status, external_reference, evidence FROM ledgerloop.activity_effect "
        "WHERE idempotency_key = %s",
        (key,),
    ).fetchone()
    assert row is not None
    assert row["status"] == "succeeded"
    assert row["external_reference"] == created.json()["id"]
    assert "rewound" in row["evidence"]


def test_the_rewind_check_names_nothing_when_nothing_was_lost(
    conn: Conn, scripted_model: Any, worker: Any, db_url: str
) -> None:
    model = scripted_model("default: {turns: [{text: done}]}")
    worker(model.url, heartbeat_s=0.1, stale_after_s=1.0)
    run_id = start_test_run(conn, "looper", "nothing lost")
    assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
    _cut_heartbeat(conn)
    with psycopg.connect(db_url, autocommit=True) as other:
        wait_until(
            lambda: other.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name LIKE 'ledgerloop%heartbeat'"
            ).fetchone(),
            timeout=10,
        )
    assert conn.execute("SELECT count(*) AS n FROM ledgerloop.run_rewound").fetchone() == {"n": 0}
    assert _workflow(conn, run_id)["status"] == "SUCCESS"
