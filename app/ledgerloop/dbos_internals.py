"""Every piece of DBOS's private state Ledgerloop relies on, and why nothing public does the job.

Ledgerloop lives in users' databases across DBOS releases. It uses DBOS's public surface
wherever that does the job (workflows, steps, `recv`/`send`, queues, `cancel_workflow`,
`list_workflow_steps`, the documented SQL functions `dbos.enqueue_workflow` and
`dbos.send_message`). What is listed here is the rest: private Python names, hand-written SQL on
DBOS's tables, and DBOS behaviours that no document promises.

Each entry names the DBOS behaviour Ledgerloop relies on, where it is used, and why it stays.
Each has one contract test in tests/contract/test_dbos_contracts.py that fails, naming the
behaviour, when a DBOS release changes it; tests/contract/test_dbos_registry.py fails when a
module uses a DBOS private name or a DBOS table that is not listed here. docs/operations.md
says how a DBOS upgrade is checked.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Internal:
    #: A stable name; the contract test is `test_<name with - as _>`.
    name: str
    #: What of DBOS is used: private names, tables and columns.
    uses: str
    #: The DBOS behaviour Ledgerloop relies on (what the contract test checks).
    relies_on: str
    #: Why no public API does the job.
    why: str
    #: Files (repo-relative) that use it.
    used_in: tuple[str, ...]
    #: DBOS tables the files above name in SQL (schema dbos).
    tables: tuple[str, ...] = ()
    #: Private Python names the files above use (`module.name`).
    private_names: tuple[str, ...] = ()

    @property
    def contract_test(self) -> str:
        return "test_" + self.name.replace("-", "_")


INTERNALS: tuple[Internal, ...] = (
    Internal(
        name="notification-waiters",
        uses="SystemDatabase.notifications_map, SystemDatabase._waiter(), the signal's _lock and "
        "_waiters, and dbos._utils.LoopAwareEvent",
        relies_on="DBOS's notification listener sets every event registered in "
        "notifications_map under the key _waiter(workflow_id, topic) when a message to that "
        "workflow and topic is sent, without consuming it",
        why="DBOS offers no public way to learn that a message is arriving without consuming "
        "it (recv consumes); hibernation must not end a wait whose message is in flight, and "
        "the act step watches for a quick outcome without a durable recv. Behind a "
        "transaction-mode pooler DBOS cannot LISTEN, and the dispatcher's direct connection "
        "hears DBOS's message channel (_dbos_notifications_channel) and sets these waiters "
        "as DBOS's listener would",
        used_in=("app/ledgerloop/agent/dbos_waiters.py", "app/ledgerloop/fleet/dbos_internals.py"),
        private_names=(
            "dbos._dbos._get_dbos_instance",
            "dbos._utils.LoopAwareEvent",
            "dbos._sys_db._dbos_notifications_channel",
        ),
    ),
    Internal(
        name="shared-listener",
        uses="PostgresSystemDatabase._notification_listener (wrapped), SystemDatabase."
        "use_listen_notify, notifications_map, workflow_events_map, streams_map, and the "
        "channel names _dbos_notifications_channel, _dbos_workflow_events_channel and "
        "_dbos_streams_channel",
        relies_on="DBOS launches its listener thread on run_notification_listener, which marks "
        "the listener running and calls _notification_listener; that listener LISTENs on the "
        "three channels and sets the event registered in the matching map under the "
        "notification's payload; with the wrapped listener returning at once, a message sent "
        "to a waiting workflow still reaches it once the dispatcher forwards the "
        "notification",
        why="DBOS's listener holds a connection of its own; a bounded footprint "
        "(LEDGERLOOP_MAX_CONNECTIONS) shares the dispatcher's LISTEN connection instead. "
        "use_listen_notify=False, the only public switch, also stops DBOS's notifier and "
        "makes its waits poll",
        used_in=("app/ledgerloop/fleet/dbos_internals.py",),
        private_names=(
            "dbos._dbos._get_dbos_instance",
            "dbos._sys_db._dbos_notifications_channel",
            "dbos._sys_db._dbos_workflow_events_channel",
            "dbos._sys_db._dbos_streams_channel",
            "dbos._sys_db_postgres.PostgresSystemDatabase",
        ),
    ),
    Internal(
        name="operation-counter",
        uses="dbos._context.get_local_dbos_context().function_id, read in workflow code right "
        "after a recv or a step (dbos_waiters.last_recv_id and last_step_id, for tracing a "
        "resumed run)",
        relies_on="in workflow code the context's function_id is the last operation id "
        "taken: a step's own right after it; a recv takes two, its own then its timeout's "
        "(recorded as DBOS.sleep), so right after a recv returns its own id is function_id - 1",
        why="DBOS exposes the current operation id publicly only inside a step "
        "(DBOS.step_id); tracing needs the id of the recv it just waited in, from workflow code",
        used_in=("app/ledgerloop/agent/dbos_waiters.py",),
        private_names=("dbos._context.get_local_dbos_context",),
    ),
    Internal(
        name="journal-read",
        uses="SELECT max(function_id), max(completed_at_epoch_ms) FROM dbos.operation_outputs "
        "WHERE workflow_uuid, skipping function_name 'DBOS.sleep' (agent/tracing.sql), and the "
        "names of a run's message steps (agent/messages.sql); "
        "whether the row a worker checkpointed at (workflow_uuid, function_id) is still there "
        "after a failover (fleet/queries.sql executor_rewound)",
        relies_on="every operation of a workflow (steps, recv, the recv's timeout as "
        "DBOS.sleep) is one dbos.operation_outputs row keyed (workflow_uuid, function_id), "
        "with its function_name and completed_at_epoch_ms",
        why="the public list_workflow_steps, called from workflow code (where a resumed "
        "execution reads it), is itself journaled as a step (DBOS.listWorkflowSteps) and "
        "would change the workflow's step sequence",
        used_in=(
            "app/ledgerloop/agent/tracing.sql",
            "app/ledgerloop/agent/messages.sql",
            "app/ledgerloop/fleet/queries.sql",
        ),
        tables=("operation_outputs",),
    ),
    Internal(
        name="cancelled-task-records-nothing",
        uses="asyncio cancellation of an async workflow's task while it waits in recv_async",
        relies_on="a workflow task cancelled in recv_async records no output, no error and no "
        "step, and leaves the workflow PENDING for a later execution to replay",
        why="DBOS has no public way to evict a waiting execution from memory and resume it "
        "later: cancel_workflow is final, and a workflow cannot suspend itself",
        used_in=("app/ledgerloop/agent/hibernation.py",),
    ),
    Internal(
        name="delayed-park",
        uses="UPDATE dbos.workflow_status SET status = 'DELAYED', delay_until_epoch_ms (the "
        "hibernation park, agent/hibernation.sql workflow_park)",
        relies_on="DBOS moves a DELAYED workflow whose delay_until_epoch_ms has passed to "
        "ENQUEUED and dispatches it from its queue_name, and never dispatches it before",
        why="the public set_workflow_delay only changes the delay of a workflow that is "
        "already DELAYED; nothing public turns a PENDING workflow into a DELAYED one",
        used_in=("app/ledgerloop/agent/hibernation.sql", "app/ledgerloop/agent/hibernation.py"),
        tables=("workflow_status",),
    ),
    Internal(
        name="requeue-owner-token",
        uses="UPDATE dbos.workflow_status SET status = 'ENQUEUED', owner_xid = NULL, "
        "started_at_epoch_ms = NULL, queue_name (the hibernation requeue, and the park's "
        "release of owner_xid)",
        relies_on="an ENQUEUED row on a queue with no owner token is dispatched by a worker "
        "listening to that queue, which takes a fresh owner_xid, so the execution that owned "
        "the row before can no longer write to it",
        why="the public resume_workflow runs in its own transaction, so it cannot join the one "
        "that holds the row lock against the wake trigger, and it would also put back on the "
        "queue a workflow cancelled in between (it moves any row not SUCCESS or ERROR)",
        used_in=("app/ledgerloop/agent/hibernation.sql",),
        tables=("workflow_status",),
    ),
    Internal(
        name="recovery-attempts",
        uses="UPDATE dbos.workflow_status SET recovery_attempts = recovery_attempts - 1 (the "
        "park and the requeue)",
        relies_on="each dispatch adds exactly one to recovery_attempts, and a dispatch marks "
        "the workflow MAX_RECOVERY_ATTEMPTS_EXCEEDED once the count passes "
        "max_recovery_attempts + 1; a hibernation gives its dispatch back so a run that waits "
        "many times is not dead-lettered",
        why="no public API adjusts the count (resume_workflow resets it, but cannot be used "
        "here, see requeue-owner-token)",
        used_in=("app/ledgerloop/agent/hibernation.sql",),
        tables=("workflow_status",),
    ),
    Internal(
        name="notifications-trigger",
        uses="the trigger ledgerloop_wake_hibernated AFTER INSERT ON dbos.notifications and its "
        "function ledgerloop.wake_hibernated_run(), which reads NEW.destination_uuid and "
        "updates dbos.workflow_status (name, status, delay_until_epoch_ms)",
        relies_on="every send (DBOS.send, DBOSClient.send, dbos.send_message) inserts one row "
        "into dbos.notifications whose destination_uuid is the target workflow id, in the "
        "sender's transaction",
        why="DBOS has no hook on a message's arrival for a workflow with no live execution: a "
        "message to a DELAYED workflow otherwise waits for the whole delay (the wait's "
        "deadline, hours). db/dbos_objects.py checks it at start-up and `ledgerloop db "
        "upgrade` re-creates it when a DBOS migration dropped it",
        used_in=(
            "app/ledgerloop/db/dbos_objects.sql",
            "app/ledgerloop/db/dbos_objects.py",
            "migrations/versions/0005_hibernation.py",
            "app/ledgerloop/agent/hibernation.py",
        ),
        tables=("notifications", "workflow_status"),
    ),
    Internal(
        name="dispatch-trigger",
        uses="the triggers ledgerloop_run_enqueued_insert (AFTER INSERT) and "
        "ledgerloop_run_enqueued_update (AFTER UPDATE OF status) ON dbos.workflow_status, "
        "WHEN NEW.status = 'ENQUEUED' AND NEW.queue_name = 'ledgerloop_runs', and their "
        "function ledgerloop.notify_run_enqueued(), which sends NOTIFY ledgerloop_runs",
        relies_on="enqueueing a workflow (DBOSClient.enqueue, dbos.enqueue_workflow) inserts "
        "its dbos.workflow_status row with status ENQUEUED and queue_name set, in the "
        "enqueuer's transaction",
        why="DBOS's queue thread only polls; nothing public tells a worker that a run was "
        "queued. db/dbos_objects.py checks the triggers at start-up and `ledgerloop db "
        "upgrade` re-creates them; a notification that fails is logged, never fatal (the "
        "dispatchers' slow poll still finds the run)",
        used_in=("app/ledgerloop/db/dbos_objects.sql", "app/ledgerloop/db/dbos_objects.py"),
        tables=("workflow_status",),
    ),
    Internal(
        name="unconsumed-messages",
        uses="SELECT ... FROM dbos.notifications WHERE destination_uuid, topic, NOT consumed "
        "(the park's check for a message already sent; a test helper reading messages)",
        relies_on="a sent message stays in dbos.notifications with consumed = false until the "
        "workflow's recv consumes it, which sets consumed = true",
        why="DBOS offers no public read of a workflow's pending messages",
        used_in=("app/ledgerloop/agent/hibernation.sql", "app/ledgerloop/effects/testing.py"),
        tables=("notifications",),
    ),
    Internal(
        name="workflow-status-columns",
        uses="reads of dbos.workflow_status (workflow_uuid, status, executor_id, name) in the "
        "hibernation lock, the effect outcome's message, and a clean stop (the runs it was "
        "executing: their spans end, and they go back on the queue)",
        relies_on="dbos.workflow_status has one row per workflow keyed by workflow_uuid, with "
        "the columns Ledgerloop's SQL names",
        why="the check runs inside Ledgerloop's own transactions (a lock, a trigger), where "
        "DBOS's Python API cannot join",
        used_in=(
            "app/ledgerloop/agent/hibernation.sql",
            "migrations/versions/0003_effects.py",
            "app/ledgerloop/runs/queries.sql",
            "app/ledgerloop/fleet/queries.sql",
            "migrations/versions/0016_fleet.py",
        ),
        tables=("workflow_status",),
    ),
    Internal(
        name="workflow-input",
        uses="reads dbos.workflow_input.inputs in `ledgerloop runs stuck` (fleet/queries.sql "
        "runs_stuck): the run id a ledgerloop_run workflow in ERROR was started with",
        relies_on="a workflow's inputs are one row of dbos.workflow_input keyed by "
        "workflow_uuid, and inputs enqueued from SQL (portable JSON) read "
        '{"positionalArgs": [...], ...}',
        why="a second workflow of a run is found by the run id its inputs name, in the same "
        "query as the other stuck runs; DBOS's list_workflows would load and decode every "
        "failed workflow's inputs in Python",
        used_in=("app/ledgerloop/fleet/queries.sql",),
        tables=("workflow_input",),
    ),
    Internal(
        name="adopt-version",
        uses="UPDATE dbos.workflow_status SET application_version (and, for a PENDING run of "
        "a dead worker, what resume_workflows sets), guarded by max(function_id) FROM "
        "dbos.operation_outputs (deploy/queries.sql workflows_adopt)",
        relies_on="a worker dispatches only ENQUEUED workflows of its own application_version, "
        "so rewriting a row's application_version hands it to the workers of that version, "
        "which replay its journal",
        why="no public call moves a workflow to another application version under the same id: "
        "fork_workflow(application_version=) makes a copy with a new id, and a run's id is its "
        "workflow's id (approvals, effects and their messages are addressed to it)",
        used_in=("app/ledgerloop/deploy/queries.sql",),
        tables=("workflow_status", "operation_outputs"),
    ),
    Internal(
        name="replay-harness",
        uses="DBOS.run_step_async, recv_async, sleep_async, patch_async, "
        "deprecate_patch_async, start_workflow_async replaced on the DBOS class, the "
        "workflow_id descriptor read from DBOS.__dict__, and a workflow function's "
        "dbos_function_name (deploy/replay.py)",
        relies_on="the workflow-facing calls are class attributes of DBOS looked up at each "
        "call, and DBOS.workflow_id is a descriptor kept in DBOS.__dict__",
        why="DBOS offers no public way to run a workflow's code against its recorded journal "
        "without executing it (the deploy check replays in-flight runs on the new code)",
        used_in=("app/ledgerloop/deploy/replay.py",),
        private_names=("DBOS.__dict__",),
    ),
    Internal(
        name="migration-versions",
        uses="dbos._migration.get_migration_versions(engine, schema, use_listen_notify)",
        relies_on="it returns (the version recorded in dbos.dbos_migrations, the number of "
        "migrations this DBOS release has), 0 for an empty database",
        why="DBOS publicly migrates (DBOS.migrate) but offers no read of whether a database's "
        "schema is current; the start-up check needs one to refuse an outdated schema with "
        "the command that fixes it",
        used_in=("app/ledgerloop/db/migrate.py",),
        private_names=("dbos._migration.get_migration_versions",),
    ),
    Internal(
        name="stopped-worker-requeue",
        uses="UPDATE dbos.workflow_status SET status = 'ENQUEUED', owner_xid = NULL, "
        "queue_name = coalesce(queue_name, '_dbos_internal_queue') WHERE executor_id AND "
        "status = 'PENDING' (a clean stop hands its runs back)",
        relies_on="every worker dispatches ENQUEUED rows on DBOS's internal queue "
        "_dbos_internal_queue as it does its own queues",
        why="DBOS's shutdown leaves the stopping executor's workflows PENDING, and no public "
        "call moves all of one executor's workflows back to a queue (a takeover does the same "
        "for a dead worker's, atomically with removing its row)",
        used_in=("app/ledgerloop/fleet/queries.sql",),
        tables=("workflow_status",),
    ),
    Internal(
        name="fleet-dispatch",
        uses="SystemDatabase.start_queued_workflows(queue, executor_id, app_version, None, "
        "local_running_count, owner_xid=..., is_latest_version=... where it takes it), "
        "SystemDatabase._is_latest_version (read at most once a second), "
        "SystemDatabase.get_workflow_statuses, "
        "dbos._core.execute_dequeued_workflow, DBOS._active_workflows_set.count_for_queue, "
        "dbos._utils.GlobalParams, dbos._utils.generate_uuid; the internal queue's "
        "_polling_interval_sec and dbos._workflow_commands._BACKGROUND_JOBS_INTERVAL_SEC, "
        "with dbos._sys_db_postgres.BACKGROUND_JOB_LOCK_IDLE_TIMEOUT_MS raised past that "
        "period (background_job_lock holds its lock idle in a transaction for the period)",
        relies_on="a claim takes at most the queue's worker_concurrency less the running "
        "count given, and version-less rows only when told this worker runs the latest "
        "version, marks them PENDING under this executor with the owner token given, and "
        "execute_dequeued_workflow runs a claimed workflow with that token; the two periods "
        "are read by DBOS's threads at launch, and the lock's idle timeout at each lock",
        why="DBOS's queue thread only polls (nothing public wakes it on a NOTIFY) and claims "
        "all its worker may take at once, which hands a burst to one worker; its internal "
        "queue and background jobs poll every second with no setting",
        used_in=("app/ledgerloop/fleet/dbos_internals.py",),
        private_names=(
            "dbos._core.execute_dequeued_workflow",
            "dbos._dbos._get_dbos_instance",
            "dbos._utils.GlobalParams",
            "dbos._utils.generate_uuid",
        ),
    ),
    Internal(
        name="fleet-start",
        uses="BackgroundEventLoop.submit_coroutine replaced on the process's DBOS instance "
        "(dbos._background_event_loop) by a wrapper that, on a thread inside "
        "fleet.dbos_internals.start_claimed only, hands the coroutine to "
        "BackgroundEventLoop.target_loop() with asyncio.run_coroutine_threadsafe and returns "
        "without waiting; every other call goes to DBOS's own",
        relies_on="execute_dequeued_workflow hands an async workflow to the event loop through "
        "that method, as a coroutine that only creates the workflow's task, and ignores what "
        "the method returns",
        why="DBOS's start of one claimed workflow blocks until the event loop has created its "
        "task: on a worker already executing hundreds of runs (a takeover) that is a loop "
        "iteration per batch, and the survivors' claims of a dead worker's runs took about a "
        "second instead of a tenth of one",
        used_in=("app/ledgerloop/fleet/dbos_internals.py",),
    ),
    Internal(
        name="fleet-claim",
        uses="one statement over dbos.workflow_status (SELECT ... FOR UPDATE SKIP LOCKED, then "
        "UPDATE of status, owner_xid, application_version, executor_id, application_name, "
        "started_at_epoch_ms, rate_limited, recovery_attempts, updated_at and "
        "workflow_deadline_epoch_ms) joined to dbos.workflow_input for the inputs; "
        "SystemDatabase.sharded, app_name, _claim_gate, _scoped and the queue's budget fields "
        "to tell where it applies",
        relies_on="for a queue with only a worker concurrency on an unsharded Postgres, the "
        "statement leaves a claimed row as start_queued_workflows does, takes the rows it "
        "would take, in its order, and returns each as get_workflow_statuses reads it",
        why="DBOS's claim builds two SQLAlchemy statements per call and its caller reads the "
        "rows back in a third round trip: most of the time from a run's commit to its first "
        "step on an idle worker",
        used_in=("app/ledgerloop/fleet/queries.sql", "app/ledgerloop/fleet/dbos_internals.py"),
        tables=("workflow_status", "workflow_input"),
    ),
    Internal(
        name="journal-check",
        uses="SystemDatabase.check_operation_execution replaced on the process's DBOS instance "
        "by one statement over dbos.workflow_status joined to dbos.operation_outputs; "
        "SystemDatabase.engine, sharded, schema, tables and _key_column to tell where it "
        "applies; DBOSUnexpectedStepError and DBOSWorkflowCancelledError raised as DBOS raises "
        "them",
        relies_on="DBOS asks check_operation_execution(workflow_id, function_id, function_name, "
        "owner_key=) before every operation of a workflow, and acts only on what it returns or "
        "raises: None when nothing is recorded at function_id, else the row's output, error, "
        "serialization and child workflow id; DBOSUnexpectedStepError for another name there; "
        "DBOSWorkflowCancelledError for a cancelled workflow",
        why="DBOS's check is a transaction of two SQLAlchemy SELECTs before every step: four "
        "round trips and, on a busy worker, the largest share of its CPU after the model SDK; "
        "DBOS has no setting for a lighter one",
        used_in=("app/ledgerloop/db/dbos_journal.py", "app/ledgerloop/db/dbos_journal.sql"),
        tables=("workflow_status", "operation_outputs"),
        private_names=(
            "dbos._dbos._get_dbos_instance",
            "dbos._error.DBOSUnexpectedStepError",
            "dbos._error.DBOSWorkflowCancelledError",
        ),
    ),
    Internal(
        name="step-start",
        uses="dbos._outcome.Pending.then and Pending._intercept replaced on the class: "
        "Pending._func, dbos._outcome.DeferredResult.resolve_async and "
        "DBOS._configure_asyncio_thread_pool, as Pending._wrap uses them; the name of the "
        "interceptor DBOS gives a step (check_existing_result); dbos._context's "
        "get_local_dbos_context and current_owner_xid for the step's workflow, operation id "
        "and owner token",
        relies_on="Pending.then(next, dbos=) composes a coroutine outcome so that calling it "
        "awaits the body, then runs next on a thread with a thunk that returns the body's "
        "value or raises its exception, resolves a DeferredResult that next returns on the "
        "loop, and configures the pool first when given dbos; DBOS's own runs the trivial "
        "`lambda: next` on a thread before the body, which nothing else observes. "
        "Pending._intercept(func, interceptor, dbos=) runs the interceptor on a thread and the "
        "body when it returns NoResult; a step's interceptor is named check_existing_result, "
        "runs in the step's context (workflow id, its operation id) and returns NoResult "
        "exactly when check_operation_execution finds nothing recorded and no cancellation",
        why="that hop delays every async step's body (every think step) until a pool thread "
        "gets the GIL; with a write's relay working on the loop at that moment it took 1.2-1.6 "
        "ms of a write-tool turn, and DBOS has no setting to skip it. The journal check of the "
        "step after a write, answered ahead by the write's checkpoint, would take another "
        "trip through a thread while the write is sent on the loop",
        used_in=("app/ledgerloop/agent/dbos_step_start.py",),
        private_names=(
            "dbos._context.current_owner_xid",
            "dbos._context.get_local_dbos_context",
            "dbos._outcome.DeferredResult",
            "dbos._outcome.Pending",
        ),
    ),
    Internal(
        name="step-checkpoint",
        uses="SystemDatabase.record_operation_result replaced on the process's DBOS instance "
        "by one statement over dbos.workflow_status (the owner token, FOR NO KEY UPDATE) and "
        "dbos.operation_outputs (the step's row, its columns as DBOS writes them), with a "
        "step's rider query run by the same statement once the row is this execution's, "
        "and then the next operation's journal check read by it too (journal-check's "
        "reads); "
        "dbos._context.current_owner_xid for "
        "the token; SystemDatabase.app_name, _child_values, _wf_values and what journal-check "
        "reads to tell where it applies; DBOSWorkflowConflictIDError and "
        "DBOSStepNondeterminismError raised as DBOS raises them",
        relies_on="DBOS writes every operation's checkpoint through "
        "record_operation_result(result, completed_at_epoch_ms=, owner_xid=, owner_key=), "
        "result naming workflow_uuid, function_id (a step's DBOS.step_id), function_name, "
        "output, error, child_workflow_id, serialization and started_at_epoch_ms; the row it "
        "writes has those, completed_at_epoch_ms, application_name and retention_timestamp "
        "(now in epoch ms); it raises DBOSWorkflowConflictIDError when the token it checks "
        "(owner_xid, else the running execution's) does not own the workflow, and "
        "DBOSStepNondeterminismError when a row with another completion time is there",
        why="DBOS's checkpoint is a transaction of four SQLAlchemy statements after every "
        "operation, and has no setting for a lighter one; and a write the model asked for "
        "must commit with the answer that asked for it to cost the turn no commit of its own, "
        "for which DBOS has no hook",
        used_in=("app/ledgerloop/db/dbos_checkpoint.py", "app/ledgerloop/db/dbos_checkpoint.sql"),
        tables=("operation_outputs", "workflow_status"),
        private_names=(
            "dbos._context.current_owner_xid",
            "dbos._dbos._get_dbos_instance",
            "dbos._error.DBOSStepNondeterminismError",
            "dbos._error.DBOSWorkflowConflictIDError",
        ),
    ),
    Internal(
        name="fleet-owner-token",
        uses="dbos._context.get_local_dbos_context().owner_xid inside a step body, and "
        "dbos._error.DBOSWorkflowConflictIDError raised from one",
        relies_on="inside a step body the context's owner_xid is the token dbos.workflow_status "
        "holds for this execution; a step body that raises DBOSWorkflowConflictIDError gets no "
        "checkpoint, and the error reaches the workflow unchanged (Ledgerloop then cancels the "
        "execution's task, which DBOS would otherwise park; a cancelled task records no "
        "outcome)",
        why="DBOS checks ownership only when it writes a checkpoint, after the step body ran; "
        "the fence must stop a worker that was taken over before the body runs again",
        used_in=("app/ledgerloop/fleet/dbos_internals.py",),
        private_names=(
            "dbos._context.get_local_dbos_context",
            "dbos._error.DBOSWorkflowConflictIDError",
        ),
    ),
)

#: DBOS SQL functions Ledgerloop calls; documented by DBOS, so not internals.
PUBLIC_SQL_FUNCTIONS = ("enqueue_workflow", "send_message")


def internal(name: str) -> Internal:
    for entry in INTERNALS:
        if entry.name == name:
            return entry
    raise KeyError(name)
