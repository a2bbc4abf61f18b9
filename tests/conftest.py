"""Fixtures shared by every test that touches data: a real Postgres, a fresh database each."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOSClient

from ledgerloop.config import Settings, load_settings
from ledgerloop.db.connect import Conn, connect
from ledgerloop.db.pooling import is_pooled, register, session_url
from ledgerloop.models.script import parse_script
from ledgerloop.models.scripted_server import ScriptedModelServer
from ledgerloop.runs.states import TERMINAL
from ledgerloop.runs.store import Run, run_require
from ledgerloop.telemetry.content import CaptureMode
from ledgerloop.testing.pgbouncer import ENV_POOLER, PgBouncer, pgbouncer, pgbouncer_binary
from ledgerloop.testing.postgres import DatabaseFactory, PostgresServer, postgres_server, wait_until
from tests.support.telemetry import Captured, capture_telemetry

# A separate project with its own pytest configuration; tests/e2e/test_user_project.py runs it
# the way its owner would.
collect_ignore = ["user_project"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long tests first: with the suite spread over processes (scripts/test), one that
    starts last keeps every other process waiting for it."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


@pytest.fixture(scope="session")
def db_factory(pg_server: PostgresServer) -> Iterator[DatabaseFactory]:
    factory = DatabaseFactory(pg_server.admin_url)
    yield factory
    factory.close()


@pytest.fixture(scope="session")
def bouncer(pg_server: PostgresServer) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode in front of the test server (skips when not installed:
    scripts/install-pgbouncer). A small pool, so server connections pass between clients."""
    if pgbouncer_binary() is None:
        pytest.skip("pgbouncer is not installed (scripts/install-pgbouncer)")
    # The whole suite through it (LEDGERLOOP_TEST_POOLER) needs room for its concurrent
    # transactions: with 4, tests that hold several at once waited on the pooler.
    size = 20 if os.environ.get(ENV_POOLER) else 4
    with pgbouncer(pg_server.admin_url, pool_size=size) as running:
        yield running


@pytest.fixture
def direct_db_url(db_factory: DatabaseFactory) -> Iterator[str]:
    """A freshly migrated database of its own for this test, reached directly."""
    url = db_factory.create()
    yield url
    db_factory.drop(url)


@pytest.fixture
def db_url(direct_db_url: str, request: pytest.FixtureRequest) -> str:
    """This test's database URL. With LEDGERLOOP_TEST_POOLER=pgbouncer it runs through
    PgBouncer in transaction mode, with the direct URL registered beside it (as
    LEDGERLOOP_DIRECT_DATABASE_URL would), so the suite proves Ledgerloop through a pooler."""
    mode = os.environ.get(ENV_POOLER, "")
    if not mode:
        return direct_db_url
    if mode != "pgbouncer":
        raise pytest.UsageError(f"{ENV_POOLER}={mode!r}: the only pooler is 'pgbouncer'")
    running: PgBouncer = request.getfixturevalue("bouncer")
    pooled = running.pooled(direct_db_url)
    register(pooled, pooled=True, direct_url=direct_db_url)
    return pooled


def listen_url(url: str) -> str:
    """Where a test LISTENs on `url`'s database: its direct URL when `url` runs through the
    pooler (LEDGERLOOP_TEST_POOLER), which would drop the notifications."""
    return session_url(url) or url


@pytest.fixture
def conn(db_url: str) -> Iterator[Conn]:
    with connect(db_url, autocommit=True) as connection:
        yield connection


REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def dbos_client(db_url: str) -> Iterator[DBOSClient]:
    """DBOS's client on this test's database (for calls that need DBOS and no worker)."""
    from ledgerloop.control.timeline import dbos_client as make_client

    client = make_client(db_url)
    yield client
    client.destroy()


@pytest.fixture
def make_settings(db_url: str, tmp_path: Path) -> Callable[..., Settings]:
    """Settings for a worker on this test's database; keyword arguments override fields."""

    def make(**overrides: Any) -> Settings:
        base: dict[str, Any] = {
            "database_url": db_url,
            # Through the pooler (LEDGERLOOP_TEST_POOLER): its direct URL too.
            "direct_database_url": session_url(db_url) if is_pooled(db_url) else None,
            "home": tmp_path / ".ledgerloop",
            # Names every write tool of the test agents (a worker refuses unlisted ones).
            "policy_file": REPO / "tests" / "support" / "policy.yaml",
        }
        return load_settings(**{**base, **overrides})

    return make


@pytest.fixture
def scripted_model() -> Iterator[Callable[[str], ScriptedModelServer]]:
    """Start a scripted Messages API server from YAML text; stopped after the test."""
    servers: list[ScriptedModelServer] = []

    def start(text: str) -> ScriptedModelServer:
        server = ScriptedModelServer(parse_script(text)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


#: One write_ticket turn of the ops agent, then the answer (the write-path tests' script).
TICKET_SCRIPT = """
default:
  turns:
    - tool_use:
        name: write_ticket
        input: {title: "db-1 disk full", body: "extend", priority: high}
    - text: "Filed."
"""


@pytest.fixture
def captured() -> Iterator[Captured]:
    """Spans, metrics and logs of this test, content off (the default capture mode)."""
    yield from capture_telemetry(CaptureMode.NO_CONTENT)


def start_test_run(conn: Conn, agent: str, message: str, **input_extra: Any) -> uuid.UUID:
    from ledgerloop.runs.start import start_run

    return start_run(conn, agent=agent, input={"message": message, **input_extra})


def journal_steps(conn: Conn, run_id: uuid.UUID) -> list[str]:
    """The names of a run's journaled operations (its steps, DBOS's own records of its
    waits), in the order the workflow made them."""
    rows = conn.execute(
        "SELECT function_name FROM dbos.operation_outputs WHERE workflow_uuid = %s "
        "ORDER BY function_id",
        (str(run_id),),
    ).fetchall()
    return [row["function_name"] for row in rows]


def wait_terminal(conn: Conn, run_id: uuid.UUID, timeout: float = 30) -> Run:
    def done() -> Run | None:
        run = run_require(conn, run_id)
        return run if run.status in TERMINAL else None

    result = wait_until(done, timeout=timeout)
    assert isinstance(result, Run)
    # The status commits inside the run's last step; DBOS checkpoints that step and closes
    # the workflow a moment later. Wait for that too, so the journal and spans are complete.
    wait_until(
        lambda: conn.execute(
            "SELECT 1 FROM dbos.workflow_status WHERE workflow_uuid = %s "
            "AND status NOT IN ('PENDING', 'ENQUEUED')",
            (str(run_id),),
        ).fetchone(),
        timeout=timeout,
    )
    return result
