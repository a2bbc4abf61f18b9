-- The agent loop's runtime queries: conversation memory and offloaded payloads.

-- name: messages_for_conversation
SELECT role, content
FROM ledgerloop.agent_message
WHERE tenant_id = %(tenant_id)s AND conversation_id = %(conversation_id)s
ORDER BY created_at, run_id, sequence

-- name: message_insert
-- A replayed memory-save writes the same (run_id, sequence) again: keep the first.
INSERT INTO ledgerloop.agent_message
  (run_id, tenant_id, conversation_id, sequence, turn, role, content)
VALUES (%(run_id)s, %(tenant_id)s, %(conversation_id)s, %(sequence)s, %(turn)s, %(role)s,
        %(content)s)
ON CONFLICT (run_id, sequence) DO NOTHING

-- name: payload_insert
INSERT INTO ledgerloop.payload (id, tenant_id, run_id, kind, size_bytes, sha256, content)
VALUES (%(id)s, %(tenant_id)s, %(run_id)s, %(kind)s, %(size_bytes)s, %(sha256)s, %(content)s)
ON CONFLICT (id) DO NOTHING

-- name: payload_get
SELECT id, tenant_id, run_id, kind, size_bytes, sha256, content, created_at
FROM ledgerloop.payload
WHERE id = %(id)s

-- name: run_trace_link_swap
-- Telemetry metadata, not a state change: no version bump, no event. One round trip appends
-- this execution's span context and returns the earlier ones; the row lock orders concurrent
-- executions, so none is lost.
WITH prev AS (
  SELECT id, coalesce(state->'trace_links', '[]'::jsonb) AS links
  FROM ledgerloop.agent_run
  WHERE id = %(run_id)s
  FOR UPDATE
)
UPDATE ledgerloop.agent_run r
SET state = jsonb_set(r.state, '{trace_links}', prev.links || %(link)s)
FROM prev
WHERE r.id = prev.id
RETURNING prev.links
