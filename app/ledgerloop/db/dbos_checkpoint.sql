-- DBOS's step checkpoint, in one statement (db/dbos_checkpoint.py, the DBOS internal
-- `step-checkpoint`).

-- name: step_checkpoint
-- What SystemDatabase._record_operation_result_txn writes and checks inside BEGIN ... COMMIT:
-- the workflow's owner token locked and compared (when there is one to compare), then the
-- operation's row, or, when one is there already, its completion time unchanged (a retry
-- carries the same time; another time is nondeterminism, which the caller raises). Nothing
-- is written when the owner differs: `owner_xid` then says whose the workflow is.
--
-- The rider's query is a SELECT committed with the checkpoint (`SELECT WHERE false`: none).
-- It runs only when the row is this execution's: written now or found with this
-- attempt's time (OFFSET 0 keeps the subquery a step of its own, run once per row of
-- `written`, so with no row it never runs). Its first row's columns come first: a name
-- the checkpoint's answer uses reads the checkpoint's.
--
-- With `answer_next`, it also reads what DBOS's journal check of the next operation
-- (function_id + 1) would read (dbos_journal.sql): the workflow's status, and whether that
-- operation is recorded. Without it, both are NULL and neither is read.
WITH owner AS (
  SELECT owner_xid FROM dbos.workflow_status
  WHERE workflow_uuid = %(workflow_uuid)s AND %(owner_xid)s::text IS NOT NULL
  FOR NO KEY UPDATE
), written AS (
  INSERT INTO dbos.operation_outputs
    (workflow_uuid, function_id, function_name, started_at_epoch_ms, completed_at_epoch_ms,
     output, error, child_workflow_id, serialization, application_name, retention_timestamp)
  SELECT %(workflow_uuid)s, %(function_id)s, %(function_name)s, %(started_at_epoch_ms)s,
         %(completed_at_epoch_ms)s, %(output)s, %(error)s, %(child_workflow_id)s,
         %(serialization)s, %(application_name)s,
         CAST(extract(epoch FROM now()) * 1000 AS bigint)
  WHERE %(owner_xid)s::text IS NULL
     OR (SELECT owner_xid FROM owner) IS NOT DISTINCT FROM %(owner_xid)s::text
  ON CONFLICT (workflow_uuid, function_id)
    DO UPDATE SET completed_at_epoch_ms = dbos.operation_outputs.completed_at_epoch_ms
  -- xmax 0: inserted now, not found (a retry of a commit whose answer was lost).
  RETURNING completed_at_epoch_ms, xmax = 0 AS fresh
), stepped AS (
  -- A run's step, recorded now: the run's next event (its version, as a status move takes)
  -- is `step.finished`, in this statement (migration 0033, docs/streaming.md). Not once the
  -- run is finished (its stream has closed), and not DBOS's own operations (sleep, recv).
  UPDATE ledgerloop.agent_run r
  SET version = r.version + 1
  FROM written
  WHERE written.fresh
    AND r.id = %(run_of_step)s::uuid
    AND r.status NOT IN ('succeeded', 'failed', 'cancelled')
    AND %(function_name)s::text NOT LIKE 'DBOS.%%'
  RETURNING r.id, r.tenant_id, r.version
), step_event AS (
  INSERT INTO ledgerloop.agent_run_event (run_id, tenant_id, sequence, event_type, payload)
  SELECT id, tenant_id, version, 'step.finished',
         jsonb_build_object(
           'step', %(function_name)s::text,
           'function_id', %(function_id)s::int,
           'started_at_ms', %(started_at_epoch_ms)s::bigint,
           'completed_at_ms', %(completed_at_epoch_ms)s::bigint,
           'error', %(error)s::text IS NOT NULL,
           -- The attempt its live events went out under, when it published any.
           'attempt', (SELECT max(t.attempt) FROM ledgerloop.run_text t
                       WHERE t.run_id = stepped.id AND t.step = %(function_name)s::text))
  FROM stepped
), rider AS (
  SELECT ridden.* FROM written CROSS JOIN LATERAL (
    SELECT * FROM (
      RIDER_QUERY
    ) AS query
    WHERE written.completed_at_epoch_ms = %(completed_at_epoch_ms)s
    OFFSET 0
  ) AS ridden
)
SELECT rider.*,
       (SELECT owner_xid FROM owner) AS owner_xid,
       EXISTS (SELECT 1 FROM written) AS written,
       (SELECT completed_at_epoch_ms FROM written) AS completed_at_epoch_ms,
       CASE WHEN %(answer_next)s::boolean THEN (
         SELECT status FROM dbos.workflow_status WHERE workflow_uuid = %(workflow_uuid)s
       ) END AS next_status,
       CASE WHEN %(answer_next)s::boolean THEN EXISTS (
         SELECT 1 FROM dbos.operation_outputs
         WHERE workflow_uuid = %(workflow_uuid)s AND function_id = %(function_id)s + 1
       ) END AS next_recorded
FROM (VALUES (1)) AS one (x)
LEFT JOIN (SELECT * FROM rider LIMIT 1) AS rider ON true
