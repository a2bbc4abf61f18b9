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


#: The limits on a run's input, enforced alike by the SQL function (which every path calls)
#: and, earlier and with the same words, by the HTTP API. Migration 0015 holds the SQL copy;
#: tests/integration/test_input_limits.py checks that both refuse at the same place.
MAX_INPUT_BYTES = 256 * 1024
MAX_INPUT_DEPTH = 64


def input_too_deep(value: Any, max_depth: int = MAX_INPUT_DEPTH) -> bool:
    """Whether `value` nests objects and arrays more than `max_depth` levels deep.

    Level by level, not recursively: a hostile document cannot exhaust the stack.
    """
    level = [value] if isinstance(value, dict | list) else []
    depth = 0
    while level:
        depth += 1
        if depth > max_depth:
            return True
        children: list[Any] = []
        for item in level:
            inner = item.values() if isinstance(item, dict) else item
            children.extend(child for child in inner if isinstance(child, dict | list))
        level = children
    return False


def depth_problem(max_depth: int = MAX_INPUT_DEPTH) -> str:
    """The refusal's wording, shared with the SQL function's."""
    return f"input is nested more than {max_depth} levels deep, over the {max_depth}-level limit"


class UnknownRole(LedgerloopError):
    """The role to grant to does not exist."""

    status_code: ClassVar[int] = 422


#: Custom SQLSTATEs raised by Ledgerloop's SQL functions -> the error each one becomes.
SQLSTATE_ERRORS: dict[str, type[LedgerloopError]] = {
    "LL001": InvalidRunInput,
    "LL002": UnknownRole,
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


def grant_start_run(conn: Conn, role: str) -> None:
    """Let the database role `role` call ledgerloop.start_run from its own transactions.

    Runs `ledgerloop.grant_start_run(role)` (migration 0024) as the schema's owner: the role
    may call `start_run` (SECURITY DEFINER) and `run_traceparent`, and nothing else in
    either schema (docs/security.md). Raises UnknownRole.
    """
    with sqlstate_translated():
        conn.execute("SELECT ledgerloop.grant_start_run(%(role)s)", {"role": role})
