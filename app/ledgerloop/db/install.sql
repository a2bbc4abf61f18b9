-- What `ledgerloop db upgrade` needs of its role before it changes anything, so that a role
-- without it is refused with the privilege named, and no half-installed schema is left.

-- name: install_privileges
-- Schemas it must create (CREATE on the database) or already own, and tables in them owned by
-- a role it is not a member of (it could not alter them). Superusers pass every check.
SELECT current_user AS me,
       current_database() AS database,
       has_database_privilege(current_database(), 'CREATE') AS may_create_schemas,
       ARRAY(
         SELECT s.name FROM unnest(ARRAY['dbos', 'ledgerloop']) AS s(name)
         WHERE to_regnamespace(s.name) IS NULL
       ) AS missing,
       ARRAY(
         SELECT n.nspname || ' (owner ' || pg_get_userbyid(n.nspowner) || ')'
         FROM pg_namespace n
         WHERE n.nspname IN ('dbos', 'ledgerloop') AND NOT pg_has_role(n.nspowner, 'USAGE')
       ) AS schemas_not_mine,
       ARRAY(
         SELECT n.nspname || '.' || c.relname || ' (owner ' || pg_get_userbyid(c.relowner) || ')'
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname IN ('dbos', 'ledgerloop') AND c.relkind IN ('r', 'p', 'S', 'v')
           AND NOT pg_has_role(c.relowner, 'USAGE')
         ORDER BY 1 LIMIT 3
       ) AS objects_not_mine
