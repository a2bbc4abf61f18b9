"""`ledgerloop db upgrade` and the schema check that `ledgerloop up` runs first.

Both cover three things: DBOS's schema (its migrations), Ledgerloop's (alembic), and
Ledgerloop's objects on DBOS's tables (db/dbos_objects.py), which a DBOS migration may drop at
any time and `db upgrade` re-creates.

Upgrades take a session-level advisory lock and wait for it: five processes upgrading at once
queue up and the later ones find nothing to do. There is deliberately no "proceed without the
lock" fallback; a migration racing another is how schemas get corrupted.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from ledgerloop.db.connect import Conn, connect
from ledgerloop.db.dbos_objects import dbos_objects_install, dbos_objects_problems
from ledgerloop.db.errors import DatabasePrivilegeError, SchemaOutdated, translated
from ledgerloop.db.pooling import PoolerNeedsDirectUrl, engine_connect_args, route
from ledgerloop.db.roles import scope_role_install, scope_state
from ledgerloop.db.sql import load_queries
from ledgerloop.db.url import sqlalchemy_url

Q = load_queries("ledgerloop.db", "install.sql")


def _migrations_dir() -> Path:
    """Inside an installed package, the copy of migrations/ shipped as
    `ledgerloop._migrations` (setup.py); in a checkout, the repository's migrations/."""
    here = Path(__file__).resolve()
    shipped = here.parents[1] / "_migrations"
    if (shipped / "env.py").is_file():
        return shipped
    return here.parents[3] / "migrations"


MIGRATIONS_DIR = _migrations_dir()
LOCK_KEY = 0x4C4C_4D49  # "LLMI": one constant key, so every upgrader contends for one lock
SCHEMA = "ledgerloop"


@dataclass(frozen=True)
class SchemaState:
    dbos_current: int
    dbos_latest: int
    ours_current: str | None
    ours_head: str
    #: Ledgerloop's objects on DBOS's tables that are missing or not current, in words.
    dbos_objects: tuple[str, ...] = ()

    @property
    def migrated(self) -> bool:
        return self.dbos_current >= self.dbos_latest and self.ours_current == self.ours_head

    @property
    def up_to_date(self) -> bool:
        return self.migrated and not self.dbos_objects

    def describe(self) -> str:
        versions = (
            f"dbos {self.dbos_current}/{self.dbos_latest}, "
            f"ledgerloop {self.ours_current or 'none'}/{self.ours_head}"
        )
        return "; ".join([versions, *self.dbos_objects])


def _alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def _head() -> str:
    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None
    return head


def schema_state(url: str) -> SchemaState:
    """What is installed in the database against what this code expects."""
    from dbos._migration import get_migration_versions

    engine = sa.create_engine(
        sqlalchemy_url(url), poolclass=sa.NullPool, connect_args=engine_connect_args(url)
    )
    try:
        with translated(url, "reading the schema version"):
            dbos_current, dbos_latest = get_migration_versions(engine, "dbos", True)
            with engine.connect() as conn:
                ours = MigrationContext.configure(
                    conn, opts={"version_table_schema": SCHEMA}
                ).get_current_revision()
    finally:
        engine.dispose()
    objects: list[str] = []
    if ours is not None:  # before Ledgerloop's migrations there is nothing of ours to check
        with (
            translated(url, "checking ledgerloop's objects on dbos's tables"),
            connect(url, autocommit=True) as conn,
        ):
            objects = dbos_objects_problems(conn)
            if ours == _head():  # the scope role's function came with migration 0024
                scope = scope_state(conn).problem()
                objects += [scope] if scope else []
    return SchemaState(dbos_current, dbos_latest, ours, _head(), tuple(objects))


def ensure_current(url: str) -> None:
    """Refuse to run on an outdated schema, naming the command that fixes it."""
    state = schema_state(url)
    if not state.up_to_date:
        raise SchemaOutdated(
            f"the database schema is not current ({state.describe()})",
            fix="run `ledgerloop db upgrade`",
        )


#: After this long waiting for the migration lock, say who holds it (once).
LOCK_WAIT_SAY_S = 5.0


def _wait_for_lock(conn: Conn, say: Callable[[str], None]) -> None:
    """Wait for the migration lock by polling pg_try_advisory_lock.

    A blocking pg_advisory_lock would keep a snapshot open while it waits, and DBOS's
    CREATE INDEX CONCURRENTLY migrations wait for every older snapshot: the holder and the
    waiters would then wait on each other forever. A wait that lasts says once who holds the
    lock: a lock left on a pooled server connection once made every later upgrade wait,
    silently, for as long as that server connection lived.
    """
    started = time.monotonic()
    said = False
    while True:
        row = conn.execute("SELECT pg_try_advisory_lock(%s) AS locked", (LOCK_KEY,)).fetchone()
        if row and row["locked"]:
            return
        if not said and time.monotonic() - started >= LOCK_WAIT_SAY_S:
            said = True
            say(_lock_holder(conn))
        time.sleep(0.1)


def install_refusal(conn: Conn) -> DatabasePrivilegeError | None:
    """Why this connection's role cannot install or upgrade the schemas, or None when it can.

    Checked before anything is written: DBOS's migrations commit one by one, so a role that
    fails half-way would leave schema dbos half there. The database owner passes (it may
    create schemas and owns what it created); no superuser or CREATEROLE is needed.
    """
    row = conn.execute(Q["install_privileges"]).fetchone()
    assert row is not None
    me, database = row["me"], row["database"]
    if row["missing"] and not row["may_create_schemas"]:
        return DatabasePrivilegeError(
            f"role {me} may not create schemas in database {database} (missing: CREATE on the "
            f"database), so it cannot create {' and '.join(row['missing'])}",
            fix=f"run `ledgerloop db upgrade` as the database's owner, or have it run "
            f'GRANT CREATE ON DATABASE "{database}" TO "{me}"',
        )
    not_mine = [*row["schemas_not_mine"], *row["objects_not_mine"]]
    if not_mine:
        return DatabasePrivilegeError(
            f"role {me} does not own {', '.join(not_mine)} (missing: ownership, which "
            "altering them needs)",
            fix="run `ledgerloop db upgrade` as the role that installed the schema (its owner)",
        )
    return None


def _refusal(url: str, conn: Conn) -> DatabasePrivilegeError | None:
    with translated(url, "checking the role's privileges"):
        return install_refusal(conn)


def _lock_holder(conn: Conn) -> str:
    row = conn.execute(
        "SELECT a.pid, a.application_name, a.client_addr::text AS client, a.state, "
        "extract(epoch FROM now() - a.backend_start)::int AS age_s "
        "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = 0 AND l.objid = %s "
        "AND l.objsubid = 1",
        (LOCK_KEY,),
    ).fetchone()
    if row is None:
        return "waiting for the migration lock (another `ledgerloop db upgrade` holds it)"
    return (
        f"waiting for the migration lock, held by backend pid {row['pid']} "
        f"({row['application_name'] or 'no application_name'}, from "
        f"{row['client'] or 'a local socket'}, {row['state']}, connected {row['age_s']} s "
        "ago); if no upgrade is running there, that session leaked the lock: end it with "
        f"SELECT pg_terminate_backend({row['pid']})"
    )


def upgrade_url(url: str) -> str:
    """Where `db upgrade` connects: the direct URL behind a transaction-mode pooler (its
    lock is a session lock, and the migrations are DDL in long transactions)."""
    found = route(url)
    if not found.pooled:
        return url
    if found.direct_url is None:
        raise PoolerNeedsDirectUrl(
            "ledgerloop db upgrade cannot run through a transaction-mode pooler: its "
            "migration lock is a session lock, which the pooler would leave on a server "
            "connection another client then holds",
            fix="set LEDGERLOOP_DIRECT_DATABASE_URL to a URL that reaches Postgres directly "
            "(or unset LEDGERLOOP_POOLER)",
        )
    return found.direct_url


def upgrade(url: str, say: Callable[[str], None] | None = None) -> bool:
    """Install or upgrade DBOS's schema and ours. Returns whether anything changed. Behind
    a transaction-mode pooler all of it runs on the direct URL (`upgrade_url`)."""
    from dbos import DBOS

    url = upgrade_url(url)
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))

    with connect(url, autocommit=True, application_name="ledgerloop-migrate") as lock_conn:
        with translated(url, "taking the migration lock"):
            _wait_for_lock(lock_conn, say)
        try:
            try:
                before = schema_state(url)
            except DatabasePrivilegeError as exc:
                # A role that may not even read the schema: name what it lacks, if we can.
                refusal = _refusal(url, lock_conn)
                if refusal is None:
                    raise
                raise refusal from exc
            if before.up_to_date:
                return False
            refusal = _refusal(url, lock_conn)
            if refusal is not None:
                raise refusal
            if not before.migrated:
                # DBOS logs each of its ~125 migrations at INFO; keep `db upgrade` to one line.
                logging.getLogger("dbos").setLevel(logging.WARNING)
                with translated(url, "migrating the dbos schema"):
                    DBOS.migrate(url, schema="dbos")
                engine = sa.create_engine(
                    sqlalchemy_url(url),
                    poolclass=sa.NullPool,
                    connect_args=engine_connect_args(url),
                )
                try:
                    with (
                        translated(url, "migrating the ledgerloop schema"),
                        engine.begin() as conn,
                    ):
                        cfg = _alembic_config()
                        cfg.attributes["connection"] = conn
                        command.upgrade(cfg, "head")
                finally:
                    engine.dispose()
            # After DBOS's migrations, which may have rebuilt the tables these sit on.
            with (
                translated(url, "installing ledgerloop's objects on dbos's tables"),
                connect(url, autocommit=True) as conn,
            ):
                dbos_objects_install(conn)
                scope = scope_role_install(conn).problem()
            if scope is not None:
                raise DatabasePrivilegeError(
                    f"the schema is installed, but {scope}",
                    fix="have a DBA run what `ledgerloop db roles --sql` prints, then run "
                    "`ledgerloop db upgrade` again; or run Ledgerloop as the database owner",
                )
            return True
        finally:
            lock_conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))
