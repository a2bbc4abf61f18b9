-- Room on the server for a process's connections (db/capacity.py), read before it opens them.

-- name: capacity_read
-- The server's limit and what holds connections now (this session excluded), Ledgerloop's by
-- application_name; the role's and the database's CONNECTION LIMIT (-1: none) and their use.
-- Superusers may use the reserved slots, and no CONNECTION LIMIT binds them.
SELECT current_setting('max_connections')::int AS max_connections,
       current_setting('superuser_reserved_connections')::int AS reserved,
       r.rolsuper AS superuser,
       r.rolname AS role,
       r.rolconnlimit AS role_limit,
       d.datname AS database,
       d.datconnlimit AS database_limit,
       (SELECT count(*) FROM pg_stat_activity a
        WHERE a.backend_type = 'client backend' AND a.pid <> pg_backend_pid())::int AS in_use,
       (SELECT count(*) FROM pg_stat_activity a
        WHERE a.backend_type = 'client backend' AND a.pid <> pg_backend_pid()
          AND a.application_name LIKE 'ledgerloop%%')::int AS ledgerloop,
       (SELECT count(*) FROM pg_stat_activity a
        WHERE a.backend_type = 'client backend' AND a.pid <> pg_backend_pid()
          AND a.usename = r.rolname)::int AS role_in_use,
       (SELECT count(*) FROM pg_stat_activity a
        WHERE a.backend_type = 'client backend' AND a.pid <> pg_backend_pid()
          AND a.datname = d.datname)::int AS database_in_use
FROM pg_roles r, pg_database d
WHERE r.rolname = current_user AND d.datname = current_database()

-- name: capacity_processes
-- Ledgerloop's connections on this server by process (application_name
-- `ledgerloop:<executor>:<part>`; other Ledgerloop commands are `ledgerloop-<part>`).
SELECT CASE WHEN application_name LIKE 'ledgerloop:%%'
            THEN split_part(application_name, ':', 2) ELSE application_name END AS process,
       count(*)::int AS connections
FROM pg_stat_activity
WHERE backend_type = 'client backend' AND application_name LIKE 'ledgerloop%%'
  AND pid <> pg_backend_pid()
GROUP BY 1 ORDER BY 2 DESC, 1
