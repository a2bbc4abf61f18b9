"""The embedded Postgres (the pgserver wheel) used when no database is configured."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg

from ledgerloop.db.cluster import import_pgserver
from ledgerloop.db.errors import translated
from ledgerloop.db.url import with_database

DATABASE = "ledgerloop"


def is_running(pgdata: Path) -> bool:
    """Whether a server runs on `pgdata` (its postmaster.pid names a live process)."""
    pid_file = pgdata / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_embedded(pgdata: Path, *, keep_running: bool = True) -> str:
    """Start (or attach to) the embedded server under `pgdata`; return a URL to its database.

    With keep_running the server outlives this process (pgserver's cleanup_mode=None), so
    the worker, the CLI and a psql session can share it. Without it, a server this process
    starts is stopped when the process exits; one that was already running is left running.
    """
    pgserver = import_pgserver()

    pgdata.mkdir(parents=True, exist_ok=True)
    keep = keep_running or is_running(pgdata)
    server = pgserver.get_server(pgdata.resolve(), cleanup_mode=None if keep else "stop")
    admin_url: str = server.get_uri()
    with (
        translated(admin_url, "creating the embedded database"),
        psycopg.connect(admin_url, autocommit=True) as conn,
    ):
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
        if exists.fetchone() is None:
            conn.execute(f'CREATE DATABASE "{DATABASE}"')
    return with_database(admin_url, DATABASE)
