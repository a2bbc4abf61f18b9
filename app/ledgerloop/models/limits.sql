-- The fleet's model limits (migration 0030, models/limits.py).

-- name: budget_declare
-- A worker starting with a limit configured: the limit as its settings say (the last worker
-- started wins); what is left is kept.
INSERT INTO ledgerloop.model_budget (name, per_minute, available)
VALUES (%(name)s, %(per_minute)s, %(per_minute)s / 60.0)
ON CONFLICT (name) DO UPDATE SET per_minute = excluded.per_minute

-- name: budget_take
-- Refill each row for the time since it was last touched (up to one second's worth), take
-- this call's share, and say how long the call waits: as long as the row is in debt.
UPDATE ledgerloop.model_budget b
SET available = least(b.per_minute / 60.0,
                      b.available + b.per_minute / 60.0
                        * extract(epoch FROM clock_timestamp() - b.updated_at)) - t.amount,
    updated_at = clock_timestamp()
FROM unnest(%(names)s::text[], %(amounts)s::float8[]) AS t(name, amount)
WHERE b.name = t.name
RETURNING b.name, greatest(0, -b.available / (b.per_minute / 60.0)) AS wait_s

-- name: budget_refused
-- A 429: nothing is left, and the next Retry-After seconds' worth is owed, for every worker.
UPDATE ledgerloop.model_budget b
SET available = least(0.0,
                      b.available + b.per_minute / 60.0
                        * extract(epoch FROM clock_timestamp() - b.updated_at))
                - b.per_minute / 60.0 * %(retry_after_s)s,
    updated_at = clock_timestamp(),
    refusals = b.refusals + 1,
    refused_at = clock_timestamp()
WHERE b.name = ANY(%(names)s::text[])

-- name: budget_list
SELECT name, per_minute, available, updated_at, refusals, refused_at
FROM ledgerloop.model_budget
ORDER BY name
