"""DBOS's step checkpoint as one statement, and a statement of Ledgerloop's committed with it.

DBOS writes a step's checkpoint (`SystemDatabase.record_operation_result`) after the step's
body returned: a transaction, built and compiled through SQLAlchemy, that locks the workflow's
row to check this execution still owns it and inserts the step's row into
dbos.operation_outputs (BEGIN, SELECT ... FOR NO KEY UPDATE, INSERT, COMMIT, on a connection
the pool pings first). On a worker that is a third of a step's time. The same write is one
statement on a connection of Ledgerloop's pool (`step_checkpoint`): one round trip and its
commit.

A step body that has something to commit only if its result is journaled (a write the model
asked for in this step's answer, agent.write_ahead) hands a `Rider` to `ride`: a SELECT
(typically of a function that writes). The checkpoint's statement then runs it after its own
row, and only when that row is this execution's (`step_checkpoint`): the two
commit together or not at all, in one round trip and one commit. The same statement reads
what the journal check of the step after would read, and answers that check ahead
(db.dbos_journal.answer_ahead) when it would find nothing: that step starts while the write
is sent on the event loop, where a check of its own waits for a pool thread and the GIL.

`install` replaces the checkpoint on this process's DBOS instance, for an unsharded Postgres
system database only (`applies`); anything else, a call that names a shard key, and a call
whose connection fails go to DBOS's own checkpoint (which retries until the database is
back), without the rider. The DBOS internal `step-checkpoint` (ledgerloop.dbos_internals)
lists what this relies on; its contract test compares the rows both write, and checks that
an execution that lost its workflow, or a step recorded already with another time, raises
what DBOS raises and commits nothing.

Each checkpoint this process wrote is remembered (`written`): the last of each workflow, for
the heartbeat's rewind check after a failover (fleet.heartbeat), which asks whether the
database still holds it. A gate (`gate_writes`, the worker's fence) holds a checkpoint back
while a heartbeat has failed and the rewind check has not run yet: a checkpoint written on a
database that lost the steps before it would leave a hole in the journal.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, LiteralString, Protocol

import psycopg
from dbos._context import current_owner_xid
from dbos._dbos import _get_dbos_instance
from dbos._error import DBOSStepNondeterminismError, DBOSWorkflowConflictIDError
from psycopg_pool import ConnectionPool

from ledgerloop.db import dbos_journal
from ledgerloop.db.sql import load_queries

log = logging.getLogger(__name__)

Q = load_queries("ledgerloop.db", "dbos_checkpoint.sql")

#: `SystemDatabase.record_operation_result`'s shape.
Checkpoint = Callable[..., None]


class Rider(Protocol):
    """A SELECT to commit with one step's checkpoint."""

    @property
    def query(self) -> LiteralString:
        """A SELECT with named parameters, run as a subquery of the checkpoint's statement:
        no data-modifying WITH (a function that writes is the way to write). A column named
        as one of the checkpoint's answer's (`CHECKPOINT_COLUMNS`) reads the checkpoint's."""

    @property
    def params(self) -> Mapping[str, Any]:
        """Its parameters; none named as the checkpoint's (`CHECKPOINT_PARAMS`)."""

    def committed(self, row: dict[str, Any]) -> None:
        """The checkpoint and the query committed; `row` holds the query's first row (its
        columns None when it returned none). Not called when they did not commit."""


#: The checkpoint's own parameters (a rider's must be named otherwise) and answer.
CHECKPOINT_PARAMS = frozenset(
    {
        "workflow_uuid",
        "function_id",
        "function_name",
        "started_at_epoch_ms",
        "completed_at_epoch_ms",
        "output",
        "error",
        "child_workflow_id",
        "serialization",
        "application_name",
        "owner_xid",
        "answer_next",
        "run_of_step",
    }
)
CHECKPOINT_COLUMNS = frozenset(
    {"owner_xid", "written", "completed_at_epoch_ms", "next_status", "next_recorded"}
)

_riders: dict[tuple[str, int], Rider] = {}
_lock = threading.Lock()

#: How long a checkpoint whose connection failed is retried through the pool before DBOS's
#: own checkpoint takes over.
RETRY_OWN_S = 30.0

#: workflow id -> (the last operation this process checkpointed for it, time.monotonic()).
_written: dict[str, tuple[int, float]] = {}
#: Called before each checkpoint (blocks while writes must wait; see `gate_writes`).
_gate: Callable[[], object] | None = None


def gate_writes(gate: Callable[[], object] | None) -> None:
    """Call `gate` before each checkpoint this process writes (None: no gate). It may block
    (bounded); it should not raise."""
    global _gate
    _gate = gate


def _wrote(workflow_id: str, function_id: int) -> None:
    with _lock:
        before = _written.get(workflow_id)
        if before is None or before[0] <= function_id:
            _written[workflow_id] = (function_id, time.monotonic())


#: effect key -> (the workflow whose step recorded it, time.monotonic()): writes this process
#: recorded outside a checkpoint (an act step's own record), for the same check.
_effects: dict[str, tuple[str, float]] = {}


def wrote_effect(workflow_id: str, key: str) -> None:
    """A step of `workflow_id` committed the record of the write under `key` by itself (not
    with a checkpoint): the rewind check asks for it too."""
    with _lock:
        _effects[key] = (workflow_id, time.monotonic())


def effects_written(max_age_s: float) -> dict[str, str]:
    """Effect key -> workflow id, for the writes recorded within `max_age_s`."""
    horizon = time.monotonic() - max_age_s
    with _lock:
        for key in [k for k, (_, at) in _effects.items() if at < horizon]:
            del _effects[key]
        return {k: wid for k, (wid, _) in _effects.items()}


def written(max_age_s: float) -> dict[str, int]:
    """The last operation this process checkpointed, per workflow, for the workflows it
    checkpointed within `max_age_s` (older ones are forgotten)."""
    horizon = time.monotonic() - max_age_s
    with _lock:
        for key in [k for k, (_, at) in _written.items() if at < horizon]:
            del _written[key]
        return {k: fid for k, (fid, _) in _written.items()}


def forget_all() -> None:
    """Forget every checkpoint remembered (a worker starting in this process: what an earlier
    one wrote, perhaps in another database, is not its own)."""
    with _lock:
        _written.clear()
        _effects.clear()


def forget(workflow_ids: Iterable[str]) -> None:
    """Drop what this process remembers writing for `workflow_ids` (they went back in time
    and are resumed from the journal the database holds)."""
    gone = set(workflow_ids)
    with _lock:
        for workflow_id in gone:
            _written.pop(workflow_id, None)
        for key in [k for k, (wid, _) in _effects.items() if wid in gone]:
            del _effects[key]


def ride(workflow_id: str, function_id: int, rider: Rider) -> None:
    """Commit `rider` with the checkpoint of operation `function_id` of `workflow_id` (the
    step now running: call it from the step's body). A later call for the same step replaces
    it. Only a step that succeeds carries it; a failed step's error is recorded alone.
    Raises ValueError for a rider whose parameters are named as the checkpoint's.

    DBOS checkpoints every step whose body returned, so each rider is taken; one of an
    earlier operation of the same workflow still here (its execution stopped between the
    body and the checkpoint) is dropped now: a workflow's steps run one at a time."""
    shared = CHECKPOINT_PARAMS.intersection(rider.params)
    if shared:
        raise ValueError(f"a rider's parameters {sorted(shared)} are the checkpoint's: rename them")
    with _lock:
        stale = [k for k in _riders if k[0] == workflow_id and k[1] < function_id]
        for key in stale:
            del _riders[key]
        _riders[(workflow_id, function_id)] = rider


def _take(workflow_id: str, function_id: int) -> Rider | None:
    with _lock:
        return _riders.pop((workflow_id, function_id), None)


def applies(sys_db: Any) -> bool:
    """Whether `step_checkpoint` writes what DBOS's checkpoint writes on `sys_db` (the same
    unsharded Postgres system database the journal check reads)."""
    try:
        return (
            dbos_journal.applies(sys_db)
            and callable(type(sys_db).record_operation_result)
            and isinstance(sys_db.app_name, str | None)
            # No column beyond those the statement writes (a sharded DBOS adds key columns).
            and sys_db._child_values(None) == {}
            and sys_db._wf_values("w") == {}
        )
    except Exception:  # another DBOS: its own checkpoint, whatever it does now
        return False


def checkpoint(sys_db: Any, pool: ConnectionPool[Any], original: Checkpoint) -> Checkpoint:
    """A drop-in for `sys_db.record_operation_result`: one statement on `pool`, and a step's
    rider in the same transaction."""

    def record(
        result: dict[str, Any],
        *,
        completed_at_epoch_ms: int | None = None,
        owner_xid: str | None = None,
        owner_key: str | None = None,
    ) -> None:
        workflow_id = result["workflow_uuid"]
        if _gate is not None:
            _gate()
        write(
            result,
            completed_at_epoch_ms=completed_at_epoch_ms,
            owner_xid=owner_xid,
            owner_key=owner_key,
        )
        _wrote(workflow_id, result["function_id"])

    def write(
        result: dict[str, Any],
        *,
        completed_at_epoch_ms: int | None = None,
        owner_xid: str | None = None,
        owner_key: str | None = None,
    ) -> None:
        workflow_id = result["workflow_uuid"]
        rider = _take(workflow_id, result["function_id"])
        if result["error"] is not None:
            rider = None  # a failed step's error is recorded alone
        if owner_key is not None:
            original(
                result,
                completed_at_epoch_ms=completed_at_epoch_ms,
                owner_xid=owner_xid,
                owner_key=owner_key,
            )
            return
        # Fixed before any retry, as DBOS does: a retry after a commit whose answer was lost
        # finds its own row by this time, not a conflicting one.
        completed_at = completed_at_epoch_ms or int(time.time() * 1000)
        owner = owner_xid if owner_xid is not None else current_owner_xid(workflow_id)
        params = {
            "workflow_uuid": workflow_id,
            "function_id": result["function_id"],
            "function_name": result["function_name"],
            "started_at_epoch_ms": result["started_at_epoch_ms"],
            "completed_at_epoch_ms": completed_at,
            "output": result["output"],
            "error": result["error"],
            "child_workflow_id": result["child_workflow_id"],
            "serialization": result["serialization"],
            "application_name": sys_db.app_name,
            "owner_xid": owner,
            "answer_next": rider is not None,
            # A run's workflow has the run's id: its steps are events of the run's stream.
            # Not with a rider: its query may move the run, and a row updated twice in one
            # statement keeps only the first update (the rider's would be lost).
            "run_of_step": _run_id(workflow_id) if rider is None else None,
        }

        def attempt() -> None:
            with pool.connection() as conn:
                conn.autocommit = True
                try:
                    if rider is not None:
                        row = _with_rider(conn, params, rider)
                        if row is not None:
                            _verdict(row, result, completed_at)  # raises: neither committed
                            rider.committed(row)
                            _answer_next(row, workflow_id, result["function_id"], owner)
                            return
                        # The rider failed: the checkpoint alone answers nothing ahead, so
                        # its statement need not read the next operation either.
                        params["answer_next"] = False
                    row = conn.execute(ALONE, params).fetchone()
                    _verdict(row, result, completed_at)
                finally:
                    conn.autocommit = False

        # The connection failed (a restart, a failover): again through the pool for a while,
        # rider and all, so that the pool's guard (the worker's fence: after a failover it
        # waits for the rewind check, and refuses an execution whose run went back to the
        # journal) sees the retry; a row an earlier attempt committed is found with the same
        # time. Then DBOS's own checkpoint, which waits for the database (db_retry), alone.
        deadline = time.monotonic() + RETRY_OWN_S
        pause = 0.05
        while True:
            try:
                attempt()
                return
            except psycopg.OperationalError:
                if time.monotonic() + pause > deadline:
                    break
                time.sleep(pause)
                pause = min(pause * 2, 1.0)
        original(result, completed_at_epoch_ms=completed_at, owner_xid=owner_xid)

    return record


def _run_id(workflow_id: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(workflow_id)
    except ValueError:
        return None


def _with_rider(
    conn: psycopg.Connection[Any], params: dict[str, Any], rider: Rider
) -> dict[str, Any] | None:
    """The checkpoint and `rider` in one autocommit statement: the checkpoint's answer with
    the rider's first row (the rider runs only when the checkpoint's row is this
    execution's). None when the rider failed: nothing committed, and the checkpoint is to
    be written alone (the rider is a shortcut; the step it serves does its work itself
    then)."""
    try:
        row: dict[str, Any] | None = conn.execute(
            _with(rider.query), {**params, **rider.params}
        ).fetchone()
    except psycopg.OperationalError:
        raise
    except psycopg.Error:
        log.warning("a checkpoint's rider failed; the checkpoint is written alone", exc_info=True)
        return None
    return row


@functools.lru_cache(maxsize=16)
def _with(query: LiteralString) -> LiteralString:
    # One text per kind of rider, so the statement is prepared once per connection.
    return Q["step_checkpoint"].replace("RIDER_QUERY", query)


#: The checkpoint with no rider.
ALONE = _with("SELECT WHERE false")


def _answer_next(
    row: dict[str, Any], workflow_id: str, function_id: int, owner: str | None
) -> None:
    """The next operation's journal check answered ahead when it would find nothing to
    replay and no cancellation (anything else: that check runs and says so itself)."""
    status = row["next_status"]
    if status is not None and status != "CANCELLED" and row["next_recorded"] is False:
        dbos_journal.answer_ahead(workflow_id, function_id + 1, owner)


def _verdict(row: dict[str, Any] | None, result: dict[str, Any], completed_at: int) -> None:
    """Raise what DBOS's checkpoint raises for what `step_checkpoint` found: another owner,
    or a row already there with another completion time (not this attempt's retry)."""
    assert row is not None  # the statement always answers one row
    if not row["written"]:
        raise DBOSWorkflowConflictIDError(result["workflow_uuid"])
    stored = row["completed_at_epoch_ms"]
    if stored is None or int(stored) != completed_at:
        raise DBOSStepNondeterminismError(result["workflow_uuid"], result["function_id"])


def install(pool: ConnectionPool[Any]) -> bool:
    """Write this process's DBOS step checkpoints through `pool`, riders with them (after
    DBOS.launch); False when DBOS's own checkpoint stays and no rider is ever taken (`ride`'s
    callers then commit their statements themselves: `installed` says which)."""
    sys_db = _get_dbos_instance()._sys_db
    if not applies(sys_db):
        log.info("DBOS's system database is not an unsharded Postgres: its own checkpoint")
        return False
    original = type(sys_db).record_operation_result.__get__(sys_db)
    # On the instance, so DBOS's class (and any other DBOS in the process) keeps its own.
    setattr(sys_db, "record_operation_result", checkpoint(sys_db, pool, original))  # noqa: B010
    return True


@contextmanager
def dbos_own_checkpoint() -> Iterator[None]:
    """DBOS's own checkpoint for this process while inside (benchmarks: bare DBOS's
    workflows, run in a worker's DBOS instance, are measured as DBOS makes them; no step
    there hands over a rider)."""
    sys_db = _get_dbos_instance()._sys_db
    ours = vars(sys_db).pop("record_operation_result", None)
    try:
        yield
    finally:
        if ours is not None:
            setattr(sys_db, "record_operation_result", ours)  # noqa: B010


def installed() -> bool:
    """Whether this process's DBOS checkpoints are Ledgerloop's, riders included."""
    try:
        sys_db = _get_dbos_instance()._sys_db
    except Exception:  # no DBOS launched in this process
        return False
    return "record_operation_result" in vars(sys_db)
