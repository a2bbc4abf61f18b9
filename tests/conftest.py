"""Fixtures shared by every test that touches data: a real Postgres, a fresh database each."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.db.connect import Conn, connect
from app.testing.postgres import DatabaseFactory, PostgresServer, postgres_server


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


@pytest.fixture(scope="session")
def db_factory(pg_server: PostgresServer) -> Iterator[DatabaseFactory]:
    factory = DatabaseFactory(pg_server.admin_url)
    yield factory
    factory.close()


@pytest.fixture
def db_url(db_factory: DatabaseFactory) -> Iterator[str]:
    """A freshly migrated database of its own for this test."""
    url = db_factory.create()
    yield url
    db_factory.drop(url)


@pytest.fixture
def conn(db_url: str) -> Iterator[Conn]:
    with connect(db_url, autocommit=True) as connection:
        yield connection
