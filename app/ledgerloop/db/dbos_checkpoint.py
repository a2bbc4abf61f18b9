"""A statement of Ledgerloop's committed in the same transaction as a DBOS step's checkpoint.

DBOS writes a step's checkpoint (`SystemDatabase.record_operation_result`) after the step's
body returned: a transaction that checks this execution still owns the workflow and inserts
the step's row into dbos.operation_outputs. A step body that has something to commit only if
its result is journaled (a write the model asked for in this step's answer) can hand a
`Rider` to `ride`; the checkpoint then runs the rider's statement on the same connection,
inside the same transaction, after DBOS's own row: the two commit together or not at all,
and the statement costs one round trip, no commit of its own.

`install` replaces the checkpoint on this process's DBOS instance, where `applies` says DBOS's
own transaction can be reused (an unsharded Postgres system database); the replacement runs
DBOS's own `_record_operation_result_txn` (its owner check, its conflict rules, its retries)
and calls DBOS's checkpoint unchanged for every step that has no rider. The DBOS internal
`checkpoint-rider` (ledgerloop.dbos_internals) lists what this relies on; its contract test
compares the rows both write and checks that an execution that lost its workflow commits
neither.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import psycopg
from dbos._dbos import _get_dbos_instance
from dbos._sys_db import db_retry

from ledgerloop.db import dbos_journal

log = logging.getLogger(__name__)

#: `SystemDatabase.record_operation_result`'s shape.
Checkpoint = Callable[..., None]


class Rider(Protocol):
    """A statement to commit with one step's checkpoint."""

    def run(self, conn: psycopg.Connection[Any]) -> None:
        """Execute on `conn`, inside the checkpoint's transaction (not committed yet). Called
        again if DBOS retries the transaction after a connection failure."""

    def committed(self) -> None:
        """The checkpoint and the statement committed (not called when they did not)."""


_riders: dict[tuple[str, int], Rider] = {}
_lock = threading.Lock()


def ride(workflow_id: str, function_id: int, rider: Rider) -> None:
    """Commit `rider` with the checkpoint of operation `function_id` of `workflow_id` (the
    step now running: call it from the step's body). A later call for the same step replaces
    it. Only a step that succeeds carries it; a failed step's error is recorded alone."""
    with _lock:
        _riders[(workflow_id, function_id)] = rider


def drop(workflow_id: str, function_id: int) -> None:
    """Forget a rider its checkpoint did not take (the step failed, or another DBOS checked
    it): nothing of it was written."""
    with _lock:
        _riders.pop((workflow_id, function_id), None)


def _take(workflow_id: str, function_id: int) -> Rider | None:
    with _lock:
        return _riders.pop((workflow_id, function_id), None)


def applies(sys_db: Any) -> bool:
    """Whether `checkpoint` can run DBOS's own checkpoint transaction on `sys_db`."""
    return dbos_journal.applies(sys_db) and all(
        callable(getattr(sys_db, name, None))
        for name in ("record_operation_result", "_record_operation_result_txn", "_own_key")
    )


def checkpoint(sys_db: Any, original: Checkpoint) -> Checkpoint:
    """A drop-in for `sys_db.record_operation_result` that commits a step's rider with it."""

    def record(
        result: dict[str, Any],
        *,
        completed_at_epoch_ms: int | None = None,
        owner_xid: str | None = None,
        owner_key: str | None = None,
    ) -> None:
        rider = _take(result["workflow_uuid"], result["function_id"])
        if rider is None or result["error"] is not None or owner_key is not None:
            original(
                result,
                completed_at_epoch_ms=completed_at_epoch_ms,
                owner_xid=owner_xid,
                owner_key=owner_key,
            )
            return
        # Fixed outside the retry, as DBOS does: a retry after a commit whose answer was lost
        # finds its own row by this time, not a conflicting one.
        completed_at = completed_at_epoch_ms or int(time.time() * 1000)

        @db_retry(sys_db=sys_db)
        def once() -> None:
            with sys_db._own_key(result["workflow_uuid"]), sys_db.engine.begin() as c:
                sys_db._record_operation_result_txn(result, completed_at, c, owner_xid=owner_xid)
                rider.run(c.connection.driver_connection)

        once()
        rider.committed()

    return record


def install() -> bool:
    """Let steps' riders commit with their checkpoints on this process's DBOS (after
    DBOS.launch); False when DBOS's own checkpoint stays and no rider is ever taken (`ride`'s
    callers then commit their statements themselves: `installed` says which)."""
    sys_db = _get_dbos_instance()._sys_db
    if not applies(sys_db):
        log.info("DBOS's system database is not an unsharded Postgres: no checkpoint riders")
        return False
    original = type(sys_db).record_operation_result.__get__(sys_db)
    setattr(sys_db, "record_operation_result", checkpoint(sys_db, original))  # noqa: B010
    return True


def installed() -> bool:
    """Whether this process's DBOS checkpoints carry riders now (a benchmark's bare-DBOS
    stretch, `dbos_journal.dbos_own_check`, leaves them on: it registers none)."""
    try:
        sys_db = _get_dbos_instance()._sys_db
    except Exception:  # no DBOS launched in this process
        return False
    return "record_operation_result" in vars(sys_db)
