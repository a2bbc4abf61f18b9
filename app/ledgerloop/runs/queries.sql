-- The run store's runtime queries. Every write to agent_run / agent_run_event is here.

-- name: run_insert
INSERT INTO ledgerloop.agent_run (id, tenant_id, agent, status, state, input, idempotency_key)
VALUES (%(id)s, %(tenant_id)s, %(agent)s, 'received', '{}'::jsonb, %(input)s, %(idempotency_key)s)
ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, tenant_id, agent, status, state, input, idempotency_key, version,
          created_at, updated_at

-- name: run_get_by_idempotency_key
SELECT id, tenant_id, agent, status, state, input, idempotency_key, version,
       created_at, updated_at
FROM ledgerloop.agent_run
WHERE tenant_id = %(tenant_id)s AND idempotency_key = %(idempotency_key)s

-- name: run_event_insert
INSERT INTO ledgerloop.agent_run_event (run_id, tenant_id, sequence, event_type, payload)
VALUES (%(run_id)s, %(tenant_id)s, %(sequence)s, %(event_type)s, %(payload)s)

-- name: run_get
SELECT id, tenant_id, agent, status, state, input, idempotency_key, version,
       created_at, updated_at
FROM ledgerloop.agent_run
WHERE id = %(id)s

-- name: run_transition
-- Optimistic concurrency: exactly one row changes, or the caller's snapshot was stale.
UPDATE ledgerloop.agent_run
SET status = %(status)s,
    state = state || %(state_patch)s,
    version = version + 1,
    updated_at = now()
WHERE id = %(id)s AND version = %(version)s
RETURNING id, tenant_id, agent, status, state, input, idempotency_key, version,
          created_at, updated_at

-- name: run_event_last
SELECT sequence, event_type, payload, created_at
FROM ledgerloop.agent_run_event
WHERE run_id = %(run_id)s
ORDER BY sequence DESC
LIMIT 1

-- name: run_events
SELECT sequence, event_type, payload, created_at
FROM ledgerloop.agent_run_event
WHERE run_id = %(run_id)s
ORDER BY sequence

-- name: run_list
SELECT id, tenant_id, agent, status, state, input, idempotency_key, version,
       created_at, updated_at
FROM ledgerloop.agent_run
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(agent)s::text IS NULL OR agent = %(agent)s::text)
ORDER BY created_at DESC, id
LIMIT %(limit)s
