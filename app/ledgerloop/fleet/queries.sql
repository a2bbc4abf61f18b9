-- The fleet's runtime queries: worker rows, heartbeats, takeovers, and what operators read.
-- Liveness is judged by the database's clock (now()), never by a worker's own.

-- name: executor_register
-- A new row, or a fresh start for a row a takeover has not yet removed. The same
-- transaction touches the PENDING workflows this worker holds, so an orphan sweep that
-- saw no row for them (see executor_heartbeat) skips them when it re-reads them.
WITH registered AS (
  INSERT INTO ledgerloop.executor
    (id, application_version, hostname, pid, lock_key, software_version, lease_until, timeline)
  VALUES (%(id)s, %(app_version)s, %(hostname)s, %(pid)s, %(lock_key)s, %(software_version)s,
          now() + make_interval(secs => %(my_lease_s)s), %(timeline)s::int)
  ON CONFLICT (id) DO UPDATE
    SET heartbeat_at = now(), streak_started_at = now(), lock_key = EXCLUDED.lock_key,
        timeline = coalesce(EXCLUDED.timeline, executor.timeline),
        lease_until = greatest(executor.lease_until, EXCLUDED.lease_until)
  RETURNING id
)
UPDATE dbos.workflow_status
SET updated_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
WHERE executor_id = (SELECT id FROM registered) AND status = 'PENDING'

-- name: executor_heartbeat
-- The heartbeat, and the takeover of dead peers.
-- One statement, one short transaction: this worker's heartbeat, then (when this worker
-- may judge) the takeover of every dead peer. Returns one row per executor taken over,
-- plus this worker's own row first (alive = false when a peer has taken it over; due_s:
-- see `due` below; db_now: the database's time, which the worker keeps as %(seen_at)s).
--
-- %(watch)s: a resting worker's look at its peers. Its own row is read, not written, and
-- when nobody is dead the statement writes nothing (no WAL, no commit record).
--
-- A streak: a statement of this worker that lands more than %(gap_s)s after its previous
-- one (its row's heartbeat, or %(seen_at)s: the database's time its last statement returned,
-- a watch's included) starts a new streak; otherwise the streak goes on (from its row's
-- start, or the later %(streak_since)s a watch began). Only a worker whose streak is at least
-- %(stale_s)s old judges others, so after an outage, a freeze or a restart a worker first
-- watches its peers come back before it judges them. (A resting worker keeps its streak
-- with watches less than %(gap_s)s apart.)
--
-- Each heartbeat records the lease it grants its worker (%(my_lease_s)s from now: shorter
-- while the worker executes runs) in lease_until, which never moves earlier: the worker's
-- fence may still hold an earlier, longer lease. A heartbeat ends a rest (resting_since).
--
-- Dead: no heartbeat for %(stale_s)s, unless it rests and its heartbeat session still holds
-- its advisory lock (a resting worker writes nothing; its session is its heartbeat), or it
-- rests and this server (or this worker's session: a failover) has been up for less than
-- %(stale_s)s (a restart frees every lock: it gets that long to take its lock again); or its
-- lease run out %(margin_s)s ago (a row without lease_until, written by an older release:
-- %(lease_s)s after its heartbeat) and its heartbeat session gone (its advisory lock is
-- free: the process was killed or lost its connection).
-- A free lock counts only for a peer whose last heartbeat came after this worker's own
-- heartbeat session began (%(session_since)s, the database's time): that session outlived
-- it, so the server did not restart or fail over since, and the lock the peer held then on
-- this server is free because its session ended. After a restart every lock is free and
-- proves nothing; such a peer is dead only once it has been silent for %(stale_s)s.
-- A worker behind a transaction-mode pooler without a direct connection holds no lock
-- (lock_key 0), never rests, and passes no session_since (NULL): no free lock is evidence
-- then, in either direction, and only %(stale_s)s of silence counts.
-- Either way the worker's own lease, counted from its last heartbeat, has run out, so it
-- starts no step body any more (ledgerloop.fleet.fence).
--
-- Taking over deletes the row and puts the dead worker's PENDING workflows back on their
-- queue in the same transaction, so no survivor can die between the two. The row is locked
-- and re-read first (a heartbeat that committed meanwhile makes it fresh, and one under way
-- makes it skipped): the takeover is conditional on the row still being stale. Nothing here
-- waits for a lock, so a heartbeat never stalls behind a takeover.
--
-- %(wake)s: this heartbeat ends a rest (or is the first after registering): resting peers
-- are told on `ledgerloop_fleet`, so they watch this worker while it may hold runs.
--
-- This writes dbos.workflow_status directly: DBOS's public resume_workflow works one
-- workflow at a time, in its own transaction, and moves workflows to its internal queue;
-- nothing public re-enqueues a set of workflows atomically with our own row.
WITH mine AS (
  SELECT heartbeat_at, streak_started_at FROM ledgerloop.executor WHERE id = %(id)s
),
streak AS (
  SELECT CASE WHEN greatest(m.heartbeat_at, %(seen_at)s::timestamptz)
                   < now() - make_interval(secs => %(gap_s)s)
              THEN now()
              ELSE greatest(m.streak_started_at, %(streak_since)s::timestamptz) END AS since
  FROM mine m
),
beat AS (
  UPDATE ledgerloop.executor
  SET heartbeat_at = now(),
      timeline = coalesce(%(timeline)s::int, timeline),
      lease_until = greatest(lease_until, now() + make_interval(secs => %(my_lease_s)s)),
      resting_since = NULL,
      streak_started_at = (SELECT since FROM streak)
  WHERE id = %(id)s AND NOT %(watch)s
  RETURNING id
),
me AS (
  SELECT id FROM beat
  UNION ALL
  SELECT %(id)s FROM mine WHERE %(watch)s
),
judge AS (
  SELECT coalesce(bool_and(since <= now() - make_interval(secs => %(stale_s)s)), false)
         AND EXISTS (SELECT 1 FROM me) AS ok
  FROM streak
),
dead AS (
  DELETE FROM ledgerloop.executor
  WHERE id IN (
    SELECT e.id FROM ledgerloop.executor e
    WHERE e.id <> %(id)s
      AND (SELECT ok FROM judge)
      AND (
        (e.heartbeat_at < now() - make_interval(secs => %(stale_s)s)
         AND (e.resting_since IS NULL OR e.lock_key = 0
              OR (greatest(pg_postmaster_start_time(), %(session_since)s)
                    < now() - make_interval(secs => %(stale_s)s)
                  AND pg_try_advisory_xact_lock(%(lock_ns)s, e.lock_key))))
        OR (coalesce(e.lease_until, e.heartbeat_at + make_interval(secs => %(lease_s)s))
              < now() - make_interval(secs => %(margin_s)s)
            AND e.heartbeat_at > %(session_since)s
            AND e.lock_key <> 0
            AND pg_try_advisory_xact_lock(%(lock_ns)s, e.lock_key))
      )
    FOR UPDATE SKIP LOCKED
  )
  RETURNING id, hostname, extract(epoch FROM now() - heartbeat_at)::float8 AS silent_s,
            timeline
),
-- SKIP LOCKED: a frozen worker can hold a lock on one of its workflow rows (it stopped in
-- the middle of a checkpoint). Waiting for it would stall this heartbeat; that row stays
-- PENDING under a worker with no row, and either the frozen worker comes back and goes on
-- with it (it still owns it) or the orphan sweep puts it back once the lock is gone.
claimable AS (
  SELECT w.workflow_uuid FROM dbos.workflow_status w
  WHERE w.executor_id IN (SELECT id FROM dead) AND w.status = 'PENDING'
  FOR UPDATE OF w SKIP LOCKED
),
moved AS (
  UPDATE dbos.workflow_status w
  SET status = 'ENQUEUED',
      owner_xid = NULL,
      started_at_epoch_ms = NULL,
      queue_name = coalesce(w.queue_name, '_dbos_internal_queue'),
      updated_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
  WHERE w.workflow_uuid IN (SELECT workflow_uuid FROM claimable)
  RETURNING w.executor_id, w.workflow_uuid
),
-- A dead peer that last heartbeat on another timeline than the server's now (%(timeline)s):
-- it died with a primary that failed over and never ran the rewind check, so what it
-- delivered may have no record here. Its runs are named in run_rewound (migrations 0027,
-- 0031): their writes are found again by their key before any send.
rewound AS (
  INSERT INTO ledgerloop.run_rewound (run_id, timeline)
  SELECT DISTINCT m.workflow_uuid::uuid, %(timeline)s::int
  FROM moved m JOIN dead d ON d.id = m.executor_id
  WHERE d.timeline IS NOT NULL AND %(timeline)s::int IS NOT NULL
    AND d.timeline <> %(timeline)s::int
    AND m.workflow_uuid ~ '^[0-9a-f-]{36}$'
  ON CONFLICT (run_id) DO NOTHING
  RETURNING run_id
),
-- A peer whose session is gone but whose lease has not yet run out: in how many seconds it
-- may be taken over. The worker ticks again at that moment instead of at its next
-- heartbeat, so a killed worker is taken over as soon as its lease allows. (Its row stays
-- untouched here; the next tick judges it like any other.)
due AS (
  SELECT min(extract(epoch FROM l.deadline - now()))::float8 AS due_s
  FROM ledgerloop.executor e,
       LATERAL (SELECT coalesce(e.lease_until, e.heartbeat_at + make_interval(secs => %(lease_s)s))
                       + make_interval(secs => %(margin_s)s) AS deadline) l
  WHERE e.id <> %(id)s
    AND (SELECT ok FROM judge)
    AND e.id NOT IN (SELECT id FROM dead)
    AND l.deadline >= now()
    AND e.heartbeat_at > %(session_since)s
    AND e.lock_key <> 0
    AND pg_try_advisory_xact_lock(%(lock_ns)s, e.lock_key)
),
-- Live peers: heartbeating within the staleness limit, or resting with their session held.
-- Whether a burst has anyone to share it with (ledgerloop.fleet.dispatch), and how many of
-- them heartbeat (may hold runs: a resting worker watches its peers while any does).
-- A handful of rows.
live AS (
  SELECT e.resting_since IS NULL AS beating FROM ledgerloop.executor e
  WHERE e.id <> %(id)s AND e.id NOT IN (SELECT id FROM dead)
    AND ((e.resting_since IS NULL
          AND e.heartbeat_at >= now() - make_interval(secs => %(stale_s)s))
         OR (e.resting_since IS NOT NULL
             AND NOT pg_try_advisory_xact_lock(%(lock_ns)s, e.lock_key)))
),
told AS (
  SELECT pg_notify('ledgerloop_fleet', %(id)s) WHERE %(wake)s AND EXISTS (SELECT 1 FROM beat)
)
SELECT %(id)s AS id, EXISTS (SELECT 1 FROM me) AS alive, NULL::text AS hostname,
       NULL::float8 AS silent_s, 0::bigint AS runs, (SELECT due_s FROM due) AS due_s,
       (SELECT count(*) FROM live) AS peers,
       (SELECT count(*) FROM live WHERE beating) AS beating,
       now() AS db_now, (SELECT since FROM streak) AS streak_since,
       (SELECT count(*) FROM told) AS told, 0 AS ord, (SELECT count(*) FROM rewound) AS rewound
UNION ALL
SELECT d.id, false, d.hostname, d.silent_s,
       (SELECT count(*) FROM moved m WHERE m.executor_id = d.id), NULL, NULL, NULL, NULL,
       NULL, NULL, 1, NULL
FROM dead d
ORDER BY ord

-- name: executor_rest
-- This worker has had nothing to execute for a while: it stops heartbeating. Its row says
-- so (peers then judge it by its heartbeat session's advisory lock alone, executor_heartbeat)
-- and publishes that it executes nothing. Its lease is not renewed: any step body, claim or
-- checkpoint first heartbeats again.
-- Not while any workflow is PENDING under it (claimed, not yet executing: the claim and this
-- statement are serialized in the worker): a resting row holds no runs.
UPDATE ledgerloop.executor
SET resting_since = now(), heartbeat_at = now(), executing = '{}', executing_at = now()
WHERE id = %(id)s
  AND NOT EXISTS (SELECT 1 FROM dbos.workflow_status w
                  WHERE w.executor_id = %(id)s AND w.status = 'PENDING')
RETURNING now() AS db_now

-- name: executor_sweep_orphans
-- PENDING workflows whose executor has no row: a worker that was taken over and died
-- before it could register again, or one removed by hand. Only rows untouched for
-- %(stale_s)s: a worker that registers again touches its rows in that transaction
-- (executor_register), and this UPDATE re-reads a row that changed under it.
WITH me AS (
  SELECT 1 FROM ledgerloop.executor
  WHERE id = %(id)s AND streak_started_at <= now() - make_interval(secs => %(stale_s)s)
),
orphans AS (
  SELECT w.workflow_uuid FROM dbos.workflow_status w
  WHERE w.status = 'PENDING'
    AND EXISTS (SELECT 1 FROM me)
    AND w.executor_id IS NOT NULL
    AND w.updated_at < (extract(epoch FROM now()) * 1000)::bigint - %(stale_s)s * 1000
    AND NOT EXISTS (SELECT 1 FROM ledgerloop.executor e WHERE e.id = w.executor_id)
  FOR UPDATE OF w SKIP LOCKED
)
UPDATE dbos.workflow_status w
SET status = 'ENQUEUED',
    owner_xid = NULL,
    started_at_epoch_ms = NULL,
    queue_name = coalesce(w.queue_name, '_dbos_internal_queue'),
    updated_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
WHERE w.workflow_uuid IN (SELECT workflow_uuid FROM orphans)
  AND w.status = 'PENDING'
  AND w.updated_at < (extract(epoch FROM now()) * 1000)::bigint - %(stale_s)s * 1000
RETURNING w.workflow_uuid, w.executor_id

-- name: executor_unregister
-- A clean stop: the runs this worker was executing go back on their queue, then its row
-- goes. One transaction: a stop that dies halfway leaves the row, and a survivor takes the
-- runs over as it would after a crash. (Direct write for the reason given above.)
WITH moved AS (
  UPDATE dbos.workflow_status
  SET status = 'ENQUEUED',
      owner_xid = NULL,
      started_at_epoch_ms = NULL,
      queue_name = coalesce(queue_name, '_dbos_internal_queue'),
      updated_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
  WHERE executor_id = %(id)s AND status = 'PENDING'
  RETURNING workflow_uuid
),
gone AS (
  DELETE FROM ledgerloop.executor WHERE id = %(id)s RETURNING id
)
SELECT (SELECT count(*) FROM moved) AS runs, (SELECT count(*) FROM gone) AS rows

-- name: executor_lock
SELECT pg_try_advisory_lock(%(lock_ns)s, %(lock_key)s) AS locked

-- name: workflow_owner
SELECT owner_xid, status, executor_id
FROM dbos.workflow_status
WHERE workflow_uuid = %(workflow_id)s

-- name: workers_list
-- resting: the worker rests (fleet/heartbeat.py) and its heartbeat session still holds its
-- advisory lock (namespace LOCK_NAMESPACE, "LLFW"), so it is alive however old its heartbeat.
SELECT e.id, e.hostname, e.pid, e.application_version, e.software_version, e.started_at,
       extract(epoch FROM now() - e.heartbeat_at)::float8 AS heartbeat_age_s,
       (e.resting_since IS NOT NULL AND EXISTS (
          SELECT 1 FROM pg_locks l
          WHERE l.locktype = 'advisory' AND l.granted AND l.database = d.oid
            AND l.classid = x'4C4C4657'::int::oid AND l.objid = e.lock_key::oid
            AND l.objsubid = 2)) AS resting,
       (SELECT count(*) FROM dbos.workflow_status w
        WHERE w.executor_id = e.id AND w.status = 'PENDING') AS runs_executing
FROM ledgerloop.executor e
JOIN pg_database d ON d.datname = current_database()
ORDER BY e.started_at, e.id

-- name: runs_stuck
-- Runs that need a look: the run and its workflow disagree (for %(stale_s)s: every run's end
-- commits its status inside its last step, a moment before DBOS closes the workflow), or the
-- workflow is PENDING under a worker that is not alive (no row, or silent for %(stale_s)s),
-- or ENQUEUED for an application version no live worker runs; and workflows of a run under an
-- id other than the run's own.
SELECT r.id AS run_id, r.tenant_id, r.agent, r.status AS run_status, r.updated_at,
       w.status AS workflow_status, w.executor_id, w.application_version,
       CASE
         WHEN w.workflow_uuid IS NULL THEN 'no workflow'
         WHEN r.status IN ('succeeded', 'failed', 'cancelled')
              AND w.status IN ('PENDING', 'ENQUEUED', 'DELAYED')
           THEN 'run finished, workflow ' || w.status
         WHEN r.status NOT IN ('succeeded', 'failed', 'cancelled')
              AND w.status NOT IN ('PENDING', 'ENQUEUED', 'DELAYED')
           THEN 'run ' || r.status || ', workflow ' || w.status
         WHEN w.status = 'PENDING' AND e.id IS NULL THEN 'pending, its worker is gone'
         WHEN w.status = 'PENDING'
              AND e.heartbeat_at < now() - make_interval(secs => %(stale_s)s)
           THEN 'pending, its worker is silent'
         WHEN w.status = 'PENDING' THEN 'pending, its live worker does not execute it'
         ELSE 'enqueued, no live worker runs version ' || w.application_version
       END AS problem
FROM ledgerloop.agent_run r
LEFT JOIN dbos.workflow_status w ON w.workflow_uuid = r.id::text
LEFT JOIN ledgerloop.executor e ON e.id = w.executor_id
WHERE w.workflow_uuid IS NULL
   OR (r.status IN ('succeeded', 'failed', 'cancelled')
       AND w.status IN ('PENDING', 'ENQUEUED', 'DELAYED')
       AND r.updated_at < now() - make_interval(secs => %(stale_s)s))
   OR (r.status NOT IN ('succeeded', 'failed', 'cancelled')
       AND w.status NOT IN ('PENDING', 'ENQUEUED', 'DELAYED')
       AND r.updated_at < now() - make_interval(secs => %(stale_s)s))
   OR (w.status = 'PENDING'
       AND (e.id IS NULL OR e.heartbeat_at < now() - make_interval(secs => %(stale_s)s)))
   -- Under a live worker whose published list (fleet/heartbeat.py, refreshed every few
   -- seconds) does not name it, though it was claimed well before that list was written.
   OR (w.status = 'PENDING' AND e.executing_at IS NOT NULL
       AND w.name IN ('ledgerloop_run', 'ledgerloop_episode')
       AND w.workflow_uuid <> ALL(e.executing)
       AND coalesce(w.started_at_epoch_ms, 0)
           < (extract(epoch FROM e.executing_at) * 1000)::bigint - 2000)
   OR (w.status = 'ENQUEUED' AND w.application_version IS NOT NULL
       AND NOT EXISTS (
         SELECT 1 FROM ledgerloop.executor l
         WHERE l.application_version = w.application_version
           AND (l.heartbeat_at >= now() - make_interval(secs => %(stale_s)s)
                OR l.resting_since IS NOT NULL)))
UNION ALL
-- A second workflow of a run, under another id: it ran nothing and ended in ERROR
-- (agent/loop.py, ForeignWorkflow); the run is found by the id its input names. Through the
-- status index, so the scan is over failed workflows only.
SELECT r.id, r.tenant_id, r.agent, r.status, r.updated_at, w.status, w.executor_id,
       w.application_version,
       'a second workflow of the run, ' || w.workflow_uuid || ', refused to run'
FROM dbos.workflow_status w
JOIN dbos.workflow_input i ON i.workflow_uuid = w.workflow_uuid
JOIN ledgerloop.agent_run r
  ON r.id::text = substring(i.inputs FROM '"positionalArgs"\s*:\s*\[\s*"([0-9a-f-]{36})"')
WHERE w.status = 'ERROR' AND w.name = 'ledgerloop_run' AND w.workflow_uuid <> r.id::text
  -- A fork of the run (control/fork.py) runs under its own id with its parent's input: a
  -- run of its own, listed (if at all) as itself above.
  AND NOT EXISTS (
    SELECT 1 FROM ledgerloop.agent_run f
    WHERE f.id = CASE WHEN w.workflow_uuid ~ '^[0-9a-f-]{36}$' THEN w.workflow_uuid::uuid END
      AND f.state -> 'forked_from' ->> 'run_id' = r.id::text)
ORDER BY updated_at
LIMIT %(limit)s

-- name: queue_claim
-- The dispatcher's claim of Ledgerloop's queue in one statement on its own connection: what
-- DBOS 3.4's `start_queued_workflows` does for a queue with only a worker concurrency, on an
-- unsharded Postgres (pick ENQUEUED rows of this version, or version-less ones when this
-- worker runs the latest version, oldest first by priority, SKIP LOCKED; mark them PENDING
-- for this executor with the claim's token, count the dispatch as a recovery attempt, start
-- the timeout's deadline), returning each row as DBOS's `get_workflow_statuses` reads it, so
-- the claimed runs start without a second read. fleet/claim.py says when it applies;
-- tests/contract/test_fleet_claim.py holds it to DBOS's own claim.
WITH picked AS (
  SELECT workflow_uuid
  FROM dbos.workflow_status
  WHERE queue_name = %(queue)s
    AND status = 'ENQUEUED'
    AND (application_version = %(app_version)s
         OR (%(latest)s AND application_version IS NULL))
    AND (%(app_name)s::text IS NULL OR application_name = %(app_name)s
         OR application_name IS NULL)
  ORDER BY priority, created_at
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
), claimed AS (
  UPDATE dbos.workflow_status w
  SET status = 'PENDING',
      owner_xid = %(owner)s,
      application_version = %(app_version)s,
      executor_id = %(executor_id)s,
      application_name = %(app_name)s,
      started_at_epoch_ms = (extract(epoch FROM now()) * 1000)::bigint,
      rate_limited = false,
      recovery_attempts = w.recovery_attempts + 1,
      updated_at = (extract(epoch FROM now()) * 1000)::bigint,
      workflow_deadline_epoch_ms = CASE
        WHEN w.workflow_timeout_ms IS NOT NULL AND w.workflow_deadline_epoch_ms IS NULL THEN
          CASE WHEN w.workflow_timeout_ms > 9223372036854775807 - %(start_ms)s::bigint
               THEN 9223372036854775807
               ELSE %(start_ms)s::bigint + w.workflow_timeout_ms END
        ELSE w.workflow_deadline_epoch_ms END
  FROM picked
  WHERE w.workflow_uuid = picked.workflow_uuid
    AND w.status = 'ENQUEUED'
    AND (%(app_name)s::text IS NULL OR w.application_name = %(app_name)s
         OR w.application_name IS NULL)
  RETURNING w.*
)
SELECT c.workflow_uuid, c.status, c.name, c.recovery_attempts, c.config_name, c.class_name,
       c.authenticated_user, c.authenticated_roles, c.assumed_role, c.queue_name,
       c.executor_id, c.created_at, c.updated_at, c.application_version, c.application_id,
       c.workflow_deadline_epoch_ms, c.workflow_timeout_ms, c.deduplication_id, c.priority,
       coalesce(i.inputs, c.inputs) AS inputs, c.queue_partition_key, c.forked_from,
       c.parent_workflow_id, c.started_at_epoch_ms, c.serialization, c.delay_until_epoch_ms,
       c.attributes, c.schedule_name, c.debounce_deadline_epoch_ms, c.is_debounced,
       c.application_name
FROM claimed c
LEFT JOIN dbos.workflow_input i ON i.workflow_uuid = c.workflow_uuid
ORDER BY c.priority, c.created_at

-- name: queue_waiting
-- Whether a queue holds a run to claim: a resting worker asks before it heartbeats again to
-- claim (fleet/dispatch.py), so its fallback poll is a read.
SELECT EXISTS (
  SELECT 1 FROM dbos.workflow_status WHERE queue_name = %(queue)s AND status = 'ENQUEUED'
) AS waiting

-- name: executor_timeline
-- The server's timeline (a promotion starts a new one): the first 8 hex digits of the name
-- of the WAL file being written. NULL where that cannot be read (a standby, a pooler that
-- forbids the function).
SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int AS timeline

-- name: executor_rewound
-- After the heartbeat reconnects: did the database go back in time under this worker?
-- %(workflow_ids)s / %(function_ids)s: the last step this worker checkpointed for each
-- workflow it executed lately; a pair missing from the journal was lost (a promoted replica
-- that lagged). %(running)s: the workflows it executes now. Those lost, and the PENDING ones
-- under this worker that it does not execute (their end was lost, or the claim outlived its
-- execution), go back on their queue, as a takeover puts a dead worker's runs: the next
-- execution resumes them from the journal the database holds. Only workflows whose
-- execution the fence knows (%(names)s) and claimed more than %(grace_ms)s ago (an execution
-- claimed a moment ago may not be known yet). Direct write for the reason given at
-- executor_heartbeat.
WITH held AS (
  SELECT h.workflow_uuid, h.function_id
  FROM unnest(%(workflow_ids)s::text[], %(function_ids)s::int[]) AS h(workflow_uuid, function_id)
),
-- A workflow the database no longer has at all (purged since, or its start was lost too)
-- has nothing to resume.
lost AS (
  SELECT h.workflow_uuid FROM held h
  JOIN dbos.workflow_status w ON w.workflow_uuid = h.workflow_uuid
  WHERE NOT EXISTS (
    SELECT 1 FROM dbos.operation_outputs o
    WHERE o.workflow_uuid = h.workflow_uuid AND o.function_id = h.function_id)
),
-- The same for a write a step recorded by itself (%(effect_keys)s, of %(effect_workflows)s):
-- its record gone, the step after it must not go on as if it were there.
lost_effects AS (
  SELECT f.workflow_uuid
  FROM unnest(%(effect_keys)s::text[], %(effect_workflows)s::text[]) AS f(key, workflow_uuid)
  JOIN dbos.workflow_status w ON w.workflow_uuid = f.workflow_uuid
  WHERE NOT EXISTS (
    SELECT 1 FROM ledgerloop.activity_effect e WHERE e.idempotency_key = f.key)
),
idle AS (
  SELECT w.workflow_uuid FROM dbos.workflow_status w
  WHERE w.executor_id = %(id)s AND w.status = 'PENDING'
    AND w.name = ANY(%(names)s::text[])
    AND w.workflow_uuid <> ALL(%(running)s::text[])
    AND coalesce(w.started_at_epoch_ms, 0)
        < (extract(epoch FROM now()) * 1000)::bigint - %(grace_ms)s
),
moved AS (
  UPDATE dbos.workflow_status w
  SET status = 'ENQUEUED',
      owner_xid = NULL,
      started_at_epoch_ms = NULL,
      queue_name = coalesce(w.queue_name, '_dbos_internal_queue'),
      updated_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
  WHERE w.status = 'PENDING' AND w.executor_id = %(id)s
    AND w.workflow_uuid IN (SELECT workflow_uuid FROM lost UNION SELECT workflow_uuid FROM idle
                            UNION SELECT workflow_uuid FROM lost_effects)
  RETURNING w.workflow_uuid
),
-- The runs among them (a run's workflow id is its id): a write they record from now on may
-- have been delivered under the record the database lost, so it is found again by its key
-- before any send (migration 0027).
marked AS (
  INSERT INTO ledgerloop.run_rewound (run_id, timeline)
  SELECT DISTINCT u.id::uuid, %(timeline)s::int
  FROM (SELECT workflow_uuid AS id FROM lost UNION SELECT workflow_uuid FROM lost_effects
        UNION SELECT workflow_uuid FROM moved) u
  WHERE u.id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
  ON CONFLICT (run_id) DO NOTHING
  RETURNING run_id
)
SELECT coalesce((SELECT array_agg(DISTINCT workflow_uuid)
                 FROM (SELECT workflow_uuid FROM lost
                       UNION SELECT workflow_uuid FROM lost_effects) l), '{}') AS lost,
       coalesce((SELECT array_agg(workflow_uuid) FROM moved), '{}') AS moved,
       (SELECT count(*) FROM marked) AS marked

-- name: executor_executing
-- What this worker executes, as of now (`ledgerloop runs stuck` compares the PENDING
-- workflows under it with this list).
UPDATE ledgerloop.executor
SET executing = %(running)s::text[], executing_at = now()
WHERE id = %(id)s
