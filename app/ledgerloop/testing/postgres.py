"""Where test databases come from, and how each test gets a fresh one fast.

Provider order: LEDGERLOOP_TEST_DATABASE_URL; else testcontainers' PostgresContainer when a
Docker engine answers (where the probe looks: testing/docker_engine.py) and testcontainers is
installed (the `ledgerloop[testing]` extra); else a throwaway cluster from local binaries.
Each test gets its own database cloned from a migrated template (CREATE DATABASE ... TEMPLATE
takes tens of ms, where migrating DBOS's 125 steps takes about a second).
"""

from __future__ import annotations

import itertools
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from ledgerloop.db.cluster import LocalCluster
from ledgerloop.db.migrate import upgrade
from ledgerloop.db.url import with_database
from ledgerloop.testing.docker_engine import find_docker_engine

ENV_URL = "LEDGERLOOP_TEST_DATABASE_URL"


@dataclass
class PostgresServer:
    """An admin URL on a server where tests may create and drop databases."""

    admin_url: str
    source: str
    cluster: LocalCluster | None = None


@contextmanager
def _docker_host(host: str) -> Iterator[None]:
    # testcontainers finds DOCKER_HOST and a context by itself, but not a rootless or Docker
    # Desktop socket: point it at the engine the probe found, for as long as the container lives.
    before = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = host
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = before


def _postgres_container() -> Any:
    """testcontainers' PostgresContainer, or None when testcontainers is not installed."""
    try:
        from testcontainers.postgres import PostgresContainer
    except ModuleNotFoundError:
        return None
    return PostgresContainer


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """Yield a server by the provider order above; stop it afterwards if we started it.

    Its `source` names the provider, and for the local cluster which Docker hosts did not
    answer, so a run that expected Docker says why it did without."""
    url = os.environ.get(ENV_URL)
    if url:
        yield PostgresServer(url, f"env ({ENV_URL})")
        return
    host, asked = find_docker_engine()
    container_class = _postgres_container() if host is not None else None
    if host is not None and container_class is not None:
        with (
            _docker_host(host),
            container_class("postgres:16-alpine", driver=None) as container,
        ):
            yield PostgresServer(container.get_connection_url(), f"testcontainers at {host}")
        return
    if host is not None:
        # The package alone does not bring testcontainers (the `testing` extra does): an engine
        # that answers is no reason to fail a user's run that local binaries can serve.
        why = (
            f"a Docker engine answered at {host}, but testcontainers is not installed; "
            "pip install 'ledgerloop[testing]' to use it"
        )
    elif asked:
        why = f"no Docker engine answered at {', '.join(asked)}"
    else:
        why = "no Docker engine found"
    with tempfile.TemporaryDirectory(prefix="ledgerloop-pg-") as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster")
        cluster.start()
        try:
            yield PostgresServer(cluster.url, f"local-cluster ({why})", cluster)
        finally:
            cluster.destroy()


class DatabaseFactory:
    """Creates migrated databases by cloning one template."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self._tag = uuid.uuid4().hex[:8]
        self._counter = itertools.count()
        self.template = f"ll_tpl_{self._tag}"
        self._execute(f'CREATE DATABASE "{self.template}"')
        upgrade(with_database(admin_url, self.template))

    def _execute(self, sql: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.encode())

    def create(self, *, migrated: bool = True) -> str:
        name = f"ll_{self._tag}_{next(self._counter)}"
        template = f' TEMPLATE "{self.template}"' if migrated else ""
        self._execute(f'CREATE DATABASE "{name}"{template}')
        url = with_database(self.admin_url, name)
        if migrated:
            # The scope role is named for its database (db/roles.py): a clone needs its own.
            from ledgerloop.db.roles import scope_role_install

            with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
                scope_role_install(conn)
        return url

    def drop(self, url: str) -> None:
        name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
        role = _scope_role(url)
        self._execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if role is not None:
            self._execute(f'DROP ROLE IF EXISTS "{role}"')

    def close(self) -> None:
        self.drop(with_database(self.admin_url, self.template))


def _scope_role(url: str) -> str | None:
    """The scope role a database's upgrade may have created, so dropping it leaves no role."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT ledgerloop.scope_role() WHERE to_regprocedure('ledgerloop.scope_role()') "
                "IS NOT NULL"
            ).fetchone()
    except psycopg.Error:
        return None
    return str(row[0]) if row else None


def wait_until(
    predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02
) -> object:
    """Poll `predicate` until it returns something truthy; fail with a clear message otherwise."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout}s: {predicate!r}")
        time.sleep(interval)
