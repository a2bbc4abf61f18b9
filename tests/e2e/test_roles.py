"""The role boundary, tried as the roles themselves on a real cluster (docs/security.md).

A database `shop` owned by a role that is neither a superuser nor allowed to create roles;
that owner installs Ledgerloop, grants an application role, and runs the worker. The
application role then tries every table and function of both schemas, and a second
Ledgerloop database on the same cluster, and is refused everything but `start_run`.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import psycopg.errors
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from ledgerloop.db.connect import Conn, connect, tenant_scope
from ledgerloop.runs.start import start_run
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_get, run_list
from ledgerloop.testing.postgres import PostgresServer, wait_until
from ledgerloop.testing.processes import REPO, worker_env, worker_process

pytestmark = pytest.mark.e2e

PASSWORD = "shop-secret-1"
#: What a role given `ledgerloop db grant` may execute, and nothing else (docs/security.md).
GRANTED_FUNCTIONS = {"ledgerloop.start_run", "ledgerloop.run_traceparent"}


@dataclass(frozen=True)
class Shop:
    admin_url: str
    database: str
    owner: str
    app: str

    def url(self, role: str, database: str | None = None) -> str:
        info = psycopg.conninfo.conninfo_to_dict(self.admin_url)
        host, port = info.get("host") or "127.0.0.1", info.get("port") or "5432"
        return f"postgresql://{role}:{PASSWORD}@{host}:{port}/{database or self.database}"


def _admin(url: str, statement: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement.encode())


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledgerloop.cli", *args],
        env=worker_env(url),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )


def _new_database(shop: Shop, name: str) -> None:
    _admin(shop.admin_url, f'CREATE DATABASE "{name}" OWNER "{shop.owner}"')
    # A fresh database lets every role create in schema public (PG < 15); not ours to judge.
    result = _cli(shop.url(shop.owner, name), "db", "upgrade")
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def shop(pg_server: PostgresServer) -> Iterator[Shop]:
    tag = uuid.uuid4().hex[:8]
    shop = Shop(pg_server.admin_url, f"shop_{tag}", f"shop_owner_{tag}", f"shop_app_{tag}")
    admin = pg_server.admin_url
    _admin(
        admin,
        f'CREATE ROLE "{shop.owner}" LOGIN NOSUPERUSER NOCREATEROLE NOCREATEDB NOBYPASSRLS '
        f"PASSWORD '{PASSWORD}'",
    )
    _admin(admin, f"CREATE ROLE \"{shop.app}\" LOGIN NOSUPERUSER PASSWORD '{PASSWORD}'")
    _admin(admin, f'CREATE DATABASE "{shop.database}" OWNER "{shop.owner}"')
    try:
        yield shop
    finally:
        for database in (shop.database, f"{shop.database}_two"):
            _admin(admin, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        _admin(admin, f'DROP ROLE IF EXISTS "{shop.app}"')
        _admin(admin, f'DROP ROLE IF EXISTS "{shop.owner}"')


@pytest.fixture(scope="module")
def installed(shop: Shop) -> Shop:
    """The owner's own `db upgrade` and `db grant`: no superuser, no CREATEROLE."""
    upgraded = _cli(shop.url(shop.owner), "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    assert upgraded.stdout.strip() == "schema upgraded"
    granted = _cli(shop.url(shop.owner), "db", "grant", shop.app)
    assert granted.returncode == 0, granted.stderr
    status = _cli(shop.url(shop.owner), "db", "status")
    assert "current" in status.stdout, status.stdout
    assert "outdated" not in status.stdout, status.stdout
    roles = _cli(shop.url(shop.owner), "db", "roles")
    assert f"{shop.owner} does not need the scope role" in roles.stdout, roles.stdout
    return shop


def _as(url: str) -> Conn:
    return psycopg.connect(url, row_factory=dict_row)


def test_the_owner_installs_grants_and_runs_a_worker(
    installed: Shop, scripted_model: Any, tmp_path: Path
) -> None:
    shop = installed
    with connect(shop.url(shop.owner), autocommit=True) as owner:
        row = owner.execute(
            "SELECT rolsuper, rolcreaterole, rolbypassrls FROM pg_roles WHERE rolname = %s",
            (shop.owner,),
        ).fetchone()
        assert row == {"rolsuper": False, "rolcreaterole": False, "rolbypassrls": False}
        # No role was created for the install: the cluster has no role named for Ledgerloop.
        made = owner.execute(
            "SELECT rolname FROM pg_roles WHERE rolname LIKE 'ledgerloop%%' AND rolname LIKE %s",
            (f"%{shop.database}%",),
        ).fetchall()
        assert made == []
    model = scripted_model("default:\n  turns:\n    - text: all done\n")
    env = worker_env(
        shop.url(shop.owner),
        ANTHROPIC_BASE_URL=model.url,
        LEDGERLOOP_AGENT_MODULES="tests.support.agents",
        LEDGERLOOP_POLICY_FILE=str(REPO / "tests" / "support" / "policy.yaml"),
    )
    # The application starts the run from its own transaction, as its own role.
    with _as(shop.url(shop.app)) as app:
        run_id = start_run(app, agent="looper", input={"message": "hi"}, idempotency_key="o:1")
        app.commit()
    with (
        worker_process(env, log=tmp_path / "up.log"),
        connect(shop.url(shop.owner), autocommit=True) as owner,
    ):

        def finished() -> bool:
            run = run_get(owner, run_id)
            return run is not None and run.status is RunStatus.SUCCEEDED

        wait_until(finished, timeout=60)


def test_tenant_scopes_bind_the_owner_without_a_role(installed: Shop) -> None:
    shop = installed
    tenant_a, tenant_b = uuid.uuid4(), uuid.uuid4()
    with connect(shop.url(shop.owner), autocommit=True) as owner:
        run_a = start_run(owner, agent="ops", input={"who": "a"}, tenant_id=tenant_a)
        run_b = start_run(owner, agent="ops", input={"who": "b"}, tenant_id=tenant_b)
        with tenant_scope(owner, tenant_a):
            assert run_a in [r.id for r in run_list(owner)]
            assert run_get(owner, run_b) is None
            # Writing another tenant's row is refused by the policy's check, not just hidden.
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
                owner.execute(
                    "INSERT INTO ledgerloop.agent_run_event (run_id, tenant_id, sequence, "
                    "event_type) VALUES (%s, %s, 99, 'forged')",
                    (run_b, tenant_b),
                )
        with tenant_scope(owner, tenant_b):
            assert run_get(owner, run_a) is None
        # Outside a scope (a worker), every tenant's rows.
        assert run_get(owner, run_a) is not None
        assert run_get(owner, run_b) is not None


def _relations(conn: Conn) -> list[dict[str, Any]]:
    return conn.execute(
        """
        SELECT n.nspname AS schema, c.relname AS name, c.relkind AS kind,
               (SELECT a.attname FROM pg_attribute a
                WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                ORDER BY a.attnum LIMIT 1) AS first_column
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname IN ('dbos', 'ledgerloop') AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
        ORDER BY 1, 2
        """
    ).fetchall()


def _functions(conn: Conn) -> list[dict[str, Any]]:
    return conn.execute(
        """
        SELECT p.oid, n.nspname || '.' || p.proname AS name, p.prokind AS kind,
               ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) AS t) AS args
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname IN ('dbos', 'ledgerloop')
        ORDER BY 2
        """
    ).fetchall()


def _refused(app: Conn, statement: sql.Composable) -> str | None:
    """None when `statement` is refused for lack of a privilege; else what happened."""
    try:
        app.execute(statement)
    except psycopg.errors.InsufficientPrivilege:
        app.rollback()
        return None
    except psycopg.Error as exc:
        app.rollback()
        return f"{statement.as_string(app)}: {type(exc).__name__}: {exc}"
    app.rollback()
    return f"{statement.as_string(app)}: allowed"


def test_the_application_role_can_start_runs_and_nothing_else(installed: Shop) -> None:
    shop = installed
    with connect(shop.url(shop.owner), autocommit=True) as owner:
        relations, functions = _relations(owner), _functions(owner)
        run_id = start_run(owner, agent="ops", input={"secret": "s3"})
    # Both schemas are there to try.
    assert len(relations) > 15
    assert len(functions) > 15
    problems: list[str] = []
    with _as(shop.url(shop.app)) as app:
        for rel in relations:
            table = sql.Identifier(rel["schema"], rel["name"])
            statements = [sql.SQL("SELECT * FROM {} LIMIT 1").format(table)]
            if rel["kind"] in ("v", "m"):
                pass  # a view takes no writes whoever asks: reading it is what matters
            elif rel["kind"] == "S":
                statements.append(
                    sql.SQL("SELECT nextval({})").format(
                        sql.Literal(f"{rel['schema']}.{rel['name']}")
                    )
                )
            else:
                column = sql.Identifier(rel["first_column"])
                statements += [
                    sql.SQL("INSERT INTO {} DEFAULT VALUES").format(table),
                    sql.SQL("UPDATE {} SET {} = {}").format(table, column, column),
                    sql.SQL("DELETE FROM {}").format(table),
                    sql.SQL("TRUNCATE {}").format(table),
                ]
            problems += [p for s in statements if (p := _refused(app, s)) is not None]
        for fn in functions:
            if fn["name"] in GRANTED_FUNCTIONS:
                continue
            args = sql.SQL(", ").join(
                sql.SQL("NULL::{}").format(sql.SQL(t))
                for t in fn["args"]  # type: ignore[arg-type]
            )
            name = sql.Identifier(*fn["name"].split("."))
            verb = "CALL" if fn["kind"] == "p" else "SELECT"
            problems += [
                p
                for p in [_refused(app, sql.SQL(verb + " {}({})").format(name, args))]
                if p is not None
            ]
        for schema in ("dbos", "ledgerloop"):
            created = sql.SQL("CREATE TABLE {} (i int)").format(sql.Identifier(schema, "mine"))
            problems += [p for p in [_refused(app, created)] if p is not None]
        # What it may do: start a run (and read nothing of it back, here or anywhere).
        started = start_run(app, agent="ops", input={"message": "ok"})
        app.commit()
        assert (
            app.execute("SELECT ledgerloop.run_traceparent(%s) AS tp", (run_id,))
            .fetchone()["tp"]
            .startswith("00-")
        )  # type: ignore[index]
    assert problems == [], "\n".join(problems)
    with connect(shop.url(shop.owner), autocommit=True) as owner:
        assert run_get(owner, started) is not None


def test_the_application_role_cannot_send_a_running_agent_a_message(installed: Shop) -> None:
    """Messages come through the authenticated API only (role runner): the app role may not
    write run_message, nor send the wake-up that would make a run read one."""
    shop = installed
    with connect(shop.url(shop.owner), autocommit=True) as owner:
        run_id = start_run(owner, agent="ops", input={"message": "hi"})
        tenant = run_get(owner, run_id).tenant_id  # type: ignore[union-attr]
    with _as(shop.url(shop.app)) as app:
        insert = sql.SQL(
            "INSERT INTO ledgerloop.run_message (id, run_id, tenant_id, idempotency_key, "
            "content, sent_by) VALUES (gen_random_uuid(), {}, {}, 'k', '{{\"text\": \"x\"}}', "
            "'app')"
        ).format(sql.Literal(run_id), sql.Literal(tenant))
        send = sql.SQL(
            "SELECT dbos.send_message(destination_id => {}, message => '{{}}'::json, "
            "topic => 'ledgerloop:message', message_id => 'forged')"
        ).format(sql.Literal(str(run_id)))
        assert _refused(app, insert) is None
        assert _refused(app, send) is None
    with connect(shop.url(shop.owner), autocommit=True) as owner:
        row = owner.execute(
            "SELECT count(*) AS n FROM ledgerloop.run_message WHERE run_id = %s", (run_id,)
        ).fetchone()
        assert row == {"n": 0}


def test_a_second_database_on_the_cluster_stays_apart(installed: Shop) -> None:
    shop = installed
    other = f"{shop.database}_two"
    _new_database(shop, other)
    with connect(shop.url(shop.owner, other), autocommit=True) as owner:
        run_id = start_run(owner, agent="ops", input={"secret": "two"})
    with _as(shop.url(shop.app, other)) as app:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            start_run(app, agent="ops", input={})
        app.rollback()
        for statement in (
            "SELECT input FROM ledgerloop.agent_run",
            "UPDATE ledgerloop.agent_run SET status = 'cancelled'",
            "SELECT status FROM dbos.workflow_status",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute(statement.encode())
            app.rollback()
    with connect(shop.url(shop.owner, other), autocommit=True) as owner:
        run = run_get(owner, run_id)
        assert run is not None
        assert run.status is RunStatus.RECEIVED


def test_an_install_refused_for_a_missing_privilege_names_it_and_writes_nothing(
    installed: Shop,
) -> None:
    shop = installed
    # The application role, which owns nothing here, tries to upgrade the shop's schema.
    result = _cli(shop.url(shop.app), "db", "upgrade")
    assert result.returncode == 2, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "does not own" in lines[0], lines[0]
    assert "missing: ownership" in lines[0], lines[0]
    assert PASSWORD not in result.stderr
