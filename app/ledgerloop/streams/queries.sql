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
