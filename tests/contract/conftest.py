"""One database and one in-process worker for the whole contract module (DBOS launches once)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgerloop.config import load_settings
from ledgerloop.db.connect import Conn, connect
from ledgerloop.testing.postgres import DatabaseFactory
from ledgerloop.testing.worker import WorkerThread
from tests.conftest import REPO


@pytest.fixture(scope="module")
def contract_db(db_factory: DatabaseFactory) -> Iterator[str]:
    url = db_factory.create()
    yield url
    db_factory.drop(url)


@pytest.fixture(scope="module")
def contract_worker(contract_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A worker (DBOS launched in this process, queue `ledgerloop_runs`); yields its executor id.

    No model is ever called: the contract workflows are the test's own."""
    home: Path = tmp_path_factory.mktemp("contract") / ".ledgerloop"
    settings = load_settings(
        database_url=contract_db,
        home=home,
        policy_file=REPO / "tool_policy.yaml",
        agent_modules="ledgerloop.examples.ops_agent",
        anthropic_base_url="http://127.0.0.1:9",
        hibernate_after_s=0,
    )
    with WorkerThread(settings, contract_db):
        yield settings.executor_id


@pytest.fixture
def cconn(contract_db: str) -> Iterator[Conn]:
    with connect(contract_db, autocommit=True) as connection:
        yield connection
