-- The schedule store's queries (migration 0029). Every write to ledgerloop.schedule is here.

-- name: schedule_lock
-- A worker starting with a schedule in its code: its row, locked while the code's copy of
-- the definition is written (two workers starting together take turns).
SELECT name, tenant_id, agent, cron, timezone, input, missed, paused, last_tick
FROM ledgerloop.schedule
WHERE name = %(name)s
FOR UPDATE

-- name: schedule_insert
INSERT INTO ledgerloop.schedule (name, tenant_id, agent, cron, timezone, input, missed, last_tick)
VALUES (%(name)s, %(tenant_id)s, %(agent)s, %(cron)s, %(timezone)s, %(input)s, %(missed)s,
        %(last_tick)s)
ON CONFLICT (name) DO NOTHING

-- name: schedule_declare
-- The definition as this worker's code has it; last_tick only ever moves forward.
UPDATE ledgerloop.schedule
SET tenant_id = %(tenant_id)s, agent = %(agent)s, cron = %(cron)s, timezone = %(timezone)s,
    input = %(input)s, missed = %(missed)s,
    last_tick = greatest(last_tick, %(last_tick)s),
    declared_at = now(),
    updated_at = CASE WHEN %(changed)s THEN now() ELSE updated_at END
WHERE name = %(name)s

-- name: schedule_claim_due
-- The rows a worker may decide ticks for now. SKIP LOCKED: the worker holding a row is
-- making its tick's run; the others come back shortly and find the tick decided.
SELECT name, paused, last_tick
FROM ledgerloop.schedule
WHERE name = ANY(%(names)s)
FOR UPDATE SKIP LOCKED

-- name: schedule_tick_decided
UPDATE ledgerloop.schedule
SET last_tick = %(tick)s, last_run_id = coalesce(%(run_id)s, last_run_id), updated_at = now()
WHERE name = %(name)s

-- name: schedule_list
SELECT name, tenant_id, agent, cron, timezone, input, missed, paused, last_tick, last_run_id,
       declared_at, updated_at
FROM ledgerloop.schedule
ORDER BY name

-- name: schedule_get
SELECT name, tenant_id, agent, cron, timezone, input, missed, paused, last_tick, last_run_id,
       declared_at, updated_at
FROM ledgerloop.schedule
WHERE name = %(name)s

-- name: schedule_set_paused
-- Resuming decides every tick up to now: the ticks of a pause are not missed ones, and no
-- catch-up run follows a resume.
UPDATE ledgerloop.schedule
SET paused = %(paused)s,
    last_tick = CASE WHEN %(paused)s THEN last_tick ELSE greatest(last_tick, now()) END,
    updated_at = now()
WHERE name = %(name)s
RETURNING name, tenant_id, agent, cron, timezone, input, missed, paused, last_tick, last_run_id,
          declared_at, updated_at

-- name: schedule_triggered
UPDATE ledgerloop.schedule
SET last_run_id = %(run_id)s, updated_at = now()
WHERE name = %(name)s
