-- The agent loop's runtime queries: conversation memory and offloaded payloads.

-- name: messages_for_conversation
-- A conversation's saves in order, each as a JSON array of its messages: one row per save
-- (agent_message_batch), and a row per message from releases before it (agent_message).
SELECT messages FROM (
  SELECT created_at, run_id, first_sequence AS sequence, messages
  FROM ledgerloop.agent_message_batch
  WHERE tenant_id = %(tenant_id)s AND conversation_id = %(conversation_id)s
  UNION ALL
  SELECT created_at, run_id, sequence,
         json_build_array(json_build_object('role', role, 'content', content))
  FROM ledgerloop.agent_message
  WHERE tenant_id = %(tenant_id)s AND conversation_id = %(conversation_id)s
) AS saves
ORDER BY created_at, run_id, sequence

-- name: payload_insert
INSERT INTO ledgerloop.payload (id, tenant_id, run_id, kind, size_bytes, sha256, content)
VALUES (%(id)s, %(tenant_id)s, %(run_id)s, %(kind)s, %(size_bytes)s, %(sha256)s, %(content)s)
ON CONFLICT (id) DO NOTHING

-- name: payload_get
SELECT id, tenant_id, run_id, kind, size_bytes, sha256, content, created_at
FROM ledgerloop.payload
WHERE id = %(id)s

-- name: messages_delete_for_runs
-- Retention: the conversation messages these runs wrote (a later run in the same
-- conversation no longer sees them).
WITH batches AS (
  DELETE FROM ledgerloop.agent_message_batch WHERE run_id = ANY(%(run_ids)s) RETURNING 1
), rows AS (
  DELETE FROM ledgerloop.agent_message WHERE run_id = ANY(%(run_ids)s) RETURNING 1
)
SELECT (SELECT count(*) FROM batches) + (SELECT count(*) FROM rows) AS deleted

-- name: payloads_delete_for_runs
DELETE FROM ledgerloop.payload WHERE run_id = ANY(%(run_ids)s)

-- name: effect_record_claimed
-- A write's record in one statement (no BEGIN, no COMMIT: one round trip), for a worker
-- whose relay delivers it: the run's move to executing with its event under the write's
-- step name (run_advance's rules, for that one move), and the effect and its outbox row,
-- both born claimed: attempt 1 under a lease, exactly as the relay's claim would leave them,
-- so a crash before the outcome is recorded settles the same way (the reconciler takes the
-- effect once the lease runs out; the relay is not woken: its claim reads pending rows).
-- The function (migration 0020) holds the statement, so that a step's checkpoint can run
-- it too (db/dbos_checkpoint.sql, a rider); its answer's columns are those of
-- effect_insert's RETURNING, with `current`, `granted` and `there` saying what held.
SELECT * FROM ledgerloop.effect_record_claimed(
  p_key => %(key)s, p_run_id => %(run_id)s, p_tenant_id => %(tenant_id)s,
  p_tool => %(tool)s, p_request_hash => %(request_hash)s, p_destination => %(destination)s,
  p_request => %(request)s, p_timeout_ms => %(timeout_ms)s::float8,
  p_lease_margin_s => %(lease_margin_s)s::float8, p_deadline_s => %(deadline_s)s::float8,
  p_approval_id => %(approval_id)s::uuid, p_step => %(step)s::text,
  p_payload => %(payload)s, p_allowed_from => %(allowed_from)s::text[])
