-- The effect ledger's and the outbox's runtime queries. Every write to activity_effect and
-- outbox is here, but one: an act step's record of an effect its own worker's relay delivers,
-- which moves the run in the same statement (agent/queries.sql, effect_record_claimed).
-- Messages to waiting workflows are sent by the trigger
-- activity_effect_reported (migration 0003) whenever a status in REPORTED is recorded on an
-- effect a workflow may wait for (`awaited`, migration 0021), so no query below can record an
-- outcome without telling a workflow that waits. An effect its own worker's relay delivers is
-- born not awaited; effect_await marks it before its step waits.
--
-- Guards: every update of an effect that someone else may be settling at the same time carries
-- `status = seen AND attempts = seen`, so of a late relay and a reconciler exactly one wins.

-- name: effect_insert
-- The effect and its outbox row in one statement: both rows or neither. On a key that exists
-- it returns nothing and inserts nothing; the caller then reads the existing effect.
WITH effect AS (
  INSERT INTO ledgerloop.activity_effect
    (idempotency_key, run_id, tenant_id, tool, request_hash, destination, compensates)
  VALUES (%(key)s, %(run_id)s, %(tenant_id)s, %(tool)s, %(request_hash)s, %(destination)s,
          %(compensates)s)
  ON CONFLICT (idempotency_key) DO NOTHING
  RETURNING idempotency_key, run_id, tenant_id, tool, request_hash, destination, status,
            external_reference, result, error, evidence, attempts, lease_until, compensates,
            resolved_by, created_at, updated_at
), queued AS (
  INSERT INTO ledgerloop.outbox (idempotency_key, tenant_id, destination, request, deadline_at)
  SELECT idempotency_key, tenant_id, destination, %(request)s,
         now() + make_interval(secs => %(deadline_s)s)
  FROM effect
  RETURNING id
)
SELECT effect.*, (SELECT id FROM queued) AS outbox_id FROM effect

-- name: effect_get
SELECT idempotency_key, run_id, tenant_id, tool, request_hash, destination, status,
       external_reference, result, error, evidence, attempts, lease_until, compensates,
       resolved_by, created_at, updated_at
FROM ledgerloop.activity_effect
WHERE idempotency_key = %(key)s

-- name: effect_await
-- A workflow is about to wait for this effect's outcome: from now on each status recorded
-- sends it a message, and marking it sends the message of a status already recorded
-- (activity_effect_awaited). The row as it is once marked; an effect already awaited is
-- only read (no row version, no WAL).
WITH marked AS (
  UPDATE ledgerloop.activity_effect SET awaited = true
  WHERE idempotency_key = %(key)s AND NOT awaited
  RETURNING idempotency_key, run_id, tenant_id, tool, request_hash, destination, status,
            external_reference, result, error, evidence, attempts, lease_until, compensates,
            resolved_by, created_at, updated_at
)
SELECT * FROM marked
UNION ALL
SELECT idempotency_key, run_id, tenant_id, tool, request_hash, destination, status,
       external_reference, result, error, evidence, attempts, lease_until, compensates,
       resolved_by, created_at, updated_at
FROM ledgerloop.activity_effect
WHERE idempotency_key = %(key)s AND NOT EXISTS (SELECT 1 FROM marked)

-- name: effect_list
SELECT idempotency_key, run_id, tenant_id, tool, request_hash, destination, status,
       external_reference, result, error, evidence, attempts, lease_until, compensates,
       resolved_by, created_at, updated_at
FROM ledgerloop.activity_effect
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(run_id)s::uuid IS NULL OR run_id = %(run_id)s::uuid)
ORDER BY created_at DESC, idempotency_key
LIMIT %(limit)s

-- name: effect_lock
-- An operator's resolve: hold the effect and its outbox row while deciding.
SELECT e.idempotency_key, e.run_id, e.tenant_id, e.tool, e.request_hash, e.destination,
       e.status, e.external_reference, e.result, e.error, e.evidence, e.attempts,
       e.lease_until, e.compensates, e.resolved_by, e.created_at, e.updated_at,
       o.request
FROM ledgerloop.activity_effect e
JOIN ledgerloop.outbox o USING (idempotency_key)
WHERE e.idempotency_key = %(key)s
FOR UPDATE OF e, o

-- name: effect_settle
-- Record a settlement (reconciler, operator) and close the outbox row if it is still open.
WITH effect AS (
  UPDATE ledgerloop.activity_effect
  SET status = %(status)s,
      external_reference = COALESCE(%(external_reference)s, external_reference),
      result = COALESCE(%(result)s, result),
      error = %(error)s,
      evidence = COALESCE(evidence, '{}'::jsonb) || %(evidence)s,
      resolved_by = COALESCE(%(operator)s, resolved_by),
      lease_until = NULL,
      updated_at = now()
  WHERE idempotency_key = %(key)s
    AND status = %(seen_status)s
    AND attempts = %(seen_attempts)s
  RETURNING idempotency_key, run_id, tenant_id, tool, request_hash, destination, status,
            external_reference, result, error, evidence, attempts, lease_until, compensates,
            resolved_by, created_at, updated_at
), closed AS (
  UPDATE ledgerloop.outbox o
  SET status = %(outbox_status)s, lease_until = NULL, last_error = COALESCE(%(error)s, o.last_error)
  FROM effect
  WHERE o.idempotency_key = effect.idempotency_key AND o.status IN ('pending', 'claimed')
)
SELECT * FROM effect

-- name: effect_requeue
-- Send again with the same key: the effect goes back to pending and the relay is woken.
-- `new_budget` (an operator's retry) restarts the attempt count and the deadline.
WITH effect AS (
  UPDATE ledgerloop.activity_effect
  SET status = 'pending',
      lease_until = NULL,
      evidence = COALESCE(evidence, '{}'::jsonb) || %(evidence)s,
      resolved_by = COALESCE(%(operator)s, resolved_by),
      updated_at = now()
  WHERE idempotency_key = %(key)s
    AND status = %(seen_status)s
    AND attempts = %(seen_attempts)s
  RETURNING idempotency_key
), queued AS (
  UPDATE ledgerloop.outbox o
  SET status = 'pending',
      available_at = now(),
      lease_until = NULL,
      attempts = CASE WHEN %(new_budget)s THEN 0 ELSE o.attempts END,
      deadline_at = CASE
        WHEN %(new_budget)s THEN now() + make_interval(secs => (o.request->>'deadline_s')::float8)
        ELSE o.deadline_at END
  FROM effect
  WHERE o.idempotency_key = effect.idempotency_key
  RETURNING o.id
)
SELECT id, pg_notify('ledgerloop_outbox', id::text) AS notified FROM queued

-- name: effect_recheck
-- An operator's retry on a destination with a lookup: hand the effect back to the reconciler,
-- which looks before it resends, with a fresh attempt budget.
WITH effect AS (
  UPDATE ledgerloop.activity_effect
  SET status = 'outcome_unknown',
      lease_until = now(),
      evidence = COALESCE(evidence, '{}'::jsonb) || %(evidence)s,
      resolved_by = %(operator)s,
      updated_at = now()
  WHERE idempotency_key = %(key)s
    AND status = %(seen_status)s
    AND attempts = %(seen_attempts)s
  RETURNING idempotency_key, run_id, tenant_id, tool, request_hash, destination, status,
            external_reference, result, error, evidence, attempts, lease_until, compensates,
            resolved_by, created_at, updated_at
), budget AS (
  UPDATE ledgerloop.outbox o
  SET attempts = 0,
      deadline_at = now() + make_interval(secs => (o.request->>'deadline_s')::float8)
  FROM effect
  WHERE o.idempotency_key = effect.idempotency_key
)
SELECT * FROM effect

-- name: effect_defer
-- The reconciler could not decide (the lookup did not answer): look again later.
UPDATE ledgerloop.activity_effect
SET lease_until = now() + make_interval(secs => %(retry_in_s)s),
    evidence = COALESCE(evidence, '{}'::jsonb) || %(evidence)s
WHERE idempotency_key = %(key)s
  AND status = %(seen_status)s
  AND attempts = %(seen_attempts)s

-- name: effect_claim_unsettled
-- The reconciler's claim: unknown outcomes whose settle delay passed, and started effects whose
-- relay lease expired. The new lease keeps a second reconciler off them while this one asks.
WITH picked AS (
  SELECT idempotency_key
  FROM ledgerloop.activity_effect
  WHERE status IN ('started', 'outcome_unknown')
    AND (lease_until IS NULL OR lease_until <= now())
  ORDER BY lease_until NULLS FIRST
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
), claimed AS (
  UPDATE ledgerloop.activity_effect e
  SET lease_until = now() + make_interval(secs => %(lease_s)s)
  FROM picked
  WHERE e.idempotency_key = picked.idempotency_key
  RETURNING e.idempotency_key, e.run_id, e.tenant_id, e.tool, e.request_hash, e.destination,
            e.status, e.external_reference, e.result, e.error, e.evidence, e.attempts,
            e.lease_until, e.compensates, e.resolved_by, e.created_at, e.updated_at
)
SELECT c.*, o.request, o.attempts AS budget_attempts, o.last_error AS outbox_last_error,
       extract(epoch FROM o.deadline_at - now())::float8 AS deadline_in_s
FROM claimed c
JOIN ledgerloop.outbox o USING (idempotency_key)

-- name: effect_next_unsettled
SELECT extract(epoch FROM min(lease_until) - now())::float8 AS due_in_s
FROM ledgerloop.activity_effect
WHERE status IN ('started', 'outcome_unknown')

-- name: outbox_claim
-- The relay's claim, in one statement: take due rows (SKIP LOCKED, so relays share the work),
-- lease them, and commit `started` on their effects before any call goes out.
-- Only a row its run vouches for is started: its effect has the same key, tenant and
-- destination; the run's journal holds the event its act step records with the effect (in
-- the same transaction: 'executing', naming the key; a compensation, the key it undoes);
-- and when that call was put to a person, an approval of exactly this action (run, call,
-- request hash) was granted. Rows written any other way (by hand, by a role that could
-- write the tables, by a bug) are never sent (outbox_refuse).
WITH picked AS (
  SELECT id
  FROM ledgerloop.outbox
  WHERE status = 'pending' AND available_at <= now()
  ORDER BY available_at, id
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
), claimed AS (
  UPDATE ledgerloop.outbox o
  SET status = 'claimed',
      attempts = o.attempts + 1,
      lease_until = now() + make_interval(
        secs => (o.request->>'timeout_ms')::float8 / 1000 + %(lease_margin_s)s)
  FROM picked
  WHERE o.id = picked.id
  RETURNING o.id, o.idempotency_key, o.tenant_id, o.destination, o.request, o.attempts,
            o.lease_until, extract(epoch FROM o.deadline_at - now())::float8 AS deadline_in_s
), vouched AS (
  SELECT c.id
  FROM claimed c
  JOIN ledgerloop.activity_effect e ON e.idempotency_key = c.idempotency_key
  JOIN LATERAL (
    SELECT ev.payload->>'tool_call_id' AS call_id
    FROM ledgerloop.agent_run_event ev
    WHERE ev.run_id = e.run_id AND ev.tenant_id = e.tenant_id
      AND ev.event_type = 'executing'
      AND ev.payload->>'idempotency_key' = coalesce(e.compensates, e.idempotency_key)
    LIMIT 1
  ) step ON true
  WHERE e.tenant_id = c.tenant_id AND e.destination = c.destination
    AND (e.compensates IS NOT NULL
         OR NOT EXISTS (
           SELECT 1 FROM ledgerloop.approval a
           WHERE a.run_id = e.run_id AND a.tool_call_id = step.call_id)
         OR EXISTS (
           SELECT 1 FROM ledgerloop.approval a
           WHERE a.run_id = e.run_id AND a.tool_call_id = step.call_id
             AND a.tenant_id = e.tenant_id AND a.action_hash = e.request_hash
             AND a.status = 'approved'))
), started AS (
  UPDATE ledgerloop.activity_effect e
  SET status = 'started', attempts = e.attempts + 1, lease_until = c.lease_until,
      updated_at = now()
  FROM claimed c
  WHERE e.idempotency_key = c.idempotency_key AND e.status = 'pending'
    AND c.id IN (SELECT id FROM vouched)
  RETURNING e.idempotency_key, e.attempts, e.compensates
)
SELECT c.id, c.idempotency_key, c.destination, c.request, c.attempts, c.deadline_in_s,
       s.attempts AS effect_attempts, s.compensates, s.idempotency_key IS NOT NULL AS started,
       c.id IN (SELECT id FROM vouched) AS vouched
FROM claimed c
LEFT JOIN started s USING (idempotency_key)

-- name: outbox_refuse
-- Outbox rows no run vouches for (outbox_claim): never sent. Their effects, if any, fail
-- with the reason, so nothing stays pending and an operator finds them (`effects list`).
WITH closed AS (
  UPDATE ledgerloop.outbox
  SET status = 'dead', lease_until = NULL, last_error = %(error)s
  WHERE id = ANY(%(ids)s)
  RETURNING idempotency_key
)
UPDATE ledgerloop.activity_effect e
SET status = 'failed', error = %(error)s, updated_at = now()
FROM closed
WHERE e.idempotency_key = closed.idempotency_key AND e.status = 'pending'

-- name: outbox_close_orphans
-- Outbox rows whose effect was not pending when claimed (changed by hand): never send them.
UPDATE ledgerloop.outbox
SET status = 'dead', lease_until = NULL, last_error = %(error)s
WHERE id = ANY(%(ids)s)

-- name: outbox_record
-- The relay's outcomes, many at once: record each on its effect (only if this relay's attempt
-- still owns it) and close or reschedule its outbox row, in one transaction. An outcome with
-- a `replan_step` (a write its own act step sent, the last of its turn) that settles the
-- effect also moves the run from executing back to planning, with the event recorded under
-- that step's name exactly as the step's own move would have (run_advance): the turn then
-- has no commit of its own for the move. A lost attempt moves nothing.
-- Each effect is a primary-key lookup (migration 0022): the outcomes come as a set the
-- planner expects to be one row, and the status they settle from comes with them, so the
-- partial index of unsettled effects never matches (through it, one outcome read every
-- effect in flight).
WITH outcome AS (
  SELECT * FROM ledgerloop.effect_outcomes(%(outcomes)s::jsonb)
), effect AS (
  UPDATE ledgerloop.activity_effect e
  SET status = outcome.status,
      external_reference = COALESCE(outcome.external_reference, e.external_reference),
      result = outcome.result,
      error = outcome.error,
      evidence = CASE WHEN outcome.evidence IS NULL THEN e.evidence
                      ELSE COALESCE(e.evidence, '{}'::jsonb) || outcome.evidence END,
      lease_until = CASE WHEN outcome.lease_s IS NULL THEN NULL
                         ELSE now() + make_interval(secs => outcome.lease_s) END,
      updated_at = now()
  FROM outcome
  WHERE e.idempotency_key = outcome.key
    AND e.status = outcome.from_status
    AND e.attempts = outcome.attempt
  RETURNING e.idempotency_key, e.run_id
), replanned AS (
  -- Only from executing: a run cancelled meanwhile stays cancelled (its act step finds out
  -- at its next move), and a step whose event is already recorded moves nothing again.
  UPDATE ledgerloop.agent_run r
  SET status = 'planning', version = r.version + 1, updated_at = now()
  FROM outcome
  JOIN effect ON effect.idempotency_key = outcome.key
  WHERE outcome.replan_step IS NOT NULL
    AND outcome.status IN ('succeeded', 'failed')
    AND r.id = effect.run_id
    AND r.status = 'executing'
    AND NOT EXISTS (
      SELECT 1 FROM ledgerloop.agent_run_event ev
      WHERE ev.run_id = r.id AND ev.step = outcome.replan_step
    )
  RETURNING r.id, r.tenant_id, r.version, outcome.replan_step
), replan_event AS (
  INSERT INTO ledgerloop.agent_run_event (run_id, tenant_id, sequence, event_type, payload, step)
  SELECT id, tenant_id, version, 'planning', '{}'::jsonb, replan_step FROM replanned
  ON CONFLICT (run_id, step) WHERE step IS NOT NULL DO NOTHING
)
UPDATE ledgerloop.outbox o
SET status = outcome.outbox_status,
    available_at = CASE WHEN outcome.retry_in_s IS NULL THEN o.available_at
                        ELSE now() + make_interval(secs => outcome.retry_in_s) END,
    lease_until = NULL,
    last_error = outcome.error
FROM outcome
JOIN effect ON effect.idempotency_key = outcome.key
WHERE o.id = outcome.outbox_id
RETURNING o.idempotency_key

-- name: outbox_next_due
-- Seconds until the earliest pending row is due (negative: due now), or NULL when none is.
SELECT extract(epoch FROM min(available_at) - now())::float8 AS due_in_s
FROM ledgerloop.outbox
WHERE status = 'pending'

-- name: effects_cancel_pending_for_run
-- A cancelled run stops pending work: outbox rows no relay has claimed yet are closed, and
-- their effects fail with the reason. Claimed rows are in flight and settle as usual;
-- compensations are undo work and still go out.
WITH closed AS (
  UPDATE ledgerloop.outbox o
  SET status = 'dead', last_error = 'run cancelled before delivery'
  FROM ledgerloop.activity_effect e
  WHERE o.idempotency_key = e.idempotency_key
    AND e.run_id = %(run_id)s
    AND e.compensates IS NULL
    AND e.status = 'pending'
    AND o.status = 'pending'
  RETURNING o.idempotency_key
)
UPDATE ledgerloop.activity_effect e
SET status = 'failed', error = 'run cancelled before delivery', updated_at = now()
FROM closed
WHERE e.idempotency_key = closed.idempotency_key
RETURNING e.idempotency_key

-- name: effects_unsettled_runs
-- Of these runs, the ones that still own an effect nobody has settled: a purge keeps them,
-- so no effect is ever left without its run.
SELECT DISTINCT run_id
FROM ledgerloop.activity_effect
WHERE run_id = ANY(%(run_ids)s) AND status NOT IN ('succeeded', 'failed')

-- name: outbox_delete_for_runs
-- Retention: delivery plumbing of settled effects; the effect record keeps the audit trail.
DELETE FROM ledgerloop.outbox o
USING ledgerloop.activity_effect e
WHERE o.idempotency_key = e.idempotency_key
  AND e.run_id = ANY(%(run_ids)s)
  AND e.status IN ('succeeded', 'failed')
  AND o.status IN ('done', 'dead')
