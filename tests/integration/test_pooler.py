"""Ledgerloop through PgBouncer in transaction mode (Debian's pgbouncer 1.18: no prepared
statements in transaction mode, nothing reset between clients of a server connection).

A real `ledgerloop up` runs runs to the end through it, with a direct URL beside it and
without; what Ledgerloop did leaves no session setting and no advisory lock on a pooled
server connection; the migration lock is taken on the direct connection; `runs purge` works
through the pooler.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from ledgerloop.db.connect import Conn, connect
from ledgerloop.db.migrate import LOCK_KEY, upgrade
from ledgerloop.db.pooling import PoolerNeedsDirectUrl, register
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.states import RunStatus
from ledgerloop.testing.pgbouncer import PgBouncer
from ledgerloop.testing.postgres import DatabaseFactory, wait_until
from ledgerloop.testing.processes import stop_all, worker_env
from tests.conftest import REPO, start_test_run, wait_terminal

SCRIPT = """
default:
  turns:
    - tool_use: {name: echo, input: {text: hi}}
    - tool_use: {name: ticket_idempotent, input: {title: pooled}}
    - text: done
"""

#: Settings every pooled server connection must still have after Ledgerloop used it.
DEFAULTS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")


def _admin(bouncer: PgBouncer) -> psycopg.Connection[Any]:
    # The admin console speaks only the simple query protocol (a client-side cursor).
    return psycopg.connect(
        bouncer.admin_url(), autocommit=True, cursor_factory=psycopg.ClientCursor
    )


def server_pids(bouncer: PgBouncer, dbname: str) -> set[int]:
    """The backends of PgBouncer's server connections to `dbname`."""
    with _admin(bouncer) as admin:
        cur = admin.execute("SHOW SERVERS")
        names = [c.name for c in cur.description or []]
        rows = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    return {int(r["remote_pid"]) for r in rows if r["database"] == dbname and r["remote_pid"]}


def pooled_advisory_locks(conn: Conn, pids: set[int]) -> list[dict[str, Any]]:
    """Session advisory locks held by these backends: held with no transaction open (a
    transaction's own lock, like DBOS's background-job lock, ends with it, before PgBouncer
    can hand the server connection to anyone else)."""
    rows = conn.execute(
        "SELECT l.pid, l.classid, l.objid FROM pg_locks l "
        "JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND a.xact_start IS NULL"
    ).fetchall()
    return [r for r in rows if r["pid"] in pids]


def assert_pooled_connections_clean(bouncer: PgBouncer, pooled_url: str, direct: Conn) -> None:
    """Every server connection of the pool, as the next client gets it: default settings,
    no advisory lock held by it."""
    dbname = psycopg.conninfo.conninfo_to_dict(pooled_url)["dbname"]
    # Hold as many clients in transactions as the pool has server connections, so each
    # server connection is looked at.
    clients = [
        psycopg.connect(pooled_url, prepare_threshold=None) for _ in range(bouncer.pool_size)
    ]
    try:
        for client in clients:
            for name in DEFAULTS:
                value = client.execute(f"SHOW {name}").fetchone()
                assert value == ("0",), f"{name} leaked onto a pooled connection: {value}"
    finally:
        for client in clients:
            # Ended before closing: PgBouncer closes a server connection left in a transaction.
            client.rollback()
            client.close()
    pids = server_pids(bouncer, str(dbname))
    assert pids, "no pooled server connection to look at"
    assert pooled_advisory_locks(direct, pids) == []


@pytest.fixture
def tickets() -> Iterator[TicketServiceThread]:
    with TicketServiceThread() as service:
        yield service


def _up(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ledgerloop.cli", "up", "--no-http"],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _first_step_s(conn: Conn, pooled: Conn, agent: str) -> tuple[uuid.UUID, float]:
    """SQL start_run through the pooler, commit to the run's first journaled step."""
    began = time.monotonic()
    run_id = start_test_run(pooled, agent, "first step")
    wait_until(
        lambda: conn.execute(
            "SELECT 1 FROM dbos.operation_outputs WHERE workflow_uuid = %s", (str(run_id),)
        ).fetchone(),
        timeout=30,
        interval=0.002,
    )
    return run_id, time.monotonic() - began


@pytest.mark.parametrize("with_direct", [True, False], ids=["direct-url", "pooler-only"])
def test_up_through_pgbouncer_runs_to_the_end(
    bouncer: PgBouncer,
    direct_db_url: str,
    scripted_model: Any,
    tickets: TicketServiceThread,
    tmp_path: Path,
    with_direct: bool,
) -> None:
    pooled_url = bouncer.pooled(direct_db_url)
    register(pooled_url, pooled=True, direct_url=direct_db_url if with_direct else None)
    model = scripted_model(SCRIPT)
    extra = {"LEDGERLOOP_DIRECT_DATABASE_URL": direct_db_url} if with_direct else {}
    env = worker_env(
        pooled_url,
        ANTHROPIC_BASE_URL=model.url,
        LEDGERLOOP_POOLER="transaction",
        LEDGERLOOP_AGENT_MODULES="tests.support.agents",
        LEDGERLOOP_POLICY_FILE=str(REPO / "tests" / "support" / "policy.yaml"),
        LEDGERLOOP_DESTINATIONS=f'{{"tickets": "{tickets.url}"}}',
        # Past DBOS's hot-statement threshold many times over, and past the ~20 s after
        # which prepared statements used to kill the worker.
        LEDGERLOOP_HEARTBEAT_S="0.1",
        LEDGERLOOP_STALE_AFTER_S="2",
        **extra,
    )
    log = tmp_path / "up.log"
    proc = _up(env, log)
    try:
        with (
            connect(direct_db_url, autocommit=True) as conn,
            connect(pooled_url, autocommit=True) as pooled,
        ):
            wait_until(
                lambda: (
                    proc.poll() is None
                    and conn.execute("SELECT 1 FROM ledgerloop.executor").fetchone()
                ),
                timeout=60,
            )
            latencies = []
            runs = []
            deadline = time.monotonic() + 22
            while time.monotonic() < deadline or len(runs) < 3:
                run_id, took = _first_step_s(conn, pooled, "writer")
                latencies.append(took)
                runs.append(run_id)
                assert wait_terminal(conn, run_id, timeout=60).status is RunStatus.SUCCEEDED, (
                    log.read_text()[-3000:]
                )
            assert proc.poll() is None, log.read_text()[-3000:]
            latencies.sort()
            where = "direct URL" if with_direct else "no direct URL"
            print(
                f"\nstart_run -> first step through pgbouncer ({where}): "
                f"p50 {latencies[len(latencies) // 2] * 1000:.0f} ms, "
                f"max {latencies[-1] * 1000:.0f} ms over {len(latencies)} runs"
            )
            # With LISTEN on the direct connection a run starts at once; without, within the
            # poll period (1 s) and a margin for a busy machine.
            assert latencies[len(latencies) // 2] < (0.5 if with_direct else 1.5)
            assert httpx.get(f"{tickets.url}/_stats").json()["created"] == len(runs)
            assert_pooled_connections_clean(bouncer, pooled_url, conn)
        text = log.read_text()
        assert "PreparedStatement" not in text, text
        assert "prepared statement" not in text, text
        if not with_direct:
            assert "no LEDGERLOOP_DIRECT_DATABASE_URL: running without LISTEN" in text
        # Retention through the pooler: the CLI's purge (its startup options were refused).
        purge = subprocess.run(
            [sys.executable, "-m", "ledgerloop.cli", "runs", "purge", "--finished-before", "0s"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert purge.returncode == 0, purge.stderr
        with connect(direct_db_url, autocommit=True) as conn:
            left = conn.execute(
                "SELECT count(*) AS n FROM ledgerloop.agent_run WHERE id = ANY(%s)", (runs,)
            ).fetchone()
            assert left is not None
            assert left["n"] == 0, purge.stdout + purge.stderr
            assert_pooled_connections_clean(bouncer, pooled_url, conn)
    finally:
        stop_all(proc, timeout=30)


def test_migration_lock_is_taken_on_the_direct_connection(
    bouncer: PgBouncer, db_factory: DatabaseFactory
) -> None:
    direct_url = db_factory.create(migrated=False)
    pooled_url = bouncer.pooled(direct_url)
    try:
        register(pooled_url, pooled=True, direct_url=None)
        with pytest.raises(PoolerNeedsDirectUrl, match="LEDGERLOOP_DIRECT_DATABASE_URL"):
            upgrade(pooled_url)
        register(pooled_url, pooled=True, direct_url=direct_url)
        said: list[str] = []
        done: list[bool] = []
        with connect(direct_url, autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
            upgrading = threading.Thread(
                target=lambda: done.append(upgrade(pooled_url, say=said.append)), daemon=True
            )
            upgrading.start()
            # The upgrader waits, and says who holds the lock instead of hanging silently.
            wait_until(lambda: said, timeout=15)
            assert f"held by backend pid {holder.info.backend_pid}" in said[0]
            waiting = holder.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'ledgerloop-migrate'"
            ).fetchall()
            assert waiting, "the upgrader's lock session is not there"
            pooled_pids = server_pids(bouncer, str(holder.info.dbname))
            assert not {r["pid"] for r in waiting} & pooled_pids
            holder.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))
        upgrading.join(timeout=120)
        assert done == [True]
        with connect(direct_url, autocommit=True) as conn:
            locks = conn.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = %s",
                (LOCK_KEY,),
            ).fetchall()
            assert locks == []
        # A second upgrade (direct) finds nothing to do, and does not wait on a leaked lock.
        assert upgrade(direct_url) is False
    finally:
        db_factory.drop(direct_url)
