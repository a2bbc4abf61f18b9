"""Ledgerloop's triggers on DBOS's tables (the wake on dbos.notifications, the dispatch wake-ups
on dbos.workflow_status): the start-up check reports one missing or changed, `ledgerloop db
upgrade` re-creates it, and a broken one never stops a statement that is not about a Ledgerloop
run (a failed dispatch wake-up never stops even that: the slow poll finds the run)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from dbos import DBOS

from ledgerloop.config import load_settings
from ledgerloop.db.connect import Conn
from ledgerloop.db.dbos_objects import FUNCTIONS, dbos_objects_problems
from ledgerloop.db.dbos_objects import Q as OBJECTS
from ledgerloop.db.errors import SchemaOutdated
from ledgerloop.db.migrate import ensure_current, upgrade
from ledgerloop.runs.store import run_create
from ledgerloop.testing.worker import WorkerThread
from tests.conftest import REPO, listen_url

MISSING = "trigger ledgerloop_wake_hibernated on dbos.notifications is missing"


def _parked_run(conn: Conn, *, with_run: bool = True) -> str:
    """A Ledgerloop run whose workflow is parked (DELAYED) on a queue nobody listens to."""
    run_id = run_create(conn, agent="ops", input={})[0].id if with_run else uuid.uuid4()
    conn.execute(
        "SELECT dbos.enqueue_workflow('ledgerloop_run', 'll_idle', ARRAY[to_json(%(id)s::text)], "
        "workflow_id => %(id)s, delay_until_epoch_ms => %(far)s)",
        {"id": str(run_id), "far": int((time.time() + 3600) * 1000)},
    )
    return str(run_id)


def _status(conn: Conn, workflow_id: str) -> str:
    row = conn.execute(
        "SELECT status FROM dbos.workflow_status WHERE workflow_uuid = %s", (workflow_id,)
    ).fetchone()
    assert row is not None
    return str(row["status"])


def _send(conn: Conn, workflow_id: str) -> None:
    conn.execute("SELECT dbos.send_message(%s, to_json('m'::text), 't')", (workflow_id,))


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGERLOOP_", "ANTHROPIC_"))}
    env["LEDGERLOOP_DATABASE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "ledgerloop.cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_dropped_trigger_is_reported_and_repaired_by_db_upgrade(conn: Conn, db_url: str) -> None:
    ensure_current(db_url)
    conn.execute(OBJECTS["wake_trigger_drop"])
    # A parked run's message now wakes nothing: the run would sleep until its deadline.
    before = _parked_run(conn)
    _send(conn, before)
    assert _status(conn, before) == "DELAYED"
    with pytest.raises(SchemaOutdated, match=MISSING) as refused:
        ensure_current(db_url)
    assert "ledgerloop db upgrade" in str(refused.value.fix)

    status = _cli(db_url, "db", "status")
    assert MISSING in status.stdout, status
    upgraded = _cli(db_url, "db", "upgrade")
    assert upgraded.stdout.strip() == "schema upgraded", upgraded
    ensure_current(db_url)
    after = _parked_run(conn)
    _send(conn, after)
    assert _status(conn, after) == "ENQUEUED"


def test_a_changed_function_or_disabled_trigger_is_reported_and_repaired(
    conn: Conn, db_url: str
) -> None:
    assert dbos_objects_problems(conn) == []
    conn.execute(
        "CREATE OR REPLACE FUNCTION ledgerloop.wake_hibernated_run() RETURNS trigger "
        "LANGUAGE plpgsql SECURITY DEFINER AS $$ BEGIN RETURN NULL; END $$"
    )
    conn.execute("ALTER TABLE dbos.notifications DISABLE TRIGGER ledgerloop_wake_hibernated")
    assert dbos_objects_problems(conn) == [
        "function ledgerloop.wake_hibernated_run() differs from this release's",
        "trigger ledgerloop_wake_hibernated on dbos.notifications is disabled",
    ]
    assert upgrade(db_url) is True
    assert dbos_objects_problems(conn) == []
    assert upgrade(db_url) is False


def test_every_function_on_dbos_tables_catches_its_errors() -> None:
    # A trigger on DBOS's tables must never abort a statement that is not about a run.
    for function in FUNCTIONS:
        assert "EXCEPTION WHEN OTHERS" in function.source, function.name


@pytest.fixture
def broken_trigger(conn: Conn) -> None:
    """The wake function as a DBOS upgrade that renamed a column would leave it."""
    broken = OBJECTS["wake_function_create"].replace(
        "AND name = 'ledgerloop_run'", "AND workflow_name = 'ledgerloop_run'"
    )
    assert broken != OBJECTS["wake_function_create"]
    conn.execute(broken)  # type: ignore[call-overload]
    assert dbos_objects_problems(conn) == [
        "function ledgerloop.wake_hibernated_run() differs from this release's"
    ]


# A user's own DBOS workflows, sharing the database with Ledgerloop.
@DBOS.workflow(name="users_own_receiver")
def users_own_receiver() -> str:
    return str(DBOS.recv("t", 30))


@DBOS.workflow(name="users_own_sender")
def users_own_sender(destination: str) -> None:
    DBOS.send(destination, "hello from the user's workflow", "t")


@pytest.fixture
def dbos_launched(db_url: str, tmp_path: Path) -> Iterator[None]:
    settings = load_settings(
        database_url=db_url,
        home=tmp_path / ".ledgerloop",
        policy_file=REPO / "tool_policy.yaml",
        # The shipped policy names the example agent's tools: a worker refuses unknown ones.
        agent_modules="ledgerloop.examples.ops_agent",
        queue_poll_s=0.02,
        anthropic_base_url="http://127.0.0.1:9",
    )
    with WorkerThread(settings, db_url):
        yield


@pytest.mark.usefixtures("dbos_launched", "broken_trigger")
def test_a_broken_trigger_never_stops_a_users_own_send(conn: Conn, db_url: str) -> None:
    receiver = DBOS.start_workflow(users_own_receiver)
    sender = DBOS.start_workflow(users_own_sender, receiver.get_workflow_id())
    sender.get_result()
    assert receiver.get_result() == "hello from the user's workflow"
    # It says so, once per message, and lets the statement through.
    notices: list[tuple[str | None, str | None]] = []
    # A notice's fields are readable during the callback only.
    conn.add_notice_handler(lambda n: notices.append((n.severity, n.message_primary)))
    _send(conn, _parked_run(conn, with_run=False))
    [(severity, message)] = notices
    assert severity == "WARNING"
    assert "ledgerloop_wake_hibernated skipped a message" in str(message)


@pytest.mark.usefixtures("broken_trigger")
def test_a_broken_trigger_fails_a_send_to_a_ledgerloop_run_naming_the_fix(
    conn: Conn, db_url: str
) -> None:
    run_id = _parked_run(conn)
    with pytest.raises(psycopg.errors.RaiseException, match="could not wake run") as failed:
        _send(conn, run_id)
    assert "ledgerloop db upgrade" in str(failed.value.diag.message_hint)
    assert conn.execute(
        "SELECT count(*) AS n FROM dbos.notifications WHERE destination_uuid = %s", (run_id,)
    ).fetchone() == {"n": 0}
    upgrade(db_url)  # repaired: the send wakes the run
    _send(conn, run_id)
    assert _status(conn, run_id) == "ENQUEUED"


DISPATCH_MISSING = "trigger ledgerloop_run_enqueued_insert on dbos.workflow_status is missing"


def _enqueue_notifies(db_url: str, conn: Conn) -> bool:
    """Whether queueing a run on Ledgerloop's queue wakes a listener of 'ledgerloop_runs'."""
    with psycopg.connect(listen_url(db_url), autocommit=True) as listener:
        listener.execute("LISTEN ledgerloop_runs")
        conn.execute(
            "SELECT dbos.enqueue_workflow('ledgerloop_run', 'ledgerloop_runs', "
            "ARRAY[to_json(%(id)s::text)], workflow_id => %(id)s)",
            {"id": str(uuid.uuid4())},
        )
        return any(True for _ in listener.notifies(timeout=2, stop_after=1))


def test_a_dropped_dispatch_trigger_is_reported_and_repaired_by_db_upgrade(
    conn: Conn, db_url: str
) -> None:
    ensure_current(db_url)
    assert _enqueue_notifies(db_url, conn)
    conn.execute(OBJECTS["notify_insert_trigger_drop"])
    # A queued run now waits for the dispatchers' slow poll.
    assert not _enqueue_notifies(db_url, conn)
    with pytest.raises(SchemaOutdated, match=DISPATCH_MISSING):
        ensure_current(db_url)
    assert upgrade(db_url) is True
    assert dbos_objects_problems(conn) == []
    assert _enqueue_notifies(db_url, conn)


def test_a_failing_notification_never_fails_the_enqueue(conn: Conn, db_url: str) -> None:
    # pg_notify refuses an empty channel name: the error a full notify queue would raise.
    broken = OBJECTS["notify_function_create"].replace(
        "pg_notify('ledgerloop_runs', '')", "pg_notify('', '')"
    )
    assert broken != OBJECTS["notify_function_create"]
    conn.execute(broken)  # type: ignore[call-overload]
    notices: list[tuple[str | None, str | None]] = []
    conn.add_notice_handler(lambda n: notices.append((n.severity, n.message_primary)))
    workflow_id = str(uuid.uuid4())
    conn.execute(
        "SELECT dbos.enqueue_workflow('ledgerloop_run', 'ledgerloop_runs', "
        "ARRAY[to_json(%(id)s::text)], workflow_id => %(id)s)",
        {"id": workflow_id},
    )
    assert _status(conn, workflow_id) == "ENQUEUED"
    [(severity, message)] = notices
    assert severity == "WARNING"
    assert "could not notify the dispatchers" in str(message)
