"""Whether the server has room for a process's connections, checked before it opens them.

A process that cannot get its connections fails later and vaguely (a pool that never fills,
"too many clients" on a step). So `ledgerloop up` and `ledgerloop relay` read the server's
`max_connections`, what is in use, and the role's and database's CONNECTION LIMIT first, and
refuse in one line naming the limit and the fix when their footprint does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledgerloop.db.connect import Conn, connect
from ledgerloop.db.errors import DatabaseFull, describe_target
from ledgerloop.db.footprint import Footprint
from ledgerloop.db.sql import load_queries

Q = load_queries("ledgerloop.db", "capacity.sql")


@dataclass(frozen=True)
class Capacity:
    max_connections: int
    reserved: int
    superuser: bool
    role: str
    role_limit: int
    database: str
    database_limit: int
    #: Client connections on the server, other than the one that read this.
    in_use: int
    #: Of them, Ledgerloop's (application_name `ledgerloop...`).
    ledgerloop: int
    role_in_use: int
    database_in_use: int

    @property
    def free(self) -> int:
        """Connections this role may still open on the server."""
        usable = self.max_connections - (0 if self.superuser else self.reserved)
        return usable - self.in_use


def read_capacity(conn: Conn) -> Capacity:
    row = conn.execute(Q["capacity_read"]).fetchone()
    assert row is not None
    return Capacity(**row)


def ledgerloop_processes(conn: Conn) -> list[tuple[str, int]]:
    """Ledgerloop's connections on the server, by process (executor) or command."""
    return [(r["process"], r["connections"]) for r in conn.execute(Q["capacity_processes"])]


def check_room(url: str, footprint: Footprint, least: int) -> Capacity:
    """Refuse (DatabaseFull, one line) when the server, the role's or the database's
    CONNECTION LIMIT has no room for `footprint`; `least` is the process's minimum."""
    with connect(url, autocommit=True, application_name="ledgerloop-check") as conn:
        found = read_capacity(conn)
    problem = room_problem(found, footprint.total)
    if problem is not None:
        message, free, fix = problem
        lower = (
            f"lower LEDGERLOOP_MAX_CONNECTIONS to {free} (this process needs at least {least}), "
            if free >= least
            else f"this process needs at least {least}: "
        )
        raise DatabaseFull(f"{message} on {describe_target(url)}", fix=lower + fix)
    return found


def room_problem(found: Capacity, need: int) -> tuple[str, int, str] | None:
    """What leaves less than `need` connections, how many are free under it and what
    raises it; None: there is room."""
    if found.free < need:
        return (
            f"the server has {max(found.free, 0)} free connections (max_connections "
            f"{found.max_connections}, {found.in_use} in use, {found.ledgerloop} of them "
            f"Ledgerloop's) and this process needs up to {need}",
            max(found.free, 0),
            "or raise max_connections (postgresql.conf, then restart Postgres) or stop "
            "other clients",
        )
    # A CONNECTION LIMIT binds every role but a superuser.
    if not found.superuser and found.role_limit >= 0:
        free = found.role_limit - found.role_in_use
        if free < need:
            return (
                f"role {found.role} has CONNECTION LIMIT {found.role_limit} with "
                f"{found.role_in_use} in use and this process needs up to {need}",
                max(free, 0),
                f"or raise it: ALTER ROLE {found.role} CONNECTION LIMIT {found.role_in_use + need}",
            )
    if not found.superuser and found.database_limit >= 0:
        free = found.database_limit - found.database_in_use
        if free < need:
            return (
                f"database {found.database} has CONNECTION LIMIT {found.database_limit} with "
                f"{found.database_in_use} in use and this process needs up to {need}",
                max(free, 0),
                f"or raise it: ALTER DATABASE {found.database} CONNECTION LIMIT "
                f"{found.database_in_use + need}",
            )
    return None
