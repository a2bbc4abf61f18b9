"""The fleet's uses of DBOS 3.4 internals, in one place (each says why nothing public does it).

- Dispatch claims a bounded batch of Ledgerloop's queue and starts it when a NOTIFY arrives:
  DBOS's queue thread only polls (its wait cannot be woken) and claims everything its
  worker's concurrency allows in one go, which hands a whole burst to one worker. We call
  the same two functions its poll calls (`start_queued_workflows`, then
  `execute_dequeued_workflow`), so the claim keeps DBOS's own rules (versions, application
  name, deadlines, recovery attempts). Where DBOS's claim reduces to one statement (its
  claim of a queue with only a worker concurrency, on an unsharded Postgres), the
  dispatcher runs that statement on its own connection instead (`queue_claim` in
  fleet/queries.sql): DBOS builds two SQLAlchemy statements per claim and its caller reads
  the rows back, about 6 ms of a 2-core machine's CPU between a run's commit and its first
  step; the statement returns the rows as DBOS reads them.
- A claimed batch is handed to the event loop without waiting for each workflow's task to
  exist (`start_claimed`): DBOS's start blocks on the loop once per workflow, which on a
  worker already busy (a takeover's survivors) held the next claim back by a loop iteration.
- The fence reads an execution's ownership token, which DBOS keeps in its context and checks
  only when it writes a checkpoint, after the step body already ran.
- The internal queue (DBOS's `resume_workflow` target) is polled every second by default,
  with no setting; Ledgerloop slows it, since its own runs never sit there.
- DBOS's background jobs (DELAYED workflows due, workflow timeouts) run every second, with
  no setting; Ledgerloop slows them too: a hibernated run is woken by its message at once
  (a trigger), only its deadline waits for this sweep.
- A stopping worker cancels its executions between steps; DBOS logs each cancelled task at
  WARNING with the step's arguments (conversation text), which must not reach the log:
  those lines are dropped.
- An execution that lost its workflow is parked by DBOS: it polls for the new owner's
  outcome once a second for as long as the run lasts. Ledgerloop ends that task instead
  (fleet.guard.executing), recognising the loss by DBOS's own error type.
- DBOS's queue manager thread lists the queues table every second, with no setting, to start
  a poller for each queue it listens to; a worker listens to none of them
  (`DBOS.listen_queues([])`), so every row it reads is dropped: Ledgerloop answers that
  thread's question with no rows instead of a statement (`quiet_queue_manager`).
- DBOS's engine pings each connection on checkout unless told otherwise (a setting, public).
- Behind a transaction-mode pooler DBOS runs without LISTEN; the dispatcher's direct
  connection LISTENs on DBOS's message channel and sets DBOS's waiters as its listener would
  (`signal_message_waiters`).
- A worker's DBOS opens no listener connection of its own: the dispatcher's LISTENs on
  DBOS's three channels and forwards each notification (`share_dbos_listener`,
  `forward_dbos_notification`), one connection fewer per process (db/footprint.py).
- After a reconnection the worker sets every message waiter (`wake_all_message_waiters`):
  notifications sent while DBOS's listener was away are lost, and DBOS re-checks only every
  minute.
- DBOS's engine's new connections read the server's timeline before DBOS uses them
  (`watch_dbos_connections`): its own writes must not land on a promoted replica before the
  worker's rewind check.

tests/integration/test_fleet_dispatch.py and test_fleet_takeover.py fail if any of these
stops working.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from dbos._context import get_local_dbos_context
from dbos._core import execute_dequeued_workflow
from dbos._dbos import _get_dbos_instance
from dbos._error import DBOSWorkflowConflictIDError
from dbos._sys_db import (
    _dbos_notifications_channel,
    _dbos_streams_channel,
    _dbos_workflow_events_channel,
)
from dbos._utils import GlobalParams, generate_uuid
from psycopg.rows import dict_row

from ledgerloop.db.sql import load_queries

Q = load_queries("ledgerloop.fleet")

#: The channel DBOS's trigger on its notifications table notifies a message's waiter key on.
DBOS_NOTIFICATIONS_CHANNEL = _dbos_notifications_channel


#: DBOS's channels for workflow events and streams (notified by its notifier thread).
DBOS_EVENTS_CHANNEL = _dbos_workflow_events_channel
DBOS_STREAMS_CHANNEL = _dbos_streams_channel
#: Every channel DBOS's own listener LISTENs on.
DBOS_CHANNELS = (DBOS_NOTIFICATIONS_CHANNEL, DBOS_EVENTS_CHANNEL, DBOS_STREAMS_CHANNEL)


def signal_message_waiters(payload: str) -> None:
    """Do what DBOS's own listener does with a message notification: set the waiters of its
    key. Behind a transaction-mode pooler DBOS runs without LISTEN (its listener would
    LISTEN through the pooler and hear nothing), and the dispatcher's direct connection
    hears these for it."""
    forward_dbos_notification(DBOS_NOTIFICATIONS_CHANNEL, payload)


def forward_dbos_notification(channel: str, payload: str | None) -> None:
    """Do what DBOS's listener does with a notification on one of its channels: set the
    event waiting under the payload's key (messages, workflow events, stream writes)."""
    if not payload:
        return
    sys_db = _get_dbos_instance()._sys_db
    waiting = {
        DBOS_NOTIFICATIONS_CHANNEL: sys_db.notifications_map,
        DBOS_EVENTS_CHANNEL: sys_db.workflow_events_map,
        DBOS_STREAMS_CHANNEL: sys_db.streams_map,
    }.get(channel)
    event = waiting.get(payload) if waiting is not None else None
    if event is not None:
        event.set()


#: Set while this process's DBOS hears its notifications through Ledgerloop's listener.
_shared_listener = False
_own_listener: Any = None


def share_dbos_listener(shared: bool) -> None:
    """Whether the DBOS launched next in this process gives up its own LISTEN connection.

    DBOS's listener thread holds a connection of its own for LISTEN on its three channels;
    the dispatcher already holds one, so it LISTENs on DBOS's channels too and forwards each
    notification (`forward_dbos_notification`): one connection fewer per worker. DBOS has no
    setting for this (use_listen_notify=False would also stop its notifier, and its waits
    would poll), so its listener method is wrapped: for this process's DBOS it returns at
    once, after DBOS marked its listener running (its waits then re-check the database only
    as a fallback, every 60 s). Any other DBOS system database in the process (a DBOSClient
    with use_listen_notify) keeps its own listener."""
    global _shared_listener, _own_listener
    from dbos._sys_db_postgres import PostgresSystemDatabase

    if _own_listener is None:
        _own_listener = PostgresSystemDatabase._notification_listener

        def listener(self: PostgresSystemDatabase) -> None:
            if _shared_listener and self.use_listen_notify and _is_launched_sys_db(self):
                return None
            _own_listener(self)
            return None

        PostgresSystemDatabase._notification_listener = listener  # type: ignore[method-assign]
    _shared_listener = shared


def _is_launched_sys_db(sys_db: object) -> bool:
    try:
        return _get_dbos_instance()._sys_db is sys_db
    except Exception:
        return False


def dbos_listener_shared() -> bool:
    """True while this process's DBOS runs without its own listener (tests read it)."""
    return _shared_listener


def execution_owner() -> str | None:
    """The ownership token of the workflow execution calling this (None outside one)."""
    ctx = get_local_dbos_context()
    if ctx is None or not ctx.workflow_id:
        return None
    owner: str | None = ctx.owner_xid
    return owner


def lost_ownership(workflow_id: str) -> BaseException:
    """What DBOS itself raises when an execution no longer owns its workflow: DBOS then
    records nothing for the step, logs one warning and parks the execution."""
    return DBOSWorkflowConflictIDError(workflow_id)


def is_lost_ownership(exc: BaseException) -> bool:
    """Whether `exc` says this execution no longer owns its workflow (raised by the fence, or
    by DBOS at a checkpoint); DBOS parks such an execution once it leaves the workflow."""
    return isinstance(exc, DBOSWorkflowConflictIDError)


def running_on_queue(queue_name: str) -> int:
    """Workflows of `queue_name` this process is executing."""
    count: int = _get_dbos_instance()._active_workflows_set.count_for_queue(queue_name)
    return count


@dataclass(frozen=True)
class Claimed:
    """Workflows this executor just claimed: the ownership token written on them, and their
    rows as DBOS's `get_workflow_statuses` reads them, in claim order."""

    owner: str
    statuses: list[dict[str, Any]]

    @property
    def ids(self) -> list[str]:
        return [s["workflow_uuid"] for s in self.statuses]


def claim_batch(queue: Any, limit: int, conn: psycopg.Connection[Any] | None = None) -> Claimed:
    """Claim up to `limit` ENQUEUED workflows of `queue` for this executor, in DBOS's order.

    DBOS bounds a claim by the queue's worker concurrency less what runs here; passing a
    higher running count is how the claim is bounded to `limit` instead. With `conn` (an
    autocommit connection of the caller's) and a queue whose claim is one statement
    (`claims_in_one_statement`), the claim is that statement.
    """
    dbos = _get_dbos_instance()
    running = running_on_queue(queue.name) + starting()
    concurrency = queue._worker_concurrency
    if concurrency is not None:
        limit = min(limit, concurrency - running)
        if limit <= 0:
            return Claimed("", [])
        load = concurrency - limit
    else:
        raise ValueError(f"queue {queue.name} needs a worker concurrency to bound its claims")
    owner = generate_uuid()
    sys_db = dbos._sys_db
    extra: dict[str, Any] = {}
    latest = None
    if _takes_latest_version(sys_db):
        latest = extra["is_latest_version"] = _LATEST.get(sys_db, GlobalParams.app_version)
    if conn is not None and latest is not None and claims_in_one_statement(sys_db, queue):
        return Claimed(owner, _claim_statement(conn, sys_db, queue, limit, owner, latest))
    ids, _reason = sys_db.start_queued_workflows(
        queue,
        GlobalParams.executor_id,
        GlobalParams.app_version,
        None,
        load,
        owner_xid=owner,
        **extra,
    )
    statuses: list[dict[str, Any]] = []
    if ids:
        statuses = [dict(s) for s in sys_db.get_workflow_statuses(list(ids))]
    return Claimed(owner, statuses)


def claims_in_one_statement(sys_db: Any, queue: Any) -> bool:
    """Whether DBOS's claim of `queue` is what `queue_claim` does: Postgres, no shards, no
    claim gate or scope predicates, and no budget shared with other executors (a global
    concurrency, a rate limit, partitions), so READ COMMITTED with SKIP LOCKED."""
    try:
        return (
            sys_db.engine.dialect.name == "postgresql"
            and not sys_db.sharded
            and sys_db._claim_gate(queue.name, None) == []
            and sys_db._scoped(sys_db.tables.workflow_status) == []
            and queue._worker_concurrency is not None
            and queue._concurrency is None
            and queue._limiter is None
            and queue._partition_concurrency is None
            and queue._partition_limiter is None
            and queue._partition_worker_concurrency is None
        )
    except AttributeError:  # another DBOS: its own claim, whatever it does now
        return False


def _claim_statement(
    conn: psycopg.Connection[Any], sys_db: Any, queue: Any, limit: int, owner: str, latest: bool
) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cursor:
        rows = cursor.execute(
            Q["queue_claim"],
            {
                "queue": queue.name,
                "app_version": GlobalParams.app_version,
                "latest": latest,
                "app_name": sys_db.app_name,
                "limit": limit,
                "owner": owner,
                "executor_id": GlobalParams.executor_id,
                # DBOS starts a timeout's deadline from its own clock at the claim.
                "start_ms": int(time.time() * 1000),
            },
        ).fetchall()
    return [_status(row) for row in rows]


#: `queue_claim`'s columns under the names `get_workflow_statuses` gives them.
_RENAMED = {"application_version": "app_version", "application_id": "app_id"}


def _status(row: dict[str, Any]) -> dict[str, Any]:
    status = {_RENAMED.get(k, k): v for k, v in row.items()}
    status["is_debounced"] = bool(status["is_debounced"])
    status["shard_key"] = None
    return status


class LatestVersion:
    """Whether this worker's version is the application's latest, read at most once per
    `ttl_s` rather than inside every claim.

    A claim includes version-less rows only when this worker runs the latest version. DBOS
    reads that inside each claim's transaction (a third of an idle worker's claim); its own
    queue thread reads it once per poll on a sharded database. Ledgerloop claims on every
    NOTIFY, so it reads once a second. A worker of a newer version registers it when it
    launches; for up to `ttl_s` after that an older worker may still claim a version-less
    run (start_run writes one unless `ledgerloop.application_version` is set). Such a run
    is new, with no journal to disagree with: it runs on the older code, as every run does
    that an older worker claims while a rolling deploy overlaps the two.
    """

    def __init__(self, ttl_s: float = 1.0) -> None:
        self.ttl_s = ttl_s
        self._value = False
        self._until = 0.0
        self._lock = threading.Lock()

    def get(self, sys_db: Any, app_version: str) -> bool:
        with self._lock:
            now = time.monotonic()
            if now >= self._until:
                self._value = bool(sys_db._is_latest_version(app_version))
                self._until = now + self.ttl_s
            return self._value


_LATEST = LatestVersion()


def _takes_latest_version(sys_db: Any) -> bool:
    """DBOS 3.4's claim accepts the answer (`is_latest_version=`); 3.3's reads it itself."""
    takes = _TAKES.get(type(sys_db))
    if takes is None:
        parameters = inspect.signature(sys_db.start_queued_workflows).parameters
        takes = _TAKES[type(sys_db)] = "is_latest_version" in parameters and hasattr(
            sys_db, "_is_latest_version"
        )
    return takes


_TAKES: dict[type, bool] = {}


class _Deferral(threading.local):
    #: Set while this thread starts claimed workflows: DBOS's hand-overs to the event loop
    #: collected here instead of waited for.
    futures: list[concurrent.futures.Future[Any]] | None = None


_deferral = _Deferral()
_deferral_lock = threading.Lock()
#: Workflows handed to the event loop whose task it has not yet created (see start_claimed).
_starting = 0


def starting() -> int:
    return _starting


def _defer_hand_overs(dbos: Any) -> None:
    """Let a thread that starts claimed workflows hand them to the event loop without
    waiting for each (DBOS's start of one workflow blocks until the loop has created its
    task). Other threads' hand-overs are unchanged."""
    loop_holder = dbos._background_event_loop
    with _deferral_lock:
        if getattr(loop_holder, "_ledgerloop_deferral", False):
            return
        original = loop_holder.submit_coroutine

        def submit_coroutine(coro: Any) -> Any:
            futures = _deferral.futures
            if futures is None:
                return original(coro)
            loop = loop_holder.target_loop()
            if loop is None:
                coro.close()
                raise RuntimeError("Event loop not started")
            futures.append(asyncio.run_coroutine_threadsafe(coro, loop))
            return None

        loop_holder.submit_coroutine = submit_coroutine
        loop_holder._ledgerloop_deferral = True


def start_claimed(claimed: Claimed) -> None:
    """Start executing workflows this process just claimed, without waiting for the event
    loop to take them: on a busy worker (a takeover lands on workers already executing
    hundreds of runs) each wait is a loop iteration, tens to hundreds of milliseconds, and
    the next batch would wait behind it. Until the loop has created their tasks, they count
    in `starting()`, which bounds the next claim as DBOS's own count would."""
    global _starting
    if not claimed.statuses:
        return
    dbos = _get_dbos_instance()
    _defer_hand_overs(dbos)
    futures: list[concurrent.futures.Future[Any]] = []
    _deferral.futures = futures
    try:
        for status in claimed.statuses:
            try:
                execute_dequeued_workflow(dbos, status, claimed.owner)  # type: ignore[arg-type]
            except Exception:
                # DBOS marks what it cannot start (bad input, unknown workflow) itself and
                # raises; one bad run must not stop the others of the batch.
                dbos.logger.exception(f"could not start workflow {status['workflow_uuid']}")
    finally:
        _deferral.futures = None
    with _deferral_lock:
        _starting += len(futures)

    def started(future: concurrent.futures.Future[Any]) -> None:
        global _starting
        with _deferral_lock:
            _starting -= 1
        if not future.cancelled() and future.exception() is not None:
            dbos.logger.error("could not start a claimed workflow", exc_info=future.exception())

    for future in futures:
        future.add_done_callback(started)


def slow_internal_queue(polling_interval_s: float) -> None:
    """Poll DBOS's internal queue (resumed workflows) every `polling_interval_s`."""
    queue = _get_dbos_instance()._registry.get_internal_queue()
    queue._polling_interval_sec = polling_interval_s


def quiet_queue_manager() -> None:
    """Answer DBOS's queue manager thread's once-a-second `list_queues` with no rows while
    this process listens to no queue of the table (call after DBOS.launch). Its own
    internal queues are added by that thread whatever the list says; every other caller
    still reads the table."""
    dbos = _get_dbos_instance()
    sys_db = dbos._sys_db
    listed = sys_db.list_queues

    def list_queues(*args: Any, **kwargs: Any) -> Any:
        if dbos._listening_queues == [] and threading.current_thread().name.endswith(
            "(queue_thread)"
        ):
            return []
        return listed(*args, **kwargs)

    sys_db.list_queues = list_queues  # type: ignore[method-assign]


def slow_background_jobs(interval_s: float) -> None:
    """Run DBOS's background jobs every `interval_s` (call before DBOS.launch).

    The process that runs them holds their advisory lock in an open transaction for the
    whole period, and DBOS has Postgres end such a session after 5 s idle (so that a frozen
    holder lets go). With a longer period the holder's session was ended every round, and
    DBOS's pool opened 4-5 new connections every 10 s on an idle worker: the timeout now
    outlasts the period."""
    import dbos._sys_db_postgres as postgres
    import dbos._workflow_commands as commands

    commands._BACKGROUND_JOBS_INTERVAL_SEC = interval_s
    current = getattr(postgres, "BACKGROUND_JOB_LOCK_IDLE_TIMEOUT_MS", None)
    if current is not None:  # releases before 3.4 take no such lock
        needed_ms = int((interval_s + LOCK_IDLE_MARGIN_S) * 1000)
        postgres.BACKGROUND_JOB_LOCK_IDLE_TIMEOUT_MS = max(current, needed_ms)


#: How much longer than the background jobs' period their lock holder may sit idle.
LOCK_IDLE_MARGIN_S = 5.0


class _CancelledTasksFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Asyncio task cancelled for workflow or step")


def quiet_cancellations() -> None:
    """Drop DBOS's line per cancelled task (it carries step arguments) from now on."""
    logger = logging.getLogger("dbos")
    if not any(isinstance(f, _CancelledTasksFilter) for f in logger.filters):
        logger.addFilter(_CancelledTasksFilter())


def wake_all_message_waiters() -> int:
    """Set every message waiter of this process, as DBOS's listener sets one per notification.
    Notifications sent while the listener's connection was gone (an outage, a failover) are
    never heard again, and a waiter would sleep until DBOS's fallback re-check (a minute).
    Each wait re-reads what it waits for when woken (messages wake, records decide), so a
    waiter whose message has not come goes back to waiting. Returns how many were set."""
    waiters = _get_dbos_instance()._sys_db.notifications_map
    woken = 0
    for _key, _components, signal in waiters.snapshot():
        signal.set()
        woken += 1
    return woken


def watch_dbos_connections(hook: Callable[[int | None], None], query: str) -> None:
    """Call `hook` with the answer of `query` (the server's timeline) on each connection
    DBOS's engine opens, before DBOS uses it. DBOS writes on those connections by itself (a
    workflow's outcome, a message's consumption, its own checkpoint) and retries them for as
    long as the database is away: after a failover, the first must not land before the
    worker's rewind check. `hook` may block (bounded); it should not raise."""
    from sqlalchemy import event

    engine = _get_dbos_instance()._sys_db.engine

    def connected(dbapi_conn: Any, _record: Any) -> None:
        timeline: int | None = None
        try:
            cursor = dbapi_conn.cursor()
            try:
                cursor.execute(query)
                row = cursor.fetchone()
                timeline = None if row is None or row[0] is None else int(row[0])
            finally:
                cursor.close()
            dbapi_conn.rollback()
        except Exception:  # a standby, a pooler that forbids the function: unknown
            with contextlib.suppress(Exception):
                dbapi_conn.rollback()
        hook(timeline)

    event.listen(engine, "connect", connected)
