"""The fleet's uses of DBOS 3.4 internals, in one place (each says why nothing public does it).

- Dispatch claims a bounded batch of Ledgerloop's queue and starts it when a NOTIFY arrives:
  DBOS's queue thread only polls (its wait cannot be woken) and claims everything its
  worker's concurrency allows in one go, which hands a whole burst to one worker. We call
  the same two functions its poll calls (`start_queued_workflows`, then
  `execute_dequeued_workflow`), so the claim keeps DBOS's own rules (versions, application
  name, deadlines, recovery attempts).
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
- DBOS's engine pings each connection on checkout unless told otherwise (a setting, public).

tests/integration/test_fleet_dispatch.py and test_fleet_takeover.py fail if any of these
stops working.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dbos._context import get_local_dbos_context
from dbos._core import execute_dequeued_workflow
from dbos._dbos import _get_dbos_instance
from dbos._error import DBOSWorkflowConflictIDError
from dbos._utils import GlobalParams, generate_uuid


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


def claim_batch(queue: Any, limit: int) -> tuple[str, list[str]]:
    """Claim up to `limit` ENQUEUED workflows of `queue` for this executor, in DBOS's order.

    Returns the ownership token written on them and their ids. DBOS bounds a claim by the
    queue's worker concurrency less what runs here; passing a higher running count is how
    the claim is bounded to `limit` instead.
    """
    dbos = _get_dbos_instance()
    running = running_on_queue(queue.name)
    concurrency = queue._worker_concurrency
    if concurrency is not None:
        limit = min(limit, concurrency - running)
        if limit <= 0:
            return "", []
        load = concurrency - limit
    else:
        raise ValueError(f"queue {queue.name} needs a worker concurrency to bound its claims")
    owner = generate_uuid()
    sys_db = dbos._sys_db
    extra: dict[str, Any] = {}
    if _takes_latest_version(sys_db):
        extra["is_latest_version"] = _LATEST.get(sys_db, GlobalParams.app_version)
    ids, _reason = sys_db.start_queued_workflows(
        queue,
        GlobalParams.executor_id,
        GlobalParams.app_version,
        None,
        load,
        owner_xid=owner,
        **extra,
    )
    return owner, list(ids)


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


#: Threads that hand claimed workflows to the event loop together (see start_claimed).
_starters: ThreadPoolExecutor | None = None
_starters_lock = threading.Lock()
STARTER_THREADS = 8


def _starter_pool() -> ThreadPoolExecutor:
    global _starters
    with _starters_lock:
        if _starters is None:
            _starters = ThreadPoolExecutor(STARTER_THREADS, thread_name_prefix="ledgerloop-start")
        return _starters


def start_claimed(owner: str, workflow_ids: list[str]) -> None:
    """Start executing workflows this process just claimed with token `owner`.

    DBOS's start of one workflow blocks until the event loop has created its task: one
    wait for a loop iteration per workflow, which on a busy worker (a takeover lands on
    workers already executing hundreds of runs) is tens of milliseconds each. Started from
    several threads at once, a batch waits about one iteration.
    """
    if not workflow_ids:
        return
    dbos = _get_dbos_instance()
    found = {s["workflow_uuid"]: s for s in dbos._sys_db.get_workflow_statuses(workflow_ids)}

    def start(workflow_id: str) -> None:
        status = found.get(workflow_id)
        if status is None:
            return  # claimed and gone (deleted); nothing to run
        try:
            execute_dequeued_workflow(dbos, status, owner)
        except Exception:
            # DBOS marks what it cannot start (bad input, unknown workflow) itself and
            # raises; one bad run must not stop the others of the batch.
            dbos.logger.exception(f"could not start workflow {workflow_id}")

    if len(workflow_ids) == 1:
        start(workflow_ids[0])  # an idle worker's single run: no thread hop
        return
    for done in [_starter_pool().submit(start, w) for w in workflow_ids]:
        done.result()


def slow_internal_queue(polling_interval_s: float) -> None:
    """Poll DBOS's internal queue (resumed workflows) every `polling_interval_s`."""
    queue = _get_dbos_instance()._registry.get_internal_queue()
    queue._polling_interval_sec = polling_interval_s


def slow_background_jobs(interval_s: float) -> None:
    """Run DBOS's background jobs every `interval_s` (call before DBOS.launch)."""
    import dbos._workflow_commands as commands

    commands._BACKGROUND_JOBS_INTERVAL_SEC = interval_s


class _CancelledTasksFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Asyncio task cancelled for workflow or step")


def quiet_cancellations() -> None:
    """Drop DBOS's line per cancelled task (it carries step arguments) from now on."""
    logger = logging.getLogger("dbos")
    if not any(isinstance(f, _CancelledTasksFilter) for f in logger.filters):
        logger.addFilter(_CancelledTasksFilter())
