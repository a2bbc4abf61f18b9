"""`start_run`: the Python twin of the SQL function ledgerloop.start_run.

Both paths are one: this calls the SQL function, so a run started from Python, from SQL or
from a trigger is created, validated and enqueued the same way. It runs in the caller's
transaction (on an autocommit connection, in its own); roll it back and neither the run nor
its workflow exists. docs/sql_start_run.md describes the function.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import psycopg
from psycopg.types.json import Jsonb

from ledgerloop.db.connect import Conn
from ledgerloop.errors import LedgerloopError


class InvalidRunInput(LedgerloopError):
    """The agent name, input, idempotency key or tenant given to start_run is invalid."""

    status_code: ClassVar[int] = 422


#: Custom SQLSTATEs raised by Ledgerloop's SQL functions -> the error each one becomes.
SQLSTATE_ERRORS: dict[str, type[LedgerloopError]] = {
    "LL001": InvalidRunInput,
}

_START_RUN = (
    "SELECT ledgerloop.start_run(%(agent)s, %(input)s, %(idempotency_key)s, %(tenant_id)s)"
    " AS run_id"
)


@contextmanager
def sqlstate_translated() -> Iterator[None]:
    """The one place a custom SQLSTATE becomes a LedgerloopError (message and hint kept)."""
    try:
        yield
    except psycopg.Error as exc:
        error = SQLSTATE_ERRORS.get(exc.sqlstate or "")
        if error is None:
            raise
        raise error(exc.diag.message_primary, fix=exc.diag.message_hint) from exc


def start_run(
    conn: Conn,
    *,
    agent: str,
    input: dict[str, Any],
    idempotency_key: str | None = None,
    tenant_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """Create a run and enqueue its workflow; returns the run id.

    The same idempotency key (per tenant) returns the first run's id and enqueues nothing.
    Without tenant_id the run belongs to the transaction's tenant scope, else to the default
    tenant. Raises InvalidRunInput for a bad agent name, a non-object or oversized input.
    """
    with sqlstate_translated():
        row = conn.execute(
            _START_RUN,
            {
                "agent": agent,
                "input": Jsonb(input),
                "idempotency_key": idempotency_key,
                "tenant_id": tenant_id,
            },
        ).fetchone()
    assert row is not None
    run_id: uuid.UUID = row["run_id"]
    return run_id
