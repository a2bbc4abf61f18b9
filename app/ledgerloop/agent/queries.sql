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
