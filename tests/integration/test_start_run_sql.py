"""ledgerloop.start_run: one run, its first event and its DBOS workflow, in the caller's
transaction; and the trigger example of docs/sql_start_run.md, run as written."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dbos import DBOSClient

from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db.connect import Conn, connect, tenant_scope
from ledgerloop.runs.start import InvalidRunInput, UnknownRole, grant_start_run, start_run
from ledgerloop.runs.store import run_create, run_events, run_get, run_list
from tests.conftest import listen_url

DOC = Path(__file__).resolve().parents[2] / "docs" / "sql_start_run.md"
LIMIT = 262144


def _workflow(conn: Conn, run_id: uuid.UUID) -> dict[str, Any] | None:
    return conn.execute(
        """
        SELECT s.status, s.name, s.queue_name, s.serialization, s.application_version,
               i.inputs
        FROM dbos.workflow_status s LEFT JOIN dbos.workflow_input i USING (workflow_uuid)
        WHERE s.workflow_uuid = %s
        """,
        (str(run_id),),
    ).fetchone()


def _counts(conn: Conn) -> tuple[int, int, int, int]:
    row = conn.execute(
        """
        SELECT (SELECT count(*) FROM ledgerloop.agent_run) AS runs,
               (SELECT count(*) FROM ledgerloop.agent_run_event) AS events,
               (SELECT count(*) FROM dbos.workflow_status) AS workflows,
               (SELECT count(*) FROM dbos.workflow_input) AS inputs
        """
    ).fetchone()
    assert row is not None
    return row["runs"], row["events"], row["workflows"], row["inputs"]


def test_start_run_creates_run_event_and_portable_workflow(conn: Conn, db_url: str) -> None:
    run_id = start_run(conn, agent="ops_agent", input={"message": "disk full"})

    assert isinstance(run_id, uuid.UUID)
    run = run_get(conn, run_id)
    assert run is not None
    assert (run.agent, run.status.value, run.version) == ("ops_agent", "received", 0)
    assert (run.tenant_id, run.input, run.state) == (DEFAULT_TENANT, {"message": "disk full"}, {})
    assert [(e.sequence, e.event_type, e.payload) for e in run_events(conn, run_id)] == [
        (0, "received", {"agent": "ops_agent"})
    ]
    wf = _workflow(conn, run_id)
    assert wf is not None
    assert (wf["status"], wf["name"], wf["queue_name"]) == (
        "ENQUEUED",
        "ledgerloop_run",
        "ledgerloop_runs",
    )
    assert wf["serialization"] == "portable_json"
    assert wf["application_version"] is None
    assert json.loads(wf["inputs"]) == {"positionalArgs": [str(run_id)], "namedArgs": {}}

    # DBOS itself reads the row as a call ledgerloop_run("<run id>").
    client = DBOSClient(system_database_url=db_url)
    try:
        [status] = client.list_workflows(workflow_ids=[str(run_id)], load_input=True)
    finally:
        client.destroy()
    assert status.status == "ENQUEUED"
    assert status.input == {"args": (str(run_id),), "kwargs": {}}


def test_application_version_setting_pins_the_workflow(conn: Conn) -> None:
    conn.execute("SET ledgerloop.application_version = 'ledgerloop-7'")
    run_id = start_run(conn, agent="ops", input={})
    wf = _workflow(conn, run_id)
    assert wf is not None
    assert wf["application_version"] == "ledgerloop-7"


def test_rollback_leaves_no_run_event_or_workflow(conn: Conn) -> None:
    before = _counts(conn)
    with conn.transaction():  # psycopg.Rollback leaves the block quietly
        run_id = start_run(conn, agent="ops", input={"a": 1})
        assert run_get(conn, run_id) is not None  # visible inside the transaction
        raise psycopg.Rollback
    assert _counts(conn) == before
    assert run_get(conn, run_id) is None
    assert _workflow(conn, run_id) is None


def test_sql_call_commits_with_the_callers_own_rows(db_url: str) -> None:
    with connect(db_url) as conn:  # not autocommit: one explicit transaction
        conn.execute("CREATE TABLE public.tickets (id int PRIMARY KEY, subject text)")
        conn.commit()
        conn.execute("INSERT INTO public.tickets VALUES (1, 'kept')")
        kept = conn.execute(
            "SELECT ledgerloop.start_run('ops', '{\"ticket\": 1}'::jsonb, 'ticket:1') AS id"
        ).fetchone()
        conn.commit()
        conn.execute("INSERT INTO public.tickets VALUES (2, 'dropped')")
        dropped = conn.execute(
            "SELECT ledgerloop.start_run('ops', '{\"ticket\": 2}'::jsonb, 'ticket:2') AS id"
        ).fetchone()
        conn.rollback()
        assert kept is not None
        assert dropped is not None
        assert run_get(conn, kept["id"]) is not None
        assert _workflow(conn, kept["id"]) is not None
        assert run_get(conn, dropped["id"]) is None
        assert _workflow(conn, dropped["id"]) is None
        assert conn.execute("SELECT id FROM public.tickets").fetchall() == [{"id": 1}]


def test_same_key_returns_the_same_run_and_enqueues_once(conn: Conn) -> None:
    first = start_run(conn, agent="ops", input={"n": 1}, idempotency_key="order:7")
    again = start_run(conn, agent="ops", input={"n": 1}, idempotency_key="order:7")
    other = start_run(conn, agent="ops", input={"n": 1}, idempotency_key="order:8")
    assert again == first
    assert other != first
    assert _counts(conn) == (2, 2, 2, 2)


def test_the_key_is_scoped_per_tenant(conn: Conn) -> None:
    tenant_a, tenant_b = uuid.uuid4(), uuid.uuid4()
    run_a = start_run(conn, agent="ops", input={}, idempotency_key="k", tenant_id=tenant_a)
    run_b = start_run(conn, agent="ops", input={}, idempotency_key="k", tenant_id=tenant_b)
    assert run_a != run_b
    assert start_run(conn, agent="ops", input={}, idempotency_key="k", tenant_id=tenant_b) == run_b


def test_key_reused_by_a_python_created_run_does_not_enqueue(conn: Conn) -> None:
    # A run made by run_create has no workflow; start_run with its key must return it and
    # must not enqueue one behind its creator's back.
    run, _ = run_create(conn, agent="ops", input={}, idempotency_key="shared")
    assert start_run(conn, agent="ops", input={}, idempotency_key="shared") == run.id
    assert _workflow(conn, run.id) is None


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"agent": "", "input": {}}, "agent '' is not a valid agent name"),
        ({"agent": "Ops", "input": {}}, "agent 'Ops' is not a valid agent name"),
        ({"agent": "1ops", "input": {}}, "is not a valid agent name"),
        ({"agent": "ops agent", "input": {}}, "is not a valid agent name"),
        ({"agent": "ops\n", "input": {}}, "is not a valid agent name"),
        ({"agent": "a" * 65, "input": {}}, "is not a valid agent name"),
        ({"agent": "ops", "input": [1, 2]}, "input must be a JSON object, not array"),
        ({"agent": "ops", "input": "text"}, "input must be a JSON object, not string"),
        ({"agent": "ops", "input": 3}, "input must be a JSON object, not number"),
        ({"agent": "ops", "input": None}, "input must be a JSON object, not null"),
        (
            {"agent": "ops", "input": {"x": "a" * LIMIT}},
            f"input is {LIMIT + 9} bytes, over the 262144-byte (256 KiB) limit",
        ),
        (
            {"agent": "ops", "input": {}, "idempotency_key": ""},
            "idempotency_key must be 1-255 characters",
        ),
        (
            {"agent": "ops", "input": {}, "idempotency_key": "k" * 256},
            "idempotency_key must be 1-255 characters",
        ),
    ],
)
def test_invalid_arguments_raise_invalid_run_input(
    conn: Conn, kwargs: dict[str, Any], problem: str
) -> None:
    with pytest.raises(InvalidRunInput) as info:
        start_run(conn, **kwargs)
    assert problem in info.value.message
    assert info.value.fix  # the SQL HINT names the fix
    assert not info.value.retryable
    assert info.value.status_code == 422
    assert _counts(conn) == (0, 0, 0, 0)


def test_agent_name_limits_are_inclusive(conn: Conn) -> None:
    assert start_run(conn, agent="a", input={})
    assert start_run(conn, agent="a" + "b-_9" * 15 + "xyz", input={})  # 64 characters


def test_input_size_limit_is_inclusive(conn: Conn) -> None:
    # jsonb prints {"x": "..."}: 9 characters around the value.
    at_limit = {"x": "a" * (LIMIT - 9)}
    assert start_run(conn, agent="ops", input=at_limit)
    with pytest.raises(InvalidRunInput, match="262145 bytes"):
        start_run(conn, agent="ops", input={"x": "a" * (LIMIT - 8)})


def test_invalid_input_has_its_own_sqlstate_in_sql(conn: Conn) -> None:
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT ledgerloop.start_run('ops', '[]'::jsonb)")
    assert info.value.sqlstate == "LL001"
    assert info.value.diag.message_hint


def test_runs_are_isolated_by_tenant(conn: Conn) -> None:
    tenant_a, tenant_b = uuid.uuid4(), uuid.uuid4()
    run_a = start_run(conn, agent="ops", input={"who": "a"}, tenant_id=tenant_a)
    run_b = start_run(conn, agent="ops", input={"who": "b"}, tenant_id=tenant_b)
    with tenant_scope(conn, tenant_a):
        assert [r.id for r in run_list(conn)] == [run_a]
        assert run_get(conn, run_b) is None
        assert run_events(conn, run_b) == []
    with tenant_scope(conn, tenant_b):
        assert [r.id for r in run_list(conn)] == [run_b]
        assert run_get(conn, run_a) is None


def test_tenant_defaults_to_the_transactions_scope(conn: Conn) -> None:
    tenant = uuid.uuid4()
    with conn.transaction():
        conn.execute("SELECT set_config('ledgerloop.tenant_id', %s, true)", (str(tenant),))
        run_id = start_run(conn, agent="ops", input={})
        # The inner transaction is a savepoint, so the outer one survives the error.
        with (
            pytest.raises(InvalidRunInput, match="differs from this transaction's tenant"),
            conn.transaction(),
        ):
            start_run(conn, agent="ops", input={}, tenant_id=uuid.uuid4())
    run = run_get(conn, run_id)
    assert run is not None
    assert run.tenant_id == tenant


def test_commit_notifies_workers_and_rollback_does_not(conn: Conn, db_url: str) -> None:
    with connect(listen_url(db_url), autocommit=True) as listener:
        listener.execute("LISTEN ledgerloop_runs")
        with conn.transaction():  # psycopg.Rollback leaves the block quietly
            start_run(conn, agent="ops", input={})
            raise psycopg.Rollback
        committed = start_run(conn, agent="ops", input={})
        got = [n.payload for n in listener.notifies(timeout=5, stop_after=2)]
    # Notifications are delivered in commit order: the rolled-back run's never arrives first.
    # The committed transaction sends two: the queue's trigger (empty payload, migration
    # 0016, for every run queued) and start_run's own with the run's id.
    assert got == ["", str(committed)]


def _doc_example(name: str) -> list[str]:
    blocks = re.findall(r"```sql\n(.*?)```", DOC.read_text(), flags=re.S)
    found = [b for b in blocks if b.startswith(f"-- example: {name}\n")]
    assert found, f"docs/sql_start_run.md has no ```sql block starting '-- example: {name}'"
    return found


def test_doc_trigger_starts_one_run_per_row_and_rolls_back_with_the_insert(
    conn: Conn,
) -> None:
    for block in _doc_example("orders-trigger"):
        conn.execute(block.encode())

    conn.execute(
        "INSERT INTO public.orders (customer, note) "
        "VALUES ('acme', 'late'), ('globex', 'damaged'), ('initech', NULL)"
    )
    orders = conn.execute("SELECT id, customer FROM public.orders ORDER BY id").fetchall()
    runs = {r.idempotency_key: r for r in run_list(conn, agent="order_triage")}
    assert set(runs) == {f"order:{o['id']}" for o in orders}
    for order in orders:
        run = runs[f"order:{order['id']}"]
        assert run.input["order_id"] == order["id"]
        assert run.input["customer"] == order["customer"]
        assert _workflow(conn, run.id) is not None
    assert _counts(conn) == (3, 3, 3, 3)

    with conn.transaction():  # psycopg.Rollback leaves the block quietly
        conn.execute("INSERT INTO public.orders (customer) VALUES ('umbrella'), ('hooli')")
        assert len(run_list(conn, agent="order_triage")) == 5
        raise psycopg.Rollback
    assert _counts(conn) == (3, 3, 3, 3)


# -- an application role: `ledgerloop db grant ROLE` ------------------------------------------


@pytest.fixture
def app_role(conn: Conn) -> Iterator[str]:
    """A fresh non-superuser role, dropped (with its grants) after the test."""
    role = f"ll_app_{uuid.uuid4().hex[:8]}"
    conn.execute(f'CREATE ROLE "{role}" NOSUPERUSER NOLOGIN')  # type: ignore[arg-type]
    yield role
    conn.execute(f'DROP OWNED BY "{role}"')  # type: ignore[arg-type]
    conn.execute(f'DROP ROLE "{role}"')  # type: ignore[arg-type]


def test_a_granted_application_role_starts_runs_in_its_own_transaction(
    conn: Conn, db_url: str, app_role: str
) -> None:
    tenant = uuid.UUID("00000000-0000-0000-0000-0000000000a1")
    grant_start_run(conn, app_role)
    grant_start_run(conn, app_role)  # idempotent
    conn.execute("CREATE TABLE public.tickets (id int PRIMARY KEY)")
    conn.execute(f'GRANT INSERT ON public.tickets TO "{app_role}"')  # type: ignore[arg-type]
    with connect(db_url) as app:  # not autocommit: the role's own transaction
        # SET LOCAL, each transaction: a session SET ROLE would stay on a pooled server
        # connection for the next client (LEDGERLOOP_TEST_POOLER).
        as_app = f'SET LOCAL ROLE "{app_role}"'
        app.execute(as_app)  # type: ignore[arg-type]
        app.execute("INSERT INTO public.tickets VALUES (1)")
        run_id = start_run(
            app, agent="ops", input={"ticket": 1}, idempotency_key="t:1", tenant_id=tenant
        )
        assert (
            start_run(
                app, agent="ops", input={"ticket": 1}, idempotency_key="t:1", tenant_id=tenant
            )
            == run_id
        )
        app.commit()
        app.execute(as_app)  # type: ignore[arg-type]
        app.execute("INSERT INTO public.tickets VALUES (2)")
        start_run(app, agent="ops", input={"ticket": 2}, tenant_id=tenant)
        app.rollback()  # neither the ticket nor its run
        app.execute(as_app)  # type: ignore[arg-type]
        # The grant lets it enqueue and nothing else on schema dbos: no messages to runs.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute(
                "SELECT dbos.send_message(%s, '{}'::json, 'approval:x', 'm-1')", (str(run_id),)
            )
        app.rollback()
    run = run_get(conn, run_id)
    assert run is not None
    assert run.tenant_id == tenant
    assert [e.event_type for e in run_events(conn, run_id)] == ["received"]
    assert _workflow(conn, run_id) is not None
    row = conn.execute("SELECT count(*) AS n FROM ledgerloop.agent_run").fetchone()
    assert row == {"n": 1}


def test_granting_an_unknown_role_names_it(conn: Conn) -> None:
    with pytest.raises(UnknownRole, match="no role nobody_here"):
        grant_start_run(conn, "nobody_here")
