"""Failure classes: transient failures are retried within a budget, bugs are raised at once."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import psycopg.errors
import pytest
import sqlalchemy.exc

from ledgerloop.db.errors import DatabaseUnreachable
from ledgerloop.failures import describe, error_name, is_transient, retry_transient
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import InvalidTransition


@pytest.mark.parametrize(
    "exc",
    [
        psycopg.OperationalError("connection failed: Connection refused"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.errors.SerializationFailure("could not serialize access"),
        sqlalchemy.exc.OperationalError("SELECT 1", {}, psycopg.OperationalError("gone")),
        sqlalchemy.exc.TimeoutError("QueuePool limit reached"),
        DatabaseUnreachable("cannot reach the database"),
        ConnectionResetError("reset by peer"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_database_and_network_failures_are_transient(exc: BaseException) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        KeyError("kf-1"),
        TypeError("unsupported operand"),
        psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
        psycopg.errors.UndefinedTable('relation "x" does not exist'),
        InvalidTransition(RunStatus.FAILED, RunStatus.PLANNING, str(uuid.uuid4())),
    ],
    ids=lambda e: type(e).__name__,
)
def test_bugs_and_refusals_are_not_transient(exc: BaseException) -> None:
    assert not is_transient(exc)


def test_an_error_read_back_from_the_journal_keeps_its_class_name() -> None:
    from dbos._serialization import PortableWorkflowError

    journaled = PortableWorkflowError("'kf-1'", "KeyError")
    assert error_name(journaled) == "KeyError"
    assert describe(journaled) == {"type": "KeyError", "message": "'kf-1'"}
    assert describe(KeyError("kf-1")) == describe(journaled)


def test_a_transient_failure_is_retried_and_a_bug_is_not() -> None:
    calls: list[str] = []

    def flaky(kind: str) -> str:
        calls.append(kind)
        if kind == "transient" and len(calls) < 3:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        if kind == "bug":
            raise KeyError(kind)
        return "ok"

    assert retry_transient(flaky, 30, "test")("transient") == "ok"
    assert calls == ["transient"] * 3
    calls.clear()
    with pytest.raises(KeyError):
        retry_transient(flaky, 30, "test")("bug")
    assert calls == ["bug"]


def test_the_budget_bounds_the_retries_of_an_async_body() -> None:
    calls = 0

    async def down() -> None:
        nonlocal calls
        calls += 1
        raise psycopg.OperationalError("connection refused")

    with pytest.raises(psycopg.OperationalError):
        asyncio.run(retry_transient(down, 0.5, "test")())
    # 0.2 s, then 0.4 s would pass the half-second budget: two attempts.
    assert calls == 2
