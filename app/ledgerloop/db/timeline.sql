-- name: server_timeline
-- The server's timeline (a promotion starts a new one): the first 8 hex digits of the name
-- of the WAL file being written. Fails on a standby (pg_current_wal_lsn): callers read NULL.
SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int AS timeline
