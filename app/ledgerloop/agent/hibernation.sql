-- Hibernating a waiting run: its DBOS workflow row, locked first (the wake trigger locks it
-- too, so a concurrent message and a park never miss each other). DBOS 3.4's columns.

-- name: workflow_lock
SELECT status, executor_id
FROM dbos.workflow_status
WHERE workflow_uuid = %(workflow_id)s
FOR UPDATE

-- name: message_waiting
SELECT EXISTS (
  SELECT 1 FROM dbos.notifications
  WHERE destination_uuid = %(workflow_id)s AND topic = %(topic)s AND NOT consumed
) AS waiting

-- name: workflow_park
-- DELAYED until the wait's deadline: DBOS enqueues it then by itself. The dispatch that ran
-- until now was no failure, so it does not count against the recovery limit.
UPDATE dbos.workflow_status
SET status = 'DELAYED',
    delay_until_epoch_ms = %(until_ms)s,
    owner_xid = NULL,
    started_at_epoch_ms = NULL,
    queue_name = coalesce(queue_name, %(queue)s),
    recovery_attempts = greatest(recovery_attempts - 1, 0),
    updated_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
WHERE workflow_uuid = %(workflow_id)s AND status = 'PENDING' AND executor_id = %(executor_id)s

-- name: workflow_requeue
-- Its message came while the execution was being dropped: run it again now.
UPDATE dbos.workflow_status
SET status = 'ENQUEUED',
    owner_xid = NULL,
    started_at_epoch_ms = NULL,
    queue_name = coalesce(queue_name, %(queue)s),
    recovery_attempts = greatest(recovery_attempts - 1, 0),
    updated_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
WHERE workflow_uuid = %(workflow_id)s AND status = 'PENDING' AND executor_id = %(executor_id)s
