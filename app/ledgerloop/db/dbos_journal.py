"""DBOS's journal check before every operation, as one autocommit statement.

Before each step, recv, sleep or send of a workflow, DBOS asks its system database whether the
operation is already recorded (`SystemDatabase.check_operation_execution`): BEGIN, a SELECT of
the workflow's status, a SELECT of the operation's row, COMMIT, each statement built and
compiled through SQLAlchemy. On a worker executing hundreds of runs that is the largest single
share of its CPU after the model SDK, and four round trips per operation. The same answer is
one statement on a connection of Ledgerloop's pool (`journal_check`): one round trip, no
compilation, and a single snapshot where DBOS's two reads take one each.

`install` replaces the check on this process's DBOS instance, for an unsharded Postgres system
database only; anything else, and any call that names a shard key, goes to DBOS's own check,
as does a call whose connection fails (DBOS's check retries). The DBOS internal
`journal-check` (ledgerloop.dbos_internals) lists what this relies on; its contract test
compares both checks on the same journal.

A check can also be answered ahead (`answer_ahead`): the checkpoint that carries a write
(db.dbos_checkpoint) reads, in its own statement, what the check of the operation after it
would read, and when that is "not recorded, not cancelled" the next step starts without a
check of its own (agent.dbos_step_start takes the answer). That step starts while the write
is being sent on the same event loop, where the check's trip through a pool thread waits
for the GIL. An answer is kept for one execution (its owner token), is taken once, and
expires after `AHEAD_S`: a cancellation committed in that short window is seen at the step
after, as one committed just after a check is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from dbos._dbos import _get_dbos_instance
from dbos._error import DBOSUnexpectedStepError, DBOSWorkflowCancelledError
from psycopg_pool import ConnectionPool

from ledgerloop.db.sql import load_queries

log = logging.getLogger(__name__)

Q = load_queries("ledgerloop.db", "dbos_journal.sql")

#: `SystemDatabase.check_operation_execution`'s shape: a recorded result, or None.
Check = Callable[..., dict[str, Any] | None]

#: How long an answer given ahead stands. The step it answers starts within a millisecond
#: or two of the checkpoint that read it; one that starts later checks for itself.
AHEAD_S = 0.1

#: (workflow id, operation id) -> (the execution's owner token, when it was read).
_ahead: dict[tuple[str, int], tuple[str | None, float]] = {}
_ahead_lock = threading.Lock()


def answer_ahead(workflow_id: str, function_id: int, owner: str | None) -> None:
    """Record, for execution `owner`, that operation `function_id` of `workflow_id` is not
    in the journal and the workflow is not cancelled: read just now, in the same statement
    as the checkpoint of the operation before it. Expired answers are dropped here."""
    now = time.monotonic()
    with _ahead_lock:
        stale = [key for key, (_, at) in _ahead.items() if now - at > AHEAD_S]
        for key in stale:
            del _ahead[key]
        _ahead[(workflow_id, function_id)] = (owner, now)


def take_ahead(workflow_id: str, function_id: int, owner: str | None) -> bool:
    """Whether the check of operation `function_id` was answered ahead for this execution,
    and recently enough: then it is not recorded and the workflow was not cancelled. Taken
    once: a second call (a retry of the same operation) checks for itself."""
    with _ahead_lock:
        given = _ahead.pop((workflow_id, function_id), None)
    if given is None:
        return False
    given_to, at = given
    return given_to == owner and time.monotonic() - at <= AHEAD_S


def applies(sys_db: Any) -> bool:
    """Whether `journal_check` reads what DBOS's check reads on `sys_db`."""
    try:
        return (
            callable(type(sys_db).check_operation_execution)
            and sys_db.engine.dialect.name == "postgresql"
            and not sys_db.sharded
            and sys_db.schema == "dbos"
            and sys_db._key_column(sys_db.tables.operation_outputs, "child_shard_key") is None
        )
    except AttributeError:  # another DBOS: its own check, whatever it does now
        return False


def journal_check(pool: ConnectionPool[Any], fallback: Check) -> Check:
    """A drop-in for `SystemDatabase.check_operation_execution` reading through `pool`."""

    def check(
        workflow_id: str, function_id: int, function_name: str, *, owner_key: str | None = None
    ) -> dict[str, Any] | None:
        if owner_key is not None:
            return fallback(workflow_id, function_id, function_name, owner_key=owner_key)
        try:
            with pool.connection() as conn:
                conn.autocommit = True
                try:
                    row = conn.execute(
                        Q["journal_check"],
                        {"workflow_id": workflow_id, "function_id": function_id},
                    ).fetchone()
                finally:
                    conn.autocommit = False
        except psycopg.OperationalError:
            return fallback(workflow_id, function_id, function_name)
        return answer(row, workflow_id, function_id, function_name)

    return check


def answer(
    row: dict[str, Any] | None, workflow_id: str, function_id: int, function_name: str
) -> dict[str, Any] | None:
    """What DBOS's check returns or raises for the row `journal_check` read."""
    # DBOS asserts the workflow exists; the same message, the same exception. Raised, not
    # asserted: `python -O` would drop an assert, and pytest's rewriting would lengthen it.
    if row is None:
        raise AssertionError(f"Error: Workflow {workflow_id} does not exist")
    if row["status"] == "CANCELLED":
        raise DBOSWorkflowCancelledError(f"Workflow {workflow_id} is cancelled. Aborting function.")
    if not row["recorded"]:
        return None
    if row["function_name"] != function_name:
        raise DBOSUnexpectedStepError(
            workflow_id=workflow_id,
            step_id=function_id,
            expected_name=function_name,
            recorded_name=row["function_name"],
        )
    return {
        "output": row["output"],
        "error": row["error"],
        "serialization": row["serialization"],
        "child_workflow_id": row["child_workflow_id"],
        "child_shard_key": None,
    }


def install(pool: ConnectionPool[Any]) -> bool:
    """Check this process's DBOS journal through `pool` (after DBOS.launch); False when DBOS's
    own check stays (see `applies`)."""
    sys_db = _get_dbos_instance()._sys_db
    if not applies(sys_db):
        log.info("DBOS's system database is not an unsharded Postgres: its own journal check")
        return False
    original = type(sys_db).check_operation_execution.__get__(sys_db)
    # On the instance, so DBOS's class (and any other DBOS in the process) keeps its own.
    setattr(sys_db, "check_operation_execution", journal_check(pool, original))  # noqa: B010
    return True


@contextmanager
def dbos_own_check() -> Iterator[None]:
    """DBOS's own journal check for this process while inside (benchmarks: bare DBOS's
    workflows, run in a worker's DBOS instance, are measured as DBOS makes them)."""
    sys_db = _get_dbos_instance()._sys_db
    ours = vars(sys_db).pop("check_operation_execution", None)
    try:
        yield
    finally:
        if ours is not None:
            setattr(sys_db, "check_operation_execution", ours)  # noqa: B010
