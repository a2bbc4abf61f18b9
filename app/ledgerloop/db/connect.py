"""Connections for Ledgerloop's own tables, and the tenant scope that row-level security reads."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from ledgerloop.db.errors import translated
from ledgerloop.db.pooling import connect_kwargs
from ledgerloop.db.url import validate_url

Conn = psycopg.Connection[dict[str, Any]]

#: The role tenant-scoped transactions switch to; row-level security applies to it, while the
#: owner role that workers connect as sees every tenant (relay, reconciler, recovery).
TENANT_ROLE = "ledgerloop_tenant"


def connect(url: str, *, autocommit: bool = False, application_name: str = "ledgerloop") -> Conn:
    """One connection with dict rows; driver errors become one clear LedgerloopError.
    Through a transaction-mode pooler it prepares no statements (db/pooling.py)."""
    url = validate_url(url)
    with translated(url, "connecting"):
        return psycopg.connect(
            url,
            autocommit=autocommit,
            row_factory=dict_row,
            application_name=application_name,
            **connect_kwargs(url),
        )


def make_pool(
    url: str, *, min_size: int = 1, max_size: int = 10, name: str = "ledgerloop"
) -> ConnectionPool[Conn]:
    """A pool that opens lazily-checked connections with dict rows, named `name` in
    pg_stat_activity (its application_name)."""
    url = validate_url(url)
    pool: ConnectionPool[Conn] = ConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        name=name,
        kwargs={"row_factory": dict_row, "application_name": name, **connect_kwargs(url)},
        open=False,
    )
    with translated(url, "connecting"):
        pool.open(wait=True, timeout=10)
    return pool


@contextmanager
def tenant_scope(conn: Conn, tenant_id: uuid.UUID) -> Iterator[Conn]:
    """A transaction that sees only `tenant_id`'s rows.

    The role switch and the tenant setting are both transaction-local, so a pooled connection
    cannot leak one tenant's scope into the next borrower's transaction.
    """
    with conn.transaction():
        conn.execute(
            "SELECT set_config('role', %s, true), set_config('ledgerloop.tenant_id', %s, true)",
            (TENANT_ROLE, str(tenant_id)),
        )
        yield conn
