-- Principals and approvals. Every write to ledgerloop.principal / ledgerloop.approval is here.

-- name: principal_insert
INSERT INTO ledgerloop.principal (id, tenant_id, name, roles, token_hash)
VALUES (%(id)s, %(tenant_id)s, %(name)s, %(roles)s, %(token_hash)s)
RETURNING id, tenant_id, name, roles, created_at, revoked_at

-- name: principal_get_for_auth
-- The one query that reads token_hash; nothing returns it to a caller.
SELECT id, tenant_id, name, roles, token_hash, created_at, revoked_at
FROM ledgerloop.principal
WHERE id = %(id)s

-- name: principal_get
SELECT id, tenant_id, name, roles, created_at, revoked_at
FROM ledgerloop.principal
WHERE id = %(id)s

-- name: principal_lock
-- FOR SHARE: a revocation waits for decisions in flight, and none starts after it commits.
SELECT id, tenant_id, name, roles, created_at, revoked_at
FROM ledgerloop.principal
WHERE id = %(id)s
FOR SHARE

-- name: principal_revoke
UPDATE ledgerloop.principal
SET revoked_at = COALESCE(%(now)s::timestamptz, now())
WHERE id = %(id)s AND revoked_at IS NULL
RETURNING id

-- name: principal_list
SELECT id, tenant_id, name, roles, created_at, revoked_at
FROM ledgerloop.principal
WHERE (%(tenant_id)s::uuid IS NULL OR tenant_id = %(tenant_id)s::uuid)
  AND (%(include_revoked)s OR revoked_at IS NULL)
ORDER BY created_at, id

-- name: approval_insert
-- Takes the tenant from the run itself: a request naming another tenant inserts nothing.
INSERT INTO ledgerloop.approval (id, run_id, tenant_id, tool, tool_call_id, action_hash, preview,
                                 policy_version, required_roles, requested_at, expires_at)
SELECT %(id)s, r.id, r.tenant_id, %(tool)s, %(tool_call_id)s, %(action_hash)s, %(preview)s,
       %(policy_version)s, %(required_roles)s, COALESCE(%(now)s::timestamptz, now()),
       -- The database's clock: a time-to-live counts from its now(), capped by expires_at.
       -- LEAST ignores NULLs: either bound alone applies, and neither means no expiry.
       LEAST(%(expires_at)s::timestamptz,
             COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => %(ttl_s)s::float8))
FROM ledgerloop.agent_run r
WHERE r.id = %(run_id)s AND r.tenant_id = %(tenant_id)s
ON CONFLICT (run_id, tool_call_id, action_hash) DO NOTHING
RETURNING id, run_id, tenant_id, tool, tool_call_id, action_hash, preview, policy_version,
          required_roles, requested_at, expires_at, status, decided_by_principal,
          decided_by_name, auth_token_id, auth_role, decision, reason, decided_at, closed_at

-- name: approval_get_by_action
SELECT id, run_id, tenant_id, tool, tool_call_id, action_hash, preview, policy_version,
       required_roles, requested_at, expires_at, status, decided_by_principal,
       decided_by_name, auth_token_id, auth_role, decision, reason, decided_at, closed_at
FROM ledgerloop.approval
WHERE run_id = %(run_id)s AND tool_call_id = %(tool_call_id)s AND action_hash = %(action_hash)s

-- name: approval_supersede
-- A new action for the same tool call replaces the older proposals still waiting.
UPDATE ledgerloop.approval
SET status = 'superseded', closed_at = COALESCE(%(now)s::timestamptz, now())
WHERE run_id = %(run_id)s
  AND tool_call_id = %(tool_call_id)s
  AND action_hash <> %(action_hash)s
  AND status = 'pending'

-- name: approval_get
SELECT id, run_id, tenant_id, tool, tool_call_id, action_hash, preview, policy_version,
       required_roles, requested_at, expires_at, status, decided_by_principal,
       decided_by_name, auth_token_id, auth_role, decision, reason, decided_at, closed_at
FROM ledgerloop.approval
WHERE id = %(id)s

-- name: approval_read
-- What the waiting run acts on: the row, and how long until it expires by this clock.
SELECT id, run_id, tenant_id, tool, tool_call_id, action_hash, preview, policy_version,
       required_roles, requested_at, expires_at, status, decided_by_principal,
       decided_by_name, auth_token_id, auth_role, decision, reason, decided_at, closed_at,
       extract(epoch FROM expires_at - COALESCE(%(now)s::timestamptz, now()))::float8
         AS remaining_s
FROM ledgerloop.approval
WHERE id = %(id)s

-- name: approval_run_lock
-- FOR SHARE on the run before the approval row: the same order as a cancellation (run, then
-- its approvals), so the two never deadlock, and a cancel in flight is seen, not raced.
SELECT status
FROM ledgerloop.agent_run
WHERE id = %(run_id)s
FOR SHARE

-- name: approval_lock
SELECT id, run_id, tenant_id, tool, tool_call_id, action_hash, preview, policy_version,
       required_roles, requested_at, expires_at, status, decided_by_principal,
       decided_by_name, auth_token_id, auth_role, decision, reason, decided_at, closed_at,
       (expires_at IS NOT NULL AND COALESCE(%(now)s::timestamptz, now()) > expires_at)
         AS past_expiry
FROM ledgerloop.approval
WHERE id = %(id)s
FOR UPDATE

-- name: approval_record_decision
UPDATE ledgerloop.approval
SET status = %(decision)s,
    decision = %(decision)s,
    decided_by_principal = %(principal_id)s,
    decided_by_name = %(principal_name)s,
    auth_token_id = %(token_id)s,
    auth_role = %(auth_role)s,
    reason = %(reason)s,
    decided_at = COALESCE(%(now)s::timestamptz, now()),
    closed_at = COALESCE(%(now)s::timestamptz, now())
WHERE id = %(id)s AND status = 'pending'
RETURNING id, run_id, tenant_id, tool, tool_call_id, action_hash, preview, policy_version,
          required_roles, requested_at, expires_at, status, decided_by_principal,
          decided_by_name, auth_token_id, auth_role, decision, reason, decided_at, closed_at

-- name: approval_send_decision
-- DBOS's SQL send, in the decision's transaction. message_id makes a repeat a no-op.
SELECT dbos.send_message(
  destination_id => %(destination_id)s,
  message => %(message)s::json,
  topic => %(topic)s,
  message_id => %(message_id)s
)

-- name: approval_expire
UPDATE ledgerloop.approval
SET status = 'expired', closed_at = COALESCE(%(now)s::timestamptz, now())
WHERE id = %(id)s
  AND status = 'pending'
  AND expires_at IS NOT NULL
  AND COALESCE(%(now)s::timestamptz, now()) > expires_at
RETURNING id, run_id, tenant_id, tool, tool_call_id, action_hash, preview, policy_version,
          required_roles, requested_at, expires_at, status, decided_by_principal,
          decided_by_name, auth_token_id, auth_role, decision, reason, decided_at, closed_at

-- name: approval_cancel_for_run
UPDATE ledgerloop.approval
SET status = 'cancelled', closed_at = COALESCE(%(now)s::timestamptz, now())
WHERE run_id = %(run_id)s AND status = 'pending'
RETURNING id

-- name: approval_list
SELECT id, run_id, tenant_id, tool, tool_call_id, action_hash, preview, policy_version,
       required_roles, requested_at, expires_at, status, decided_by_principal,
       decided_by_name, auth_token_id, auth_role, decision, reason, decided_at, closed_at
FROM ledgerloop.approval
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(run_id)s::uuid IS NULL OR run_id = %(run_id)s::uuid)
ORDER BY requested_at DESC, id
LIMIT %(limit)s
