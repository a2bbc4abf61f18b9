"""`ledgerloop db upgrade`: idempotent, safe concurrently, and clear about bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from ledgerloop.db.connect import connect
from ledgerloop.db.errors import SchemaOutdated
from ledgerloop.db.migrate import ensure_current, schema_state, upgrade
from ledgerloop.testing.postgres import DatabaseFactory


def _cli(*args: str, url: str | None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGERLOOP_", "ANTHROPIC_"))}
    # The shipped tool_policy.yaml is the example agent's: a worker loads it when asked.
    env["LEDGERLOOP_AGENT_MODULES"] = "ledgerloop.examples.ops_agent"
    if url is not None:
        env["LEDGERLOOP_DATABASE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "ledgerloop.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _catalog(url: str) -> list[tuple[object, ...]]:
    with connect(url) as conn:
        rows = conn.execute(
            """
            SELECT table_schema, table_name, column_name, data_type
            FROM information_schema.columns
            WHERE table_schema IN ('dbos', 'ledgerloop')
            UNION ALL
            SELECT n.nspname, p.proname, pg_get_function_identity_arguments(p.oid), ''
            FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname IN ('dbos', 'ledgerloop')
            UNION ALL
            SELECT schemaname, tablename, indexname, indexdef
            FROM pg_indexes WHERE schemaname IN ('dbos', 'ledgerloop')
            ORDER BY 1, 2, 3, 4
            """
        ).fetchall()
    return [tuple(r.values()) for r in rows]


@pytest.fixture
def empty_db(db_factory: DatabaseFactory) -> Iterator[str]:
    url = db_factory.create(migrated=False)
    yield url
    db_factory.drop(url)


def test_upgrade_twice_changes_nothing_the_second_time(empty_db: str) -> None:
    with pytest.raises(SchemaOutdated, match="ledgerloop db upgrade"):
        ensure_current(empty_db)
    assert upgrade(empty_db) is True
    before = _catalog(empty_db)
    assert upgrade(empty_db) is False
    assert _catalog(empty_db) == before
    ensure_current(empty_db)


def test_upgrade_leaves_the_teams_own_tables_alone(empty_db: str) -> None:
    with connect(empty_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.orders (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO public.orders VALUES (1, 'keep me')")
    upgrade(empty_db)
    with connect(empty_db) as conn:
        assert conn.execute("SELECT note FROM public.orders").fetchall() == [{"note": "keep me"}]
        schemas = {
            r["nspname"]
            for r in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg_%%'"
            ).fetchall()
        }
    assert schemas == {"public", "information_schema", "dbos", "ledgerloop"}


def test_five_concurrent_upgrades_serialise_on_the_lock(empty_db: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERLOOP_")}
    env["LEDGERLOOP_DATABASE_URL"] = empty_db
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "ledgerloop.cli", "db", "upgrade"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(5)
    ]
    try:
        outputs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:  # never leave an upgrader behind if the test fails
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * 5, outputs
    said = sorted(out.strip() for out, _ in outputs)
    assert said == ["schema already current"] * 4 + ["schema upgraded"]
    assert schema_state(empty_db).up_to_date


def _assert_one_clear_line(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_malformed_url_is_one_line_exit_2() -> None:
    _assert_one_clear_line(
        _cli("db", "upgrade", url="mysql://root@localhost/app"), "postgresql://", "mysql"
    )
    _assert_one_clear_line(_cli("db", "upgrade", url="postgresql://u@h:port/x"), "bad port")


def test_unreachable_database_is_one_line_exit_2() -> None:
    from ledgerloop.db.cluster import free_port

    result = _cli("db", "upgrade", url=f"postgresql://postgres@127.0.0.1:{free_port()}/x")
    _assert_one_clear_line(result, "cannot reach the database", "LEDGERLOOP_DATABASE_URL")


def test_role_without_privileges_is_one_line_exit_2(empty_db: str) -> None:
    from ledgerloop.db.url import with_database

    role = "ll_nopriv"
    with connect(empty_db, autocommit=True) as conn:
        conn.execute(
            f"DO $$ BEGIN CREATE ROLE {role} LOGIN; "
            "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
    import psycopg

    info = psycopg.conninfo.conninfo_to_dict(empty_db)
    url = with_database(empty_db, str(info["dbname"])).replace("postgres@", f"{role}@", 1)
    result = _cli("db", "upgrade", url=url)
    _assert_one_clear_line(
        result, "may not create schemas", "missing: CREATE on the database", "GRANT CREATE ON"
    )
    # Refused before anything was written: no schema half there.
    with connect(empty_db, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM pg_namespace WHERE nspname IN ('dbos', 'ledgerloop')"
        ).fetchone()
    assert row == {"n": 0}


def test_up_refuses_an_outdated_schema_naming_the_fix(empty_db: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGERLOOP_", "ANTHROPIC_"))}
    env.update(
        {
            "LEDGERLOOP_DATABASE_URL": empty_db,
            "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
            "LEDGERLOOP_AGENT_MODULES": "ledgerloop.examples.ops_agent",
        }
    )
    result = subprocess.run(
        [sys.executable, "-m", "ledgerloop.cli", "up", "--no-http", "--no-relay"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    _assert_one_clear_line(result, "not current", "ledgerloop db upgrade")


def test_up_without_model_access_is_one_clear_line(db_url: str) -> None:
    result = _cli("up", "--no-http", "--no-relay", url=db_url)
    _assert_one_clear_line(result, "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")
