-- The tenant scope's role: needed only by a session that row-level security does not bind
-- (a superuser, or a role with BYPASSRLS). The database owner, not a superuser, is bound by
-- the forced policies itself (migration 0024) and needs no role at all.

-- name: scope_state
-- This session's view: the role's name for this database, whether it exists, whether this
-- session bypasses row-level security (and so needs it), and whether it may create roles.
SELECT ledgerloop.scope_role() AS name,
       current_user AS me,
       EXISTS (SELECT 1 FROM pg_roles WHERE rolname = ledgerloop.scope_role()) AS present,
       r.rolsuper OR r.rolbypassrls AS bypasses,
       r.rolsuper OR r.rolcreaterole AS may_create
FROM pg_roles r
WHERE r.rolname = current_user

-- name: scope_enter
-- Enter a tenant's scope for the rest of the transaction, in one statement: the tenant, and,
-- only for a session that row-level security does not bind, the switch to the scope role.
SELECT set_config('ledgerloop.tenant_id', %(tenant)s, true),
       CASE WHEN r.rolsuper OR r.rolbypassrls
            THEN set_config('role', ledgerloop.scope_role(), true) END
FROM pg_roles r
WHERE r.rolname = current_user
