-- Retention's own queries (the deletes live with the tables they delete from).

-- name: purge_lock_try
-- One purger at a time across the fleet: a session lock, held while a worker purges and
-- released when its connection closes (a worker that dies mid-purge frees it).
SELECT pg_try_advisory_lock(hashtext('ledgerloop.purge')) AS locked

-- name: purge_lock_release
SELECT pg_advisory_unlock(hashtext('ledgerloop.purge')) AS released

-- name: purge_by_key_plans
-- A purge deletes a batch by key: index lookups are always the right plan (see PurgeClient).
SET LOCAL enable_seqscan = off
