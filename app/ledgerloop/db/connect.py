"""Connections for Ledgerloop's own tables, and the tenant scope that row-level security reads."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from ledgerloop.db import footprint
from ledgerloop.db.errors import DatabasePrivilegeError, translated
from ledgerloop.db.pooling import connect_kwargs
from ledgerloop.db.sql import load_queries
from ledgerloop.db.url import validate_url

Conn = psycopg.Connection[dict[str, Any]]

_SCOPE_ENTER = load_queries("ledgerloop.db", "roles.sql")["scope_enter"]

#: The server's timeline: a failover to a promoted standby starts a new one.
TIMELINE_QUERY = load_queries("ledgerloop.db", "timeline.sql")["server_timeline"]


def connect(url: str, *, autocommit: bool = False, application_name: str = "ledgerloop") -> Conn:
    """One connection with dict rows; driver errors become one clear LedgerloopError.
    Through a transaction-mode pooler it prepares no statements (db/pooling.py)."""
    url = validate_url(url)
    with translated(url, "connecting"):
        return psycopg.connect(
            url,
            autocommit=autocommit,
            row_factory=dict_row,
            application_name=footprint.application_name(application_name),
            **connect_kwargs(url),
        )


#: Called before a connection of a `make_pool` pool is lent (see `guard_borrows`).
_borrow_guard: Callable[[], object] | None = None


def guard_borrows(guard: Callable[[], object] | None) -> None:
    """Call `guard` before this process's pools lend a connection (None: no guard). It may
    block (bounded) or raise to refuse: the worker's fence refuses the statements of an
    execution whose run a failover sent back to the journal (fleet.heartbeat)."""
    global _borrow_guard
    _borrow_guard = guard


#: Called with each new connection a `make_pool` pool opens (see `watch_connections`).
_connect_hook: Callable[[Conn], object] | None = None


def watch_connections(hook: Callable[[Conn], object] | None) -> None:
    """Call `hook` with each connection this process's pools open, before it is lent (None:
    no hook). It must leave the connection idle and not raise: the worker reads the server's
    timeline there, so a failover is noticed by the first statement sent after it."""
    global _connect_hook
    _connect_hook = hook


AConn = psycopg.AsyncConnection[dict[str, Any]]

#: Called with the server's timeline on each new async connection (see `watch_async_connections`).
_async_hook: Callable[[int | None], Awaitable[object]] | None = None


def watch_async_connections(hook: Callable[[int | None], Awaitable[object]] | None) -> None:
    """Await `hook` with the server's timeline on each new async connection (the relay's, the
    reconciler's: `observe_async`) before it is used (None: no hook). The worker waits there
    for its rewind check when the timeline is not the one it knew (a failover)."""
    global _async_hook
    _async_hook = hook


def watching_async() -> bool:
    """Whether new async connections are watched (inside a worker)."""
    return _async_hook is not None


async def observe_async(conn: AConn) -> int | None:
    """The server's timeline on `conn` (None: unknown), handed to the hook first. Leaves an
    autocommit `conn` idle; never raises for a server that cannot say (a standby)."""
    timeline: int | None = None
    try:
        cursor = await conn.execute(TIMELINE_QUERY)
        row = await cursor.fetchone()
        timeline = None if row is None or row["timeline"] is None else int(row["timeline"])
    except psycopg.OperationalError:
        raise
    except psycopg.Error:
        if not conn.autocommit:
            await conn.rollback()
    hook = _async_hook
    if hook is not None:
        await hook(timeline)
    return timeline


def _configure(conn: Conn) -> None:
    hook = _connect_hook
    if hook is not None:
        hook(conn)


class GuardedPool(ConnectionPool[Conn]):
    """A pool whose loans pass `guard_borrows`'s guard, before and after the connection is
    taken (taking it may open a new one, whose hook may have closed the fence)."""

    def getconn(self, timeout: float | None = None) -> Conn:
        guard = _borrow_guard
        if guard is None:
            return super().getconn(timeout)
        guard()
        conn = super().getconn(timeout)
        try:
            guard()
        except BaseException:
            self.putconn(conn)
            raise
        return conn


def make_pool(
    url: str, *, min_size: int = 1, max_size: int = 10, name: str = "ledgerloop"
) -> ConnectionPool[Conn]:
    """A pool that opens lazily-checked connections with dict rows, named `name` in
    pg_stat_activity (its application_name)."""
    url = validate_url(url)
    pool: ConnectionPool[Conn] = GuardedPool(
        url,
        min_size=min_size,
        max_size=max_size,
        name=name,
        kwargs={
            "row_factory": dict_row,
            "application_name": footprint.application_name(name),
            **connect_kwargs(url),
        },
        configure=_configure,
        open=False,
    )
    with translated(url, "connecting"):
        pool.open(wait=True, timeout=10)
    return pool


@contextmanager
def tenant_scope(conn: Conn, tenant_id: uuid.UUID) -> Iterator[Conn]:
    """A transaction that sees and writes only `tenant_id`'s rows.

    Every tenant table forces row-level security on every role, its owner included
    (migration 0024): with the setting made here, its policy admits only this tenant's rows;
    without it (workers, relay, reconciler), every row. A session the policies do not bind (a
    superuser, BYPASSRLS) also switches to this database's scope role (db/roles.py). Both are
    transaction-local, so a pooled connection cannot leak one tenant's scope into the next
    borrower's transaction.
    """
    entered = False
    try:
        with conn.transaction():
            conn.execute(_SCOPE_ENTER, {"tenant": str(tenant_id)})
            entered = True
            yield conn
    except psycopg.errors.InvalidParameterValue as exc:
        if entered:
            raise
        raise DatabasePrivilegeError(
            f"cannot enter tenant {tenant_id}'s scope: {str(exc).strip()}; this session "
            "bypasses row-level security (a superuser or BYPASSRLS), so it needs this "
            "database's scope role",
            fix="run `ledgerloop db upgrade` as a superuser, or have a DBA run what "
            "`ledgerloop db roles --sql` prints; or connect as the database owner",
        ) from exc
