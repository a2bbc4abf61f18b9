"""Retention: `purge_finished` removes finished runs from both schemas and nothing else.

Real worker, real DBOS journals, real Postgres; the runs are made by running them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from dbos import DBOSClient
from psycopg import sql

from ledgerloop.approvals.store import approval_list
from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import effect_begin
from ledgerloop.retention.purge import PurgeClient, PurgeOptions, purge_finished
from ledgerloop.runs.start import start_run
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_create, run_get, run_require, run_transition
from ledgerloop.testing.postgres import wait_until
from tests.conftest import start_test_run, wait_terminal

SCRIPT = """
conversations:
  - match: "finish"
    turns:
      - tool_use: {name: echo, input: {text: hi}}
      - text: "done"
  - match: "ticket"
    turns:
      - tool_use: {name: write_ticket, input: {title: "t", body: "b", priority: high}}
      - text: "filed"
"""

# Every table that holds a row per run, and the column naming the run.
LEDGERLOOP_TABLES = {
    "ledgerloop.agent_run": "id",
    "ledgerloop.agent_run_event": "run_id",
    "ledgerloop.agent_message": "run_id",
    "ledgerloop.agent_message_batch": "run_id",
    "ledgerloop.approval": "run_id",
}
DBOS_TABLES = {
    "dbos.workflow_status": "workflow_uuid",
    "dbos.workflow_input": "workflow_uuid",
    "dbos.workflow_output": "workflow_uuid",
    "dbos.operation_outputs": "workflow_uuid",
    "dbos.notifications": "destination_uuid",
}


def _rows(conn: Conn, run_id: uuid.UUID) -> dict[str, int]:
    counts = {}
    for table, column in {**LEDGERLOOP_TABLES, **DBOS_TABLES}.items():
        key: Any = run_id if table.startswith("ledgerloop") else str(run_id)
        schema, name = table.split(".")
        query = sql.SQL("SELECT count(*) AS n FROM {} WHERE {} = %s").format(
            sql.Identifier(schema, name), sql.Identifier(column)
        )
        row = conn.execute(query, (key,)).fetchone()
        assert row is not None
        counts[table] = row["n"]
    return counts


@pytest.fixture
def client(db_url: str) -> Iterator[DBOSClient]:
    purger = PurgeClient(db_url)
    yield purger.dbos
    purger.close()


def _finished(conn: Conn, n: int) -> list[uuid.UUID]:
    ids = [start_test_run(conn, "looper", f"finish {i} {uuid.uuid4()}") for i in range(n)]
    for run_id in ids:
        assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
    return ids


def _awaiting_approval(conn: Conn) -> uuid.UUID:
    run_id = start_test_run(conn, "ops", f"ticket {uuid.uuid4()}")
    wait_until(lambda: approval_list(conn, run_id=run_id, status="pending"), timeout=20)
    return run_id


def test_purge_deletes_old_finished_runs_from_both_schemas_only(
    conn: Conn, client: DBOSClient, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model(SCRIPT)
    worker(model.url)
    old = _finished(conn, 3)
    waiting = _awaiting_approval(conn)
    cutoff = datetime.now(UTC)
    new = _finished(conn, 2)
    before = {run_id: _rows(conn, run_id) for run_id in [*old, waiting, *new]}
    # What a finished run leaves behind in each table, so "0 after" means something.
    assert all(
        before[old[0]][t] > 0 for t in ("dbos.operation_outputs", "ledgerloop.agent_message_batch")
    )
    assert before[waiting]["ledgerloop.approval"] == 1

    report = purge_finished(conn, client, cutoff)

    assert report.runs == 3
    for run_id in old:
        assert set(_rows(conn, run_id).values()) == {0}, run_id
    for run_id in [waiting, *new]:
        assert _rows(conn, run_id) == before[run_id]
    assert run_require(conn, waiting).status is RunStatus.AWAITING_APPROVAL
    # Nothing left to do: a second pass purges nothing.
    assert purge_finished(conn, client, cutoff).runs == 0


def test_keep_audit_drops_journals_and_keeps_history(
    conn: Conn, client: DBOSClient, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model(SCRIPT)
    worker(model.url)
    (run_id,) = _finished(conn, 1)
    events = _rows(conn, run_id)["ledgerloop.agent_run_event"]

    report = purge_finished(conn, client, datetime.now(UTC), PurgeOptions(keep_audit=True))

    assert report.runs == 1
    rows = _rows(conn, run_id)
    assert rows["ledgerloop.agent_run"] == 1
    assert rows["ledgerloop.agent_run_event"] == events > 0
    assert rows["ledgerloop.agent_message_batch"] == 0
    assert all(rows[table] == 0 for table in DBOS_TABLES)
    assert run_require(conn, run_id).status is RunStatus.SUCCEEDED
    # Already stripped: the journal pass skips it; the full pass deletes the rest.
    assert purge_finished(conn, client, datetime.now(UTC), PurgeOptions(keep_audit=True)).runs == 0
    assert purge_finished(conn, client, datetime.now(UTC)).runs == 1
    assert run_get(conn, run_id) is None


def test_a_run_with_an_unsettled_effect_is_kept(conn: Conn, client: DBOSClient) -> None:
    run, _ = run_create(conn, agent="writer", input={})
    with conn.transaction():
        effect_begin(
            conn,
            key=f"{run.id}:call-1",
            run_id=run.id,
            tenant_id=run.tenant_id,
            tool="ticket_plain",
            request_hash="h",
            destination="tickets",
            request={"path": "/plain/tickets"},
        )
        run_transition(conn, run, RunStatus.FAILED, "failed", {"reason": "test"})
    other, _ = run_create(conn, agent="writer", input={})
    run_transition(conn, other, RunStatus.CANCELLED, "cancelled", {})

    report = purge_finished(conn, client, datetime.now(UTC))

    assert (report.runs, report.skipped_unsettled) == (1, 1)
    assert run_get(conn, run.id) is not None
    assert run_get(conn, other.id) is None


def test_small_batches_cover_every_run(conn: Conn, client: DBOSClient) -> None:
    ids = []
    for _ in range(7):
        run, _ = run_create(conn, agent="looper", input={})
        run_transition(conn, run, RunStatus.CANCELLED, "cancelled", {})
        ids.append(run.id)

    options = PurgeOptions(batch_size=2, min_batch_size=2, max_batch_size=2)
    report = purge_finished(conn, client, datetime.now(UTC), options)

    assert report.runs == 7
    assert report.batches == 4
    assert all(run_get(conn, run_id) is None for run_id in ids)


def test_a_worker_purges_continuously_when_retention_is_set(
    conn: Conn, client: DBOSClient, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model(SCRIPT)
    worker(model.url, purge_runs_after="1s", purge_interval_s=0.2)
    (run_id,) = _finished(conn, 1)
    waiting = _awaiting_approval(conn)

    wait_until(lambda: run_get(conn, run_id) is None, timeout=30)

    assert set(_rows(conn, run_id).values()) == {0}
    assert run_require(conn, waiting).status is RunStatus.AWAITING_APPROVAL


def test_a_purged_run_takes_its_child_episodes_with_it(
    conn: Conn, client: DBOSClient, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model(
        'default:\n  turns:\n    - text: \'{"cause": "the pool", "severity": "high"}\'\n'
    )
    worker(model.url, agent_modules="tests.support.agents,tests.support.episode_agents")
    run_id = start_run(
        conn, agent="episode_parent", input={"message": "why?", "budget": {"turns": 2}}
    )
    assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
    episode = f"{run_id}.episode-0"
    before = _dbos_rows(conn, episode)
    assert before["dbos.workflow_status"] == 1
    assert before["dbos.operation_outputs"] == 1  # the child's think step

    assert purge_finished(conn, client, datetime.now(UTC)).runs == 1

    assert set(_dbos_rows(conn, episode).values()) == {0}
    assert set(_rows(conn, run_id).values()) == {0}


def _dbos_rows(conn: Conn, workflow_id: str) -> dict[str, int]:
    counts = {}
    for table, column in DBOS_TABLES.items():
        schema, name = table.split(".")
        query = sql.SQL("SELECT count(*) AS n FROM {} WHERE {} = %s").format(
            sql.Identifier(schema, name), sql.Identifier(column)
        )
        row = conn.execute(query, (workflow_id,)).fetchone()
        assert row is not None
        counts[table] = row["n"]
    return counts
