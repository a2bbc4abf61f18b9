-- Messages to a running agent (table run_message, migration 0026). A message is taken into the
-- conversation by a step of the run's workflow, whose journaled result holds it; the ids a run
-- has taken travel with the run (RunContext.messages_taken), so a step retried after a crash
-- reads the same pending rows again instead of losing them.

-- name: run_message_run_lock
-- The run's status and tenant, locked against a concurrent terminal transition until the
-- message and its wake-up commit: a 202 never lands on a run that ended first.
SELECT id, tenant_id, status
FROM ledgerloop.agent_run
WHERE id = %(run_id)s
FOR SHARE

-- name: run_message_insert
INSERT INTO ledgerloop.run_message (id, run_id, tenant_id, idempotency_key, content, sent_by)
VALUES (%(id)s, %(run_id)s, %(tenant_id)s, %(idempotency_key)s, %(content)s, %(sent_by)s)
ON CONFLICT (run_id, idempotency_key) DO NOTHING
RETURNING id, run_id, idempotency_key, content, sent_by, created_at, consumed_at

-- name: run_message_by_key
SELECT id, run_id, idempotency_key, content, sent_by, created_at, consumed_at
FROM ledgerloop.run_message
WHERE run_id = %(run_id)s AND idempotency_key = %(idempotency_key)s

-- name: run_message_send
-- DBOS's SQL send in the message's transaction: it wakes a hibernated run (the
-- wake_hibernated_run trigger) and a `wait_for_message`. message_id makes a repeat a no-op.
SELECT dbos.send_message(
  destination_id => %(destination_id)s,
  message => %(message)s::json,
  topic => %(topic)s,
  message_id => %(message_id)s
)

-- name: run_message_take
-- The run's messages not yet in its conversation, oldest first; those it took before are
-- marked consumed on the way (their step's result is journaled by now).
WITH marked AS (
  UPDATE ledgerloop.run_message
  SET consumed_at = now()
  WHERE run_id = %(run_id)s AND consumed_at IS NULL AND id = ANY(%(taken)s::uuid[])
)
SELECT id, content, sent_by, created_at
FROM ledgerloop.run_message
WHERE run_id = %(run_id)s AND consumed_at IS NULL AND NOT (id = ANY(%(taken)s::uuid[]))
ORDER BY created_at, id
LIMIT %(limit)s

-- name: run_message_pending
-- Whether a message waits for the run (a read on the partial index, no step).
SELECT EXISTS (
  SELECT 1 FROM ledgerloop.run_message
  WHERE run_id = %(run_id)s AND consumed_at IS NULL AND NOT (id = ANY(%(taken)s::uuid[]))
) AS pending
