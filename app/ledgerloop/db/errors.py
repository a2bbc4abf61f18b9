"""Database errors a user can act on, and the one place driver errors become them."""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import psycopg.errors
import sqlalchemy.exc

from ledgerloop.errors import LedgerloopError


class DatabaseUrlInvalid(LedgerloopError):
    """LEDGERLOOP_DATABASE_URL is not a valid Postgres URL."""


class DatabaseUnreachable(LedgerloopError):
    """The database cannot be reached."""

    retryable = True


class DatabasePrivilegeError(LedgerloopError):
    """The database role lacks a privilege Ledgerloop needs."""


class DatabaseAuthenticationFailed(LedgerloopError):
    """The database refused the user's password (or its absence)."""


class DatabaseFull(LedgerloopError):
    """The server (or a role's or database's CONNECTION LIMIT) has no room for more
    connections: "too many clients", or too few free for a process's footprint."""

    # A step that meets it may succeed once another client lets a connection go.
    retryable = True


class DatabaseMissing(LedgerloopError):
    """The database does not exist."""


class SchemaOutdated(LedgerloopError):
    """The database schema is older than this version of Ledgerloop."""


def describe_target(url: str) -> str:
    """host:port/dbname of a URL, never its password."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<invalid url>"
    hosts = str(info.get("host") or "localhost").split(",")
    ports = str(info.get("port") or "5432").split(",")
    if len(ports) == 1:  # one port for every host
        ports *= len(hosts)
    where = ",".join(f"{h}:{p or '5432'}" for h, p in zip(hosts, ports, strict=False))
    return f"{where}/{info.get('dbname') or info.get('user') or ''}"


#: Errors that mean a table, schema or function Ledgerloop expects is not installed.
_SCHEMA_MISSING = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.InvalidSchemaName,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.UndefinedColumn,
)


@contextmanager
def translated(url: str, action: str) -> Iterator[None]:
    """Turn driver errors met while doing `action` against `url` into LedgerloopErrors."""
    target = describe_target(url)
    try:
        try:
            yield
        except sqlalchemy.exc.DBAPIError as wrapped:
            # SQLAlchemy (DBOS, alembic) wraps the driver's error; judge the driver's own.
            if isinstance(wrapped.orig, psycopg.Error):
                raise wrapped.orig from wrapped
            raise
    except _SCHEMA_MISSING as exc:
        raise SchemaOutdated(
            f"the database {target} does not have the schema this version of Ledgerloop "
            f"expects ({_first_line(exc)})",
            fix="run `ledgerloop db upgrade`",
        ) from exc
    except psycopg.errors.InsufficientPrivilege as exc:
        raise DatabasePrivilegeError(
            f"{action} on {target} was refused: {_first_line(exc)}",
            fix="run `ledgerloop db upgrade` as the database owner, or grant the role CREATE on "
            "the database (GRANT CREATE ON DATABASE ... TO ...)",
        ) from exc
    except psycopg.errors.InvalidCatalogName as exc:
        raise DatabaseMissing(
            f"database {target} does not exist",
            fix="create it (createdb) or point LEDGERLOOP_DATABASE_URL at an existing database",
        ) from exc
    except psycopg.OperationalError as exc:
        text = _first_line(exc)
        if "does not exist" in text and "database" in text:
            raise DatabaseMissing(
                f"database {target} does not exist",
                fix="create it (createdb) or point LEDGERLOOP_DATABASE_URL at an existing database",
            ) from exc
        # Every line: with several hosts, the refusal may follow the first host's failure.
        if _AUTH_FAILED.search(str(exc)):
            raise DatabaseAuthenticationFailed(
                f"the database at {target} refused user {_user(url)!r}: {_auth_reason(str(exc))}",
                fix="check the password for that user in LEDGERLOOP_DATABASE_URL (or "
                "PGPASSWORD, ~/.pgpass), and that the user exists",
            ) from exc
        if _FULL.search(str(exc)):
            raise DatabaseFull(
                f"the database at {target} refused a connection: {_full_reason(str(exc))}",
                fix="raise max_connections (or the role's or database's CONNECTION LIMIT), "
                "stop other clients, or lower LEDGERLOOP_MAX_CONNECTIONS; `ledgerloop db "
                "status` shows Ledgerloop's connections",
            ) from exc
        if "permission denied" in text:
            raise DatabasePrivilegeError(
                f"{action} on {target} was refused: {text}",
                fix="grant the role CONNECT on the database or use a role that has it",
            ) from exc
        raise DatabaseUnreachable(
            f"cannot reach the database at {target}: {text}",
            fix="check that Postgres is running and LEDGERLOOP_DATABASE_URL is right, or unset "
            "it to use the embedded Postgres",
        ) from exc


#: libpq's words for a refused login: the server's (password or peer authentication failed)
#: or its own (the server asked for a password and none was given). Matched in the text, as a
#: connection that never started carries no SQLSTATE.
_AUTH_FAILED = re.compile(
    r"authentication failed for user|no password supplied|password authentication failed"
)


#: The server's words when it has no slot for a new connection (SQLSTATE 53300): in all,
#: reserved for superusers (or pg_use_reserved_connections), or a CONNECTION LIMIT.
_FULL = re.compile(
    r"too many clients already|remaining connection slots are reserved|"
    r"too many connections for (role|database)"
)


def _full_reason(text: str) -> str:
    found = _FULL.search(text)
    if found is None:
        return "no free connection"
    start = text.rfind("FATAL:", 0, found.start())
    start = start + len("FATAL:") if start >= 0 else found.start()
    return text[start:].splitlines()[0].strip()


def _auth_reason(text: str) -> str:
    # The server's sentence without libpq's "connection to server at ... failed: FATAL:".
    found = _AUTH_FAILED.search(text)
    return text[found.start() :].splitlines()[0].strip() if found else "authentication failed"


def _user(url: str) -> str:
    try:
        user = psycopg.conninfo.conninfo_to_dict(url).get("user")
    except psycopg.ProgrammingError:
        user = None
    return str(user or os.environ.get("PGUSER") or getpass.getuser())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
