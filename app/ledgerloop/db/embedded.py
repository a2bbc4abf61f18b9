"""The embedded Postgres (the pgserver wheel) used when no database is configured."""

from __future__ import annotations

from pathlib import Path

import psycopg

from ledgerloop.db.cluster import import_pgserver
from ledgerloop.db.errors import translated
from ledgerloop.db.url import with_database

DATABASE = "ledgerloop"


def start_embedded(pgdata: Path, *, keep_running: bool = True) -> str:
    """Start (or attach to) the embedded server under `pgdata`; return a URL to its database.

    The server outlives this process on purpose (pgserver's cleanup_mode=None), so the CLI,
    the worker and a psql session can share it; `ledgerloop down` is not needed for a demo.
    """
    pgserver = import_pgserver()

    pgdata.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(pgdata.resolve(), cleanup_mode=None if keep_running else "stop")
    admin_url: str = server.get_uri()
    with (
        translated(admin_url, "creating the embedded database"),
        psycopg.connect(admin_url, autocommit=True) as conn,
    ):
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
        if exists.fetchone() is None:
            conn.execute(f'CREATE DATABASE "{DATABASE}"')
    return with_database(admin_url, DATABASE)
