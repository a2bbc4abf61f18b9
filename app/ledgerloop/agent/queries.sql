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
-- Nothing is written unless the approval, when there is one, is approved by a principal for
-- exactly this action; the effect is written only when the run is there under this step
-- (moved now, or by an earlier execution of the step). The answer says what held: no effect
-- columns means the approval, the run or the key said no.
WITH granted AS (
  SELECT 1 WHERE %(approval_id)s::uuid IS NULL
  UNION ALL
  SELECT 1 FROM ledgerloop.approval a
  WHERE a.id = %(approval_id)s::uuid
    AND a.status = 'approved'
    AND a.decided_by_principal IS NOT NULL
    AND a.auth_role IS NOT NULL
    AND a.action_hash = %(request_hash)s
), cur AS (
  SELECT id, status FROM ledgerloop.agent_run WHERE id = %(run_id)s FOR NO KEY UPDATE
), seen AS (
  SELECT 1 FROM ledgerloop.agent_run_event WHERE run_id = %(run_id)s AND step = %(step)s::text
), moved AS (
  UPDATE ledgerloop.agent_run r
  SET status = 'executing', version = r.version + 1, updated_at = now()
  FROM cur
  WHERE r.id = cur.id
    AND cur.status = ANY(%(allowed_from)s::text[])
    AND EXISTS (SELECT 1 FROM granted)
    AND NOT EXISTS (SELECT 1 FROM seen)
  RETURNING r.id, r.tenant_id, r.version
), event AS (
  INSERT INTO ledgerloop.agent_run_event (run_id, tenant_id, sequence, event_type, payload, step)
  SELECT id, tenant_id, version, 'executing', %(payload)s, %(step)s FROM moved
), effect AS (
  INSERT INTO ledgerloop.activity_effect
    (idempotency_key, run_id, tenant_id, tool, request_hash, destination, status, attempts,
     lease_until)
  SELECT %(key)s, %(run_id)s, %(tenant_id)s, %(tool)s, %(request_hash)s, %(destination)s,
         'started', 1,
         now() + make_interval(secs => %(timeout_ms)s::float8 / 1000 + %(lease_margin_s)s)
  WHERE EXISTS (SELECT 1 FROM granted)
    AND (EXISTS (SELECT 1 FROM moved) OR EXISTS (SELECT 1 FROM seen))
  ON CONFLICT (idempotency_key) DO NOTHING
  RETURNING idempotency_key, run_id, tenant_id, tool, request_hash, destination, status,
            external_reference, result, error, evidence, attempts, lease_until, compensates,
            resolved_by, created_at, updated_at
), queued AS (
  INSERT INTO ledgerloop.outbox
    (idempotency_key, tenant_id, destination, request, deadline_at, status, attempts,
     lease_until)
  SELECT idempotency_key, tenant_id, destination, %(request)s,
         now() + make_interval(secs => %(deadline_s)s), 'claimed', 1, lease_until
  FROM effect
  RETURNING id, extract(epoch FROM deadline_at - now())::float8 AS deadline_in_s
)
SELECT cur.status AS current,
       EXISTS (SELECT 1 FROM granted) AS granted,
       EXISTS (SELECT 1 FROM moved) OR EXISTS (SELECT 1 FROM seen) AS there,
       effect.*, queued.id AS outbox_id, queued.deadline_in_s
FROM cur
LEFT JOIN (effect CROSS JOIN queued) ON true
