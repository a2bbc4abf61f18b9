"""The role boundary: no cluster-wide role, tenant policies that bind every role, and an
application role that can call start_run and nothing else.

Until now a tenant scope switched to `ledgerloop_tenant`, a role created by migration 0001
and granted SELECT, INSERT and UPDATE on the tenant tables, and `ledgerloop db grant` made an
application role a member of it and let it write DBOS's workflow tables. That gave the
application role far more than starting runs (writing effects and outbox rows the relay
delivers, enqueueing a second workflow of a run, rewriting any workflow's status), and the
role being cluster-wide carried those rights into every other Ledgerloop database on the
cluster. Creating it also needed CREATEROLE, so the database owner could not install.

Now:
- No role is created or needed by the database owner. A tenant scope is the
  transaction-local setting `ledgerloop.tenant_id`; every tenant table forces row-level
  security on every role, its owner included, with a policy that admits only the scope's
  tenant when one is set (the HTTP API, the CLI's --tenant) and every row when none is
  (workers, relay, reconciler). Superusers and BYPASSRLS roles are not bound by policies:
  their scopes switch to a per-database scope role that `ledgerloop db upgrade` creates when
  it may (db/roles.py).
- `start_run` is SECURITY DEFINER with its pinned search_path: it writes the run, its event
  and its workflow as the owner, so the caller needs no right on any table.
- `grant_start_run(role)` grants USAGE on schema ledgerloop and EXECUTE on `start_run` and
  `run_traceparent` (a pure function of its argument): nothing else.
- Every function of the schema is executable only by roles granted it (PUBLIC had EXECUTE on
  all of them by default). `ledgerloop db upgrade` re-applies that after each upgrade, for
  DBOS's functions too (db/dbos_objects.py, public_functions).
- What earlier releases granted is taken back in this database: the tenant role keeps no
  right here, and each application role that could call start_run loses its rights on schema
  dbos and, where this role may, its membership of the tenant role. The role itself is left
  for a DBA to drop once no database uses it (docs/security.md).

Revision ID: 0024
Revises: 0023
"""

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

#: Every table with a tenant_id that a tenant scope must confine.
TENANT_TABLES = (
    "agent_run",
    "agent_run_event",
    "agent_message",
    "agent_message_batch",
    "payload",
    "activity_effect",
    "outbox",
    "approval",
)

_SCOPE = "ledgerloop.current_tenant() IS NULL OR tenant_id = ledgerloop.current_tenant()"


def upgrade() -> None:
    for table in TENANT_TABLES:
        op.execute(f"ALTER TABLE ledgerloop.{table} ENABLE ROW LEVEL SECURITY")
        # FORCE: the owner, which workers and the HTTP API connect as, is bound too.
        op.execute(f"ALTER TABLE ledgerloop.{table} FORCE ROW LEVEL SECURITY")
        op.execute(f"DROP POLICY IF EXISTS tenant_isolation ON ledgerloop.{table}")
        op.execute(
            f"CREATE POLICY tenant_scope ON ledgerloop.{table} "
            f"USING ({_SCOPE}) WITH CHECK ({_SCOPE})"
        )
    # The name of this database's scope role (db/roles.py): only a session that row-level
    # security does not bind (a superuser, BYPASSRLS) switches to it inside a tenant scope.
    op.execute(
        """
        CREATE FUNCTION ledgerloop.scope_role() RETURNS text
        LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
          SELECT 'ledgerloop_scope_' || CASE WHEN octet_length(current_database()) <= 46
                                             THEN current_database()
                                             ELSE md5(current_database()) END
        $$
        """
    )
    _take_back_earlier_grants()
    op.execute(
        "ALTER FUNCTION ledgerloop.start_run(text, jsonb, text, uuid) SECURITY DEFINER "
        "SET search_path = pg_catalog, pg_temp"
    )
    op.execute(_GRANT_START_RUN)
    op.execute("REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA ledgerloop FROM PUBLIC")


def _take_back_earlier_grants() -> None:
    # Application roles granted by earlier releases are the roles, other than the owner, that
    # may execute start_run. They keep that, and run_traceparent; they lose schema dbos. A
    # role that may not revoke the tenant role's membership (it needs ADMIN OPTION) says so:
    # in this database the tenant role holds nothing any more, so the membership is inert.
    op.execute(
        """
        DO $$
        DECLARE
          v_role text;
          v_fn oid := 'ledgerloop.start_run(text, jsonb, text, uuid)'::regprocedure;
        BEGIN
          FOR v_role IN
            SELECT r.rolname
            FROM pg_proc p, aclexplode(p.proacl) a JOIN pg_roles r ON r.oid = a.grantee
            WHERE p.oid = v_fn AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
          LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION ledgerloop.run_traceparent(uuid) TO %I',
                           v_role);
            IF to_regnamespace('dbos') IS NOT NULL THEN
              EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA dbos FROM %I', v_role);
              EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA dbos FROM %I', v_role);
              EXECUTE format('REVOKE ALL ON SCHEMA dbos FROM %I', v_role);
            END IF;
            IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'ledgerloop_tenant') THEN
              BEGIN
                EXECUTE format('REVOKE ledgerloop_tenant FROM %I', v_role);
              EXCEPTION WHEN insufficient_privilege THEN
                RAISE WARNING 'role % is still a member of ledgerloop_tenant', v_role
                  USING HINT = format('a DBA may run: REVOKE ledgerloop_tenant FROM %I', v_role);
              END;
            END IF;
          END LOOP;
          IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'ledgerloop_tenant') THEN
            REVOKE ALL ON ALL TABLES IN SCHEMA ledgerloop FROM ledgerloop_tenant;
            REVOKE ALL ON ALL SEQUENCES IN SCHEMA ledgerloop FROM ledgerloop_tenant;
            REVOKE ALL ON ALL FUNCTIONS IN SCHEMA ledgerloop FROM ledgerloop_tenant;
            REVOKE ALL ON SCHEMA ledgerloop FROM ledgerloop_tenant;
          END IF;
        END $$
        """
    )


_GRANT_START_RUN = """
    CREATE OR REPLACE FUNCTION ledgerloop.grant_start_run(app_role text) RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp AS $$
    BEGIN
      IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = app_role) THEN
        RAISE EXCEPTION USING
          ERRCODE = 'LL002',
          MESSAGE = format('ledgerloop.grant_start_run: no role %I', app_role),
          HINT = format('create it first: CREATE ROLE %I LOGIN PASSWORD ...', app_role);
      END IF;
      -- start_run is SECURITY DEFINER: calling it needs no right on any table, here or in
      -- schema dbos. USAGE on the schema lets the role name the two functions and nothing
      -- else: no table, sequence or other function of the schema is granted to it.
      EXECUTE format('GRANT USAGE ON SCHEMA ledgerloop TO %I', app_role);
      EXECUTE format('GRANT EXECUTE ON FUNCTION ledgerloop.start_run(text, jsonb, text, '
                     'uuid) TO %I', app_role);
      EXECUTE format('GRANT EXECUTE ON FUNCTION ledgerloop.run_traceparent(uuid) TO %I',
                     app_role);
    END $$
"""


def downgrade() -> None:
    raise NotImplementedError("the role boundary is not undone: restore from a backup")
