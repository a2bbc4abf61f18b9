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
