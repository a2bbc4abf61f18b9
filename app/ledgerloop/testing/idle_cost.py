"""What an idle process costs its database, counted (scripts/bench idle, and the test that
holds `ledgerloop up` to it): statements by pg_stat_statements on a throwaway cluster that
loads it, and the commits that wrote WAL, read from the WAL itself."""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from ledgerloop.db.cluster import LocalCluster

_RECORD = re.compile(r"rmgr: (\w+)\s+len \(rec/tot\):\s+\d+/\s*(\d+), tx:\s+(\d+), .*?desc: (\w+)")
_RELATION = re.compile(r"rel \d+/(\d+)/\d+")


@contextmanager
def counting_cluster() -> Iterator[LocalCluster]:
    """A throwaway cluster that counts every statement of every database."""
    with tempfile.TemporaryDirectory(prefix="ledgerloop-idle-") as tmp:
        local = LocalCluster(Path(tmp) / "cluster")
        local.init()
        with (local.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(
                "shared_preload_libraries = 'pg_stat_statements'\n"
                "pg_stat_statements.track = all\n"
                "pg_stat_statements.track_utility = on\n"
            )
        local.start()
        try:
            with psycopg.connect(local.url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            yield local
        finally:
            local.destroy()


def database_oid(admin_url: str, url: str) -> int:
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute("SELECT oid FROM pg_database WHERE datname = %s", (name,)).fetchone()
    assert row is not None
    return int(row[0])


def reset_statements(admin_url: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def statements(admin_url: str) -> dict[int, tuple[int, int]]:
    """(statements, of which BEGIN/COMMIT/ROLLBACK) per database oid since the last reset."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT dbid, sum(calls), "
            "       sum(calls) FILTER (WHERE left(query, 5) = 'BEGIN' "
            "                          OR query IN ('COMMIT', 'ROLLBACK')) "
            "FROM pg_stat_statements GROUP BY dbid"
        ).fetchall()
    return {int(db): (int(n), int(b or 0)) for db, n, b in rows}


def calls_like(admin_url: str, db: int, pattern: str) -> int:
    """Calls since the last reset of the statements of database `db` whose text matches."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements "
            "WHERE dbid = %s AND query LIKE %s",
            (db, pattern),
        ).fetchone()
    return int(row[0]) if row else 0


def top_statements(admin_url: str, db: int, limit: int = 10) -> list[tuple[int, str]]:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT calls, regexp_replace(query, '\\s+', ' ', 'g') FROM pg_stat_statements "
            "WHERE dbid = %s ORDER BY calls DESC LIMIT %s",
            (db, limit),
        ).fetchall()
    return [(int(calls), str(query)[:120]) for calls, query in rows]


def wal_lsn(admin_url: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def wal_by_database(local: LocalCluster, start: str, end: str) -> dict[int, tuple[int, int]]:
    """(commit records, bytes) per database oid in the WAL from `start` to `end`. A commit
    counts for the database whose relations its transaction changed (a transaction that
    changed nothing writes no commit record); bytes are those of records naming a relation of
    the database, plus its commits'."""
    out = subprocess.run(
        [
            str(local.bin_dir / "pg_waldump"),
            "-p",
            str(local.data_dir / "pg_wal"),
            "-s",
            start,
            "-e",
            end,
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    db_of_xid: dict[int, int] = {}
    commits: list[tuple[int, int]] = []
    size: Counter[int] = Counter()
    for line in out.splitlines():
        record = _RECORD.search(line)
        if not record:
            continue
        rmgr, length, xid, desc = record[1], int(record[2]), int(record[3]), record[4]
        relation = _RELATION.search(line)
        if relation and int(relation[1]):
            db = int(relation[1])
            size[db] += length
            if xid:
                db_of_xid.setdefault(xid, db)
        if rmgr == "Transaction" and desc.startswith("COMMIT"):
            commits.append((xid, length))
    counts: Counter[int] = Counter()
    for xid, length in commits:
        db = db_of_xid.get(xid, 0)
        counts[db] += 1
        size[db] += length
    return {db: (counts[db], size[db]) for db in set(counts) | set(size)}
