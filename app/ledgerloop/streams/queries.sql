-- The stream's reads of the durable record: a run's status and its events after a sequence.

-- name: stream_page
-- The run (status and version: where its record ends) and, in the same snapshot, a page of
-- its events after %(after)s. A run whose status is terminal has all its events visible
-- here: the terminal event commits with the move.
SELECT r.status, r.version, e.sequence, e.event_type, e.payload, e.step, e.created_at
FROM ledgerloop.agent_run r
LEFT JOIN LATERAL (
  SELECT sequence, event_type, payload, step, created_at
  FROM ledgerloop.agent_run_event
  WHERE run_id = r.id AND sequence > %(after)s
  ORDER BY sequence
  LIMIT %(limit)s
) e ON true
WHERE r.id = %(run_id)s
ORDER BY e.sequence

-- name: text_append
-- What one step execution published since the last write (streams/publish.py): text deltas,
-- its start, its tools' calls and results, in order, one statement. The first write of an
-- execution takes the next attempt of its step (%(attempt)s null), the later ones name
-- theirs. The trigger (migration 0033) notifies `run_id:id` on commit.
WITH prior AS (
  SELECT coalesce(max(attempt), 0) + 1 AS next
  FROM ledgerloop.run_text
  WHERE run_id = %(run_id)s AND step = %(step)s AND %(attempt)s::int IS NULL
), given AS (
  SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb)
    AS x(ord int, kind text, seq int, text text, data jsonb)
)
INSERT INTO ledgerloop.run_text (run_id, tenant_id, step, attempt, kind, seq, text, data)
SELECT r.id, r.tenant_id, %(step)s, coalesce(%(attempt)s::int, prior.next),
       given.kind, given.seq, given.text, given.data
FROM ledgerloop.agent_run r, prior, given
WHERE r.id = %(run_id)s
ORDER BY given.ord
RETURNING attempt

-- name: text_since
-- A run's deltas after an id (a feed's read on a notification).
SELECT id, step, attempt, kind, seq, text, data
FROM ledgerloop.run_text
WHERE run_id = %(run_id)s AND id > %(after)s
ORDER BY id
LIMIT %(limit)s

-- name: text_current
-- What the run's latest streamed call has written so far (a feed's first read: a subscriber
-- that joins mid-call sees the call's text from its start).
SELECT t.id, t.step, t.attempt, t.kind, t.seq, t.text, t.data
FROM ledgerloop.run_text t
JOIN (
  SELECT step, attempt FROM ledgerloop.run_text
  WHERE run_id = %(run_id)s ORDER BY id DESC LIMIT 1
) last ON t.step = last.step AND t.attempt = last.attempt
WHERE t.run_id = %(run_id)s
ORDER BY t.id
LIMIT %(limit)s

-- name: text_sweep
-- Live rows of runs that finished a while ago (their text is in the journal) or are gone
-- (purged).
DELETE FROM ledgerloop.run_text t
WHERE NOT EXISTS (
  SELECT 1 FROM ledgerloop.agent_run r
  WHERE r.id = t.run_id
    AND (r.status NOT IN ('succeeded', 'failed', 'cancelled')
         OR r.updated_at >= now() - make_interval(secs => %(after_s)s))
)
