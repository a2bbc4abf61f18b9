"""Retention: delete finished runs from both schemas, in short batches.

A run is purged when it is finished (succeeded, failed or cancelled) before the cutoff, every
effect it owns is settled (succeeded or failed: a run never leaves an effect without its
owner), and its DBOS workflow is no longer active (a run whose status committed in its last
step is closed by DBOS a moment later; until then it is skipped).

Each batch:

1. reads a page of finished runs from `agent_run` in finishing order (keyset cursor on the
   partial index `agent_run_finished`, so a run that is skipped is never read again by the
   same purge);
2. drops the runs with unsettled effects (one query) and those whose workflow DBOS still
   runs (`DBOSClient.list_workflows`);
3. deletes the DBOS side through DBOS's own `delete_workflows` (one transaction: inputs,
   outputs, the journal in `operation_outputs`, the status row, and by cascade its messages,
   events, event history and streams);
4. deletes Ledgerloop's side in one transaction: the run and everything it owns (events,
   messages, payloads, approvals, effects and their outbox rows, by cascade); or, keeping the
   audit history, only the messages, payloads and closed outbox rows, marking the run
   `journal_purged_at`.

DBOS first: a crash between the two leaves a finished run without a journal, which the next
purge finds and finishes (deleting a workflow that is gone is a no-op); the other order would
leave DBOS rows that no purge could find again.

Each transaction is kept short: the batch shrinks when one takes longer than
`target_txn_s` and grows back when it is fast, so rows are never locked for long and the
workers' own transactions never queue behind a purge.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from dbos import DBOSClient, DBOSPortableJSONSerializer

from ledgerloop.agent.memory import messages_delete_for_runs
from ledgerloop.db.connect import Conn
from ledgerloop.db.errors import translated
from ledgerloop.db.pooling import engine_connect_args
from ledgerloop.db.sql import load_queries
from ledgerloop.effects.ledger import effects_unsettled_runs, outbox_delete_for_runs
from ledgerloop.runs.retention import (
    CURSOR_START,
    runs_delete_finished,
    runs_finished_page,
    runs_mark_journal_purged,
)
from ledgerloop.tools.payloads import payloads_delete_for_runs

Q = load_queries("ledgerloop.retention")

#: DBOS statuses of a workflow that may still execute: its run is not purged yet.
ACTIVE_WORKFLOW = ["PENDING", "ENQUEUED", "DELAYED"]


class PurgeClient:
    """A DBOS client for purging (DBOSClient over an engine of its own); `close()` it."""

    def __init__(self, database_url: str) -> None:
        # A batch is deleted by primary key. On tables of a few tens of thousands of rows the
        # planner prefers to scan a whole table per statement (five tables per batch), which
        # made DBOS's delete_workflows several times slower than the rows it deletes; these
        # connections serve only lookups by key, so sequential scans are off in each of
        # their transactions. SET LOCAL, not a startup option or a session SET: a
        # transaction-mode pooler refuses startup options, and would hand a session setting
        # to its next client.
        url = sa.make_url(database_url).set(drivername="postgresql+psycopg")
        self.engine = sa.create_engine(
            url,
            pool_size=2,
            max_overflow=0,
            pool_pre_ping=True,
            connect_args=engine_connect_args(database_url, "ledgerloop-purge"),
        )
        sa.event.listen(self.engine, "begin", _by_key_plans)
        with translated(database_url, "connecting"):
            self.dbos = DBOSClient(
                system_database_engine=self.engine, serializer=DBOSPortableJSONSerializer()
            )

    def close(self) -> None:
        self.dbos.destroy()
        self.engine.dispose()


def _by_key_plans(conn: sa.Connection) -> None:
    # Through the driver: the transaction SQLAlchemy just began starts with this statement.
    driver = conn.connection.driver_connection
    assert driver is not None
    driver.execute("SET LOCAL enable_seqscan = off")


@dataclass
class PurgeReport:
    #: Runs purged: deleted whole, or (keep_audit) stripped of journal and messages.
    runs: int = 0
    #: Finished runs left alone because DBOS still runs their workflow.
    skipped_active: int = 0
    #: Finished runs left alone because an effect of theirs is not settled.
    skipped_unsettled: int = 0
    batches: int = 0
    #: The longest single transaction of the purge (on either schema), in seconds.
    longest_txn_s: float = 0.0
    elapsed_s: float = 0.0

    def merge(self, other: PurgeReport) -> None:
        self.runs += other.runs
        self.skipped_active += other.skipped_active
        self.skipped_unsettled += other.skipped_unsettled
        self.batches += other.batches
        self.longest_txn_s = max(self.longest_txn_s, other.longest_txn_s)
        self.elapsed_s += other.elapsed_s

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "skipped_active": self.skipped_active,
            "skipped_unsettled": self.skipped_unsettled,
            "batches": self.batches,
            "longest_txn_s": round(self.longest_txn_s, 4),
            "elapsed_s": round(self.elapsed_s, 3),
        }


@dataclass(frozen=True)
class PurgeOptions:
    #: Keep agent_run, agent_run_event, approvals and effects; drop the journal (DBOS's rows),
    #: messages, payloads and closed outbox rows.
    keep_audit: bool = False
    batch_size: int = 500
    max_batch_size: int = 2000
    min_batch_size: int = 50
    #: Shrink the batch when a transaction takes longer than this; grow it below a quarter.
    target_txn_s: float = 0.2
    #: Stop after this many batches (None: until no finished run is left before the cutoff).
    max_batches: int | None = None


def purge_finished(
    conn: Conn,
    client: DBOSClient,
    cutoff: datetime,
    options: PurgeOptions | None = None,
    *,
    should_stop: Callable[[], bool] = lambda: False,
) -> PurgeReport:
    """Purge runs that finished before `cutoff`; `conn` must be in autocommit mode.

    `client` is best a PurgeClient's `dbos` (any DBOSClient works, more slowly). Batches are
    pipelined: DBOS's side of one batch is deleted (on the client's connections) while
    Ledgerloop's side of the batch before it is (on `conn`); each batch's DBOS side still
    commits before its Ledgerloop side starts.
    """
    options = options or PurgeOptions()
    report = PurgeReport()
    started = time.monotonic()
    cursor = CURSOR_START
    size = options.batch_size
    pending: tuple[list[uuid.UUID], Future[float]] | None = None
    with ThreadPoolExecutor(1, thread_name_prefix="ledgerloop-purge") as dbos_side:

        def finish_pending() -> None:
            nonlocal pending, size
            if pending is None:
                return
            ids, deleted = pending
            pending = None
            dbos_s = deleted.result()
            ours_s = _purge_ours(conn, ids, keep_audit=options.keep_audit)
            longest = max(dbos_s, ours_s)
            report.runs += len(ids)
            report.longest_txn_s = max(report.longest_txn_s, longest)
            if longest > options.target_txn_s:
                size = max(options.min_batch_size, size // 2)
            elif longest < options.target_txn_s / 4:
                size = min(options.max_batch_size, size * 2)

        try:
            while not should_stop():
                if options.max_batches is not None and report.batches >= options.max_batches:
                    break
                requested = size
                page = runs_finished_page(
                    conn,
                    cutoff=cutoff,
                    after=cursor,
                    limit=requested,
                    with_journal_only=options.keep_audit,
                )
                if not page:
                    break
                cursor = page[-1]
                ids = [run_id for _, run_id in page]
                unsettled = effects_unsettled_runs(conn, ids)
                ids = [run_id for run_id in ids if run_id not in unsettled]
                active = _active_workflows(client, ids)
                ids = [run_id for run_id in ids if run_id not in active]
                report.skipped_unsettled += len(unsettled)
                report.skipped_active += len(active)
                report.batches += 1
                if ids:
                    if pending is not None:
                        pending[1].result()  # DBOS deletes go one at a time, in order
                    deleted = dbos_side.submit(_purge_dbos, client, ids)
                    finish_pending()  # the batch before, while this one's DBOS side runs
                    pending = (ids, deleted)
                if len(page) < requested:
                    break  # a short page: nothing more before the cutoff
        finally:
            finish_pending()
    report.elapsed_s = time.monotonic() - started
    return report


def _active_workflows(client: DBOSClient, ids: list[uuid.UUID]) -> set[uuid.UUID]:
    """The runs whose workflow, or one of its child episodes, may still execute."""
    if not ids:
        return set()
    keys = [str(run_id) for run_id in ids]
    found = client.list_workflows(
        workflow_ids=keys, status=ACTIVE_WORKFLOW, load_input=False, load_output=False
    )
    children = client.list_workflows(
        parent_workflow_id=keys, status=ACTIVE_WORKFLOW, load_input=False, load_output=False
    )
    return {uuid.UUID(s.workflow_id) for s in found} | {
        uuid.UUID(s.parent_workflow_id) for s in children if s.parent_workflow_id
    }


def _purge_dbos(client: DBOSClient, ids: list[uuid.UUID]) -> float:
    """DBOS's side of a batch, through its own API; returns the transaction's duration."""
    began = time.monotonic()
    keys = [str(run_id) for run_id in ids]
    # A run's child episodes (ledgerloop.agent.episodes) go with it. They start no workflows
    # of their own, so one indexed lookup for the batch finds them all (delete_children would
    # walk each run separately, a query per run).
    children = client.list_workflows(parent_workflow_id=keys, load_input=False, load_output=False)
    client.delete_workflows([*keys, *(s.workflow_id for s in children)], delete_children=False)
    return time.monotonic() - began


def _purge_ours(conn: Conn, ids: list[uuid.UUID], *, keep_audit: bool) -> float:
    """Ledgerloop's side of a batch, one transaction; returns its duration."""
    began = time.monotonic()
    with conn.transaction():
        conn.execute(Q["purge_by_key_plans"])  # as PurgeClient's connections, for this txn
        if keep_audit:
            messages_delete_for_runs(conn, ids)
            payloads_delete_for_runs(conn, ids)
            outbox_delete_for_runs(conn, ids)
            runs_mark_journal_purged(conn, ids)
        else:
            # Conversation messages carry no foreign key (a check per row on the hot path cost
            # more than it protected), so the cascade does not reach them.
            messages_delete_for_runs(conn, ids)
            runs_delete_finished(conn, ids)
    return time.monotonic() - began
