-- Versioned deploys: moving checked runs to the version that will resume them.

-- name: workflows_adopt
-- Each candidate is adopted only if it is still exactly as the check saw it: same version,
-- same DBOS status and executor, and a journal that ends at the same operation. A run an old
-- worker took and ran further meanwhile is left alone (a later `deploy adopt` checks it
-- again). A PENDING run is adopted only when its executor is dead (no row, or silent for
-- %(stale_s)s); a live old worker is still executing it and keeps it.
--
-- This writes dbos.workflow_status directly: DBOS has no public call that moves a workflow
-- to another application version under the same id. fork_workflow(application_version=)
-- gives the copy a new id, and a run's id is its workflow's id: approvals, effects and the
-- messages that answer them are all addressed to it. The other values are what DBOS's own
-- resume_workflows sets when it re-enqueues a workflow; a DELAYED (hibernated) run stays
-- DELAYED and is woken as before. Setting `status` (even to itself) also fires the
-- dispatch trigger for a run that is ENQUEUED.
WITH candidate AS (
  SELECT * FROM unnest(%(ids)s::text[], %(statuses)s::text[], %(executors)s::text[],
                       %(last_ops)s::int[])
    AS c(id, status, executor_id, last_op)
)
UPDATE dbos.workflow_status ws
SET application_version = %(to_version)s,
    status = CASE WHEN ws.status = 'PENDING' THEN 'ENQUEUED' ELSE ws.status END,
    queue_name = CASE WHEN ws.status = 'PENDING' THEN %(queue)s ELSE ws.queue_name END,
    owner_xid = CASE WHEN ws.status = 'PENDING' THEN NULL ELSE ws.owner_xid END,
    started_at_epoch_ms = CASE WHEN ws.status = 'PENDING' THEN NULL
                               ELSE ws.started_at_epoch_ms END,
    recovery_attempts = CASE WHEN ws.status = 'PENDING' THEN 0 ELSE ws.recovery_attempts END,
    updated_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
FROM candidate c
WHERE ws.workflow_uuid = c.id
  AND ws.application_version IS DISTINCT FROM %(to_version)s
  AND ws.status = c.status
  AND ws.executor_id IS NOT DISTINCT FROM c.executor_id
  AND coalesce((SELECT max(o.function_id) FROM dbos.operation_outputs o
                WHERE o.workflow_uuid = ws.workflow_uuid), 0) = c.last_op
  AND (ws.status IN ('ENQUEUED', 'DELAYED')
       OR (ws.status = 'PENDING' AND NOT EXISTS (
             SELECT 1 FROM ledgerloop.executor e
             WHERE e.id = ws.executor_id
               AND e.heartbeat_at > now() - make_interval(secs => %(stale_s)s))))
RETURNING ws.workflow_uuid

-- name: episodes_adopt
-- The unfinished child episodes (ledgerloop.agent.episodes) of the runs just adopted go with
-- them: an adopted run waits for its child's result, and a child left on the old version is
-- dequeued by no worker of the new one. The same rules as for a run: an ENQUEUED child moves
-- at once, a PENDING one only when its executor is dead, and then back onto the queue it
-- came from (DBOS's internal queue, for a child started directly). A child a live old worker
-- still executes stays there; the adopted run reads its result when it ends.
UPDATE dbos.workflow_status ws
SET application_version = %(to_version)s,
    status = CASE WHEN ws.status = 'PENDING' THEN 'ENQUEUED' ELSE ws.status END,
    queue_name = CASE WHEN ws.status = 'PENDING'
                      THEN coalesce(ws.queue_name, '_dbos_internal_queue')
                      ELSE ws.queue_name END,
    owner_xid = CASE WHEN ws.status = 'PENDING' THEN NULL ELSE ws.owner_xid END,
    started_at_epoch_ms = CASE WHEN ws.status = 'PENDING' THEN NULL
                               ELSE ws.started_at_epoch_ms END,
    recovery_attempts = CASE WHEN ws.status = 'PENDING' THEN 0 ELSE ws.recovery_attempts END,
    updated_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
WHERE ws.parent_workflow_id = ANY(%(ids)s::text[])
  AND ws.application_version IS DISTINCT FROM %(to_version)s
  AND (ws.status IN ('ENQUEUED', 'DELAYED')
       OR (ws.status = 'PENDING' AND NOT EXISTS (
             SELECT 1 FROM ledgerloop.executor e
             WHERE e.id = ws.executor_id
               AND e.heartbeat_at > now() - make_interval(secs => %(stale_s)s))))
RETURNING ws.workflow_uuid
