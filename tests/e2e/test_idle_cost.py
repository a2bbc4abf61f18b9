"""An idle `ledgerloop up` (worker, relay, reconciler, HTTP) writes nothing to its database
and reads little, counted by the database itself: commit records in the WAL, and
pg_stat_statements calls per watch of the worker's resting heartbeat (its own clock: a
watch every 0.8 gap_s, docs/operations.md, Idle cost)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

from ledgerloop.db.cluster import free_port
from ledgerloop.fleet.views import workers_list
from ledgerloop.models.script import parse_script
from ledgerloop.models.scripted_server import ScriptedModelServer
from ledgerloop.testing.idle_cost import (
    calls_like,
    counting_cluster,
    database_oid,
    reset_statements,
    statements,
    top_statements,
    wal_by_database,
    wal_lsn,
)
from ledgerloop.testing.postgres import DatabaseFactory, wait_until
from ledgerloop.testing.processes import REPO, stop_all, worker_env

#: The window, in watches of the resting heartbeat (2 s apart with the default timings),
#: after WARM_UP of them since it rested (the safety polls have backed off by then: each
#: doubles its wait up to 30 s).
WATCHES = 10
WARM_UP = 20
#: At most this many statements per watch, BEGIN and COMMIT included (5 a second).
PER_WATCH = 10
#: The heartbeat statement, as pg_stat_statements keeps its text.
HEARTBEAT = "%AS beating%"


def _resting(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT bool_and(resting_since IS NOT NULL) AND count(*) = 1 FROM ledgerloop.executor"
        ).fetchone()
    return bool(row and row[0])


def test_an_idle_ledgerloop_up_commits_nothing_and_makes_few_statements() -> None:
    with (
        counting_cluster() as local,
        ScriptedModelServer(parse_script("default: {turns: [{text: done}]}")) as model,
        tempfile.TemporaryDirectory() as tmp,
    ):
        admin = local.url
        url = DatabaseFactory(admin).create()
        env = worker_env(url, ANTHROPIC_BASE_URL=model.url, LEDGERLOOP_HTTP_PORT=str(free_port()))
        log = Path(tmp) / "up.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ledgerloop.cli", "up"],
                env=env,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            # Registered, started its services, and rested: it has had nothing to do.
            wait_until(lambda: proc.poll() is None and _resting(url), timeout=90, interval=0.5)
            db = database_oid(admin, url)
            reset_statements(admin)
            wait_until(lambda: calls_like(admin, db, HEARTBEAT) >= WARM_UP, timeout=120)
            reset_statements(admin)
            start = wal_lsn(admin)
            wait_until(lambda: calls_like(admin, db, HEARTBEAT) >= WATCHES, timeout=60)
            end = wal_lsn(admin)
            made, _ = statements(admin).get(db, (0, 0))
            watches = calls_like(admin, db, HEARTBEAT)
            top = top_statements(admin, db)
            assert proc.poll() is None, log.read_text()
            assert _resting(url)  # it never woke: nothing asked for a lease
            # Its heartbeat is old, and `ledgerloop workers` says why it is alive all the same.
            with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
                (worker,) = workers_list(conn)
            assert worker.resting
            assert worker.alive(stale_after_s=0.0)
        finally:
            stop_all(proc)
        commits, _ = wal_by_database(local, start, end).get(db, (0, 0))
    assert commits == 0
    assert 0 < made <= PER_WATCH * watches, (made, watches, top)
