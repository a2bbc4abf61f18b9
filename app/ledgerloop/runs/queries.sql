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
INSERT INTO ledgerloop.agent_run_event (run_id, tenant_id, sequence, event_type, payload, step)
VALUES (%(run_id)s, %(tenant_id)s, %(sequence)s, %(event_type)s, %(payload)s, %(step)s)

-- name: run_event_by_step
SELECT sequence, event_type, payload, created_at
FROM ledgerloop.agent_run_event
WHERE run_id = %(run_id)s AND step = %(step)s

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
-- The run's status moves only: the typed events of its stream (a dot in their names:
-- step.finished, approval.decided, ..., migration 0033) are not moves.
SELECT sequence, event_type, payload, created_at
FROM ledgerloop.agent_run_event
WHERE run_id = %(run_id)s AND event_type NOT LIKE '%%.%%'
ORDER BY sequence DESC
LIMIT 1

-- name: run_events
-- The run's status moves (its history); the stream (streams/queries.sql) reads them all.
SELECT sequence, event_type, payload, created_at
FROM ledgerloop.agent_run_event
WHERE run_id = %(run_id)s AND event_type NOT LIKE '%%.%%'
ORDER BY sequence

-- name: run_list
-- One keyset page, newest first (migration 0028's indexes): after the cursor's
-- (created_at, id), never an offset. Run unprepared (runs/store.py), so each absent filter
-- folds away and the page is one index range scan.
SELECT id, tenant_id, agent, status, state, input, idempotency_key, version,
       created_at, updated_at
FROM ledgerloop.agent_run
WHERE (%(tenant_id)s::uuid IS NULL OR tenant_id = %(tenant_id)s::uuid)
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(agent)s::text IS NULL OR agent = %(agent)s::text)
  AND (%(run_id)s::uuid IS NULL OR id = %(run_id)s::uuid)
  AND (%(idempotency_key)s::text IS NULL OR idempotency_key = %(idempotency_key)s::text)
  AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s::timestamptz)
  AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
  AND (%(after_at)s::timestamptz IS NULL
       OR (created_at, id) < (%(after_at)s::timestamptz, %(after_id)s::uuid))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: run_counts
-- How many runs of each status match the list's filters (not its status or cursor). It
-- reads every matching index entry: asked for with counts=true, not on every page.
SELECT status, count(*) AS runs
FROM ledgerloop.agent_run
WHERE (%(tenant_id)s::uuid IS NULL OR tenant_id = %(tenant_id)s::uuid)
  AND (%(agent)s::text IS NULL OR agent = %(agent)s::text)
  AND (%(run_id)s::uuid IS NULL OR id = %(run_id)s::uuid)
  AND (%(idempotency_key)s::text IS NULL OR idempotency_key = %(idempotency_key)s::text)
  AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s::timestamptz)
  AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
GROUP BY status

-- name: cancel_request_add
-- In the cancelling transaction: the run's workflow is to be cancelled through DBOS.
INSERT INTO ledgerloop.workflow_cancel_request (run_id) VALUES (%(run_id)s)
ON CONFLICT (run_id) DO NOTHING

-- name: cancel_request_done
DELETE FROM ledgerloop.workflow_cancel_request WHERE run_id = %(run_id)s

-- name: cancel_requests_due
-- Requests their requester did not settle (it died after its commit, DBOS's cancel failed,
-- or the cancel ran inside a caller's transaction): oldest first, each to one sweeper.
SELECT run_id, attempts
FROM ledgerloop.workflow_cancel_request
WHERE requested_at <= now() - make_interval(secs => %(settle_s)s)
ORDER BY requested_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: cancel_request_retry_later
UPDATE ledgerloop.workflow_cancel_request
SET attempts = attempts + 1,
    requested_at = now() + make_interval(secs => least(60, 2 ^ attempts))
WHERE run_id = %(run_id)s


-- name: run_execution_swap
-- A resumed execution records itself and reads what the one before it left (telemetry:
-- the next execution rebuilds the span of one that was killed). Off the hot path: a run's
-- first execution never writes here.
WITH previous AS (
  SELECT id, execution FROM ledgerloop.agent_run WHERE id = %(id)s FOR UPDATE
)
UPDATE ledgerloop.agent_run AS r
SET execution = %(execution)s
FROM previous
WHERE r.id = previous.id
RETURNING previous.execution AS previous

-- name: run_execution_end
-- The running execution ended its own span (it hibernated): the next one must not rebuild it.
UPDATE ledgerloop.agent_run
SET execution = %(execution)s
WHERE id = %(id)s

-- name: run_executions_stopped
-- A worker stopping cleanly ended the spans of the runs it was executing.
UPDATE ledgerloop.agent_run
SET execution = coalesce(execution, '{}'::jsonb) || '{"end": "stopped"}'::jsonb
WHERE id IN (
  SELECT workflow_uuid::uuid FROM dbos.workflow_status
  WHERE executor_id = %(executor_id)s AND status = 'PENDING' AND name = 'ledgerloop_run'
)
-- name: run_list_unfinished
-- The sweeper's one query (partial index agent_run_unfinished): unfinished runs created
-- before a cut-off, with the deadline each must have ended by (memory-load records it in
-- state; a run never started counts from its creation).
SELECT id, status, created_at, updated_at,
       coalesce((state->>'deadline')::float8,
                extract(epoch FROM created_at) + %(deadline_s)s) AS deadline
FROM ledgerloop.agent_run
WHERE status NOT IN ('succeeded', 'failed', 'cancelled')
  AND created_at < now() - make_interval(secs => %(min_age_s)s)
ORDER BY created_at
LIMIT %(limit)s

-- name: run_advance
-- run_ensure_status in one statement: lock the run, and unless this step's event is already
-- recorded (or, without a step, the run is already there) and when the table allows the
-- move from where the run is, move it and append the event. The answer says which happened
-- (moved, duplicate) and where the run is; the moved row's columns are null when it did not
-- move. A workflow step's bookkeeping is then one round trip instead of a read, a savepoint,
-- a duplicate check, an update and an insert (and, for a save, the messages' insert).
WITH cur AS (
  SELECT id, status FROM ledgerloop.agent_run WHERE id = %(id)s FOR NO KEY UPDATE
), seen AS (
  SELECT 1 FROM ledgerloop.agent_run_event
  WHERE %(step)s::text IS NOT NULL AND run_id = %(id)s AND step = %(step)s::text
), moved AS (
  UPDATE ledgerloop.agent_run r
  SET status = %(status)s,
      state = r.state || %(state_patch)s,
      version = r.version + 1,
      updated_at = now()
  FROM cur
  WHERE r.id = cur.id
    AND cur.status = ANY(%(allowed_from)s::text[])
    AND NOT EXISTS (SELECT 1 FROM seen)
    AND NOT (%(step)s::text IS NULL AND cur.status = %(status)s)
  RETURNING r.id, r.tenant_id, r.agent, r.status, r.state, r.input, r.idempotency_key,
            r.version, r.created_at, r.updated_at
), event AS (
  INSERT INTO ledgerloop.agent_run_event (run_id, tenant_id, sequence, event_type, payload, step)
  SELECT id, tenant_id, version, %(event_type)s, %(payload)s, %(step)s FROM moved
), memory AS (
  -- The conversation not yet in memory, when the move carries it (a save, a finish): in the
  -- same statement, so with the move or not at all.
  INSERT INTO ledgerloop.agent_message_batch
    (run_id, tenant_id, conversation_id, first_sequence, messages)
  SELECT id, tenant_id, %(conversation_id)s::text, %(first_sequence)s::int, %(messages)s::json
  FROM moved
  WHERE %(messages)s::json IS NOT NULL
  ON CONFLICT (run_id, first_sequence) DO NOTHING
)
SELECT cur.status AS current, EXISTS (SELECT 1 FROM seen) AS duplicate, moved.*
FROM cur LEFT JOIN moved ON true

-- name: runs_finished_page
-- Finished runs in finishing order (a terminal run is never updated again, so updated_at is
-- when it finished), from a keyset cursor: one page of a purge. Index agent_run_finished.
SELECT id, updated_at
FROM ledgerloop.agent_run
WHERE status IN ('succeeded', 'failed', 'cancelled')
  AND updated_at < %(cutoff)s
  AND (updated_at, id) > (%(after_at)s, %(after_id)s)
ORDER BY updated_at, id
LIMIT %(limit)s

-- name: runs_finished_with_journal_page
-- The same, among runs whose journal is still there. Index agent_run_finished_with_journal.
SELECT id, updated_at
FROM ledgerloop.agent_run
WHERE status IN ('succeeded', 'failed', 'cancelled')
  AND journal_purged_at IS NULL
  AND updated_at < %(cutoff)s
  AND (updated_at, id) > (%(after_at)s, %(after_id)s)
ORDER BY updated_at, id
LIMIT %(limit)s

-- name: runs_delete_finished
-- A whole run: its payloads, approvals, effects and their outbox rows go with it (ON DELETE
-- CASCADE), its events here (they carry no foreign key: migration 0017); its messages are
-- deleted first, by messages_delete_for_runs. Only finished runs, whatever the caller
-- selected.
WITH gone AS (
  DELETE FROM ledgerloop.agent_run
  WHERE id = ANY(%(ids)s) AND status IN ('succeeded', 'failed', 'cancelled')
  RETURNING id
), events AS (
  DELETE FROM ledgerloop.agent_run_event e USING gone WHERE e.run_id = gone.id
)
SELECT count(*) AS deleted FROM gone

-- name: runs_mark_journal_purged
UPDATE ledgerloop.agent_run
SET journal_purged_at = now()
WHERE id = ANY(%(ids)s) AND status IN ('succeeded', 'failed', 'cancelled')
  AND journal_purged_at IS NULL

-- name: run_fork_link
-- A fork's link to its parent (control/fork.py), written with the fork's row, before its
-- workflow exists: the workflow reads it to know it may run under its own id.
UPDATE ledgerloop.agent_run
SET state = state || jsonb_build_object('forked_from', %(forked_from)s::jsonb)
WHERE id = %(id)s
