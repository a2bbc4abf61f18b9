"""The run store: agent_run snapshots, agent_run_event history, tenant row-level security.

Revision ID: 0001
Revises:
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Kept equal to ledgerloop.runs.states.RunStatus; tests/integration/test_schema.py checks
# that they agree.
STATUSES = (
    "received",
    "planning",
    "awaiting_approval",
    "executing",
    "reconciling",
    "succeeded",
    "failed",
    "cancelled",
)


def upgrade() -> None:
    statuses = ", ".join(f"'{s}'" for s in STATUSES)
    op.execute(
        """
        DO $$
        BEGIN
          CREATE ROLE ledgerloop_tenant NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END $$;
        """
    )
    # The migrating role must be able to SET ROLE to the tenant role (superusers always can).
    op.execute(
        """
        DO $$
        BEGIN
          IF NOT pg_has_role(current_user, 'ledgerloop_tenant', 'MEMBER') THEN
            EXECUTE format('GRANT ledgerloop_tenant TO %I', current_user);
          END IF;
        END $$;
        """
    )
    op.execute(
        """
        CREATE FUNCTION ledgerloop.current_tenant() RETURNS uuid
        LANGUAGE sql STABLE AS
        $$ SELECT NULLIF(current_setting('ledgerloop.tenant_id', true), '')::uuid $$
        """
    )
    op.execute(
        f"""
        CREATE TABLE ledgerloop.agent_run (
          id uuid PRIMARY KEY,
          tenant_id uuid NOT NULL,
          agent text NOT NULL,
          status text NOT NULL CHECK (status IN ({statuses})),
          state jsonb NOT NULL DEFAULT '{{}}'::jsonb,
          input jsonb NOT NULL DEFAULT '{{}}'::jsonb,
          idempotency_key text,
          version bigint NOT NULL DEFAULT 0,
          created_at timestamptz NOT NULL DEFAULT now(),
          updated_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        "CREATE UNIQUE INDEX agent_run_idempotency_key ON ledgerloop.agent_run "
        "(tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL"
    )
    op.execute(
        "CREATE INDEX agent_run_tenant_status ON ledgerloop.agent_run "
        "(tenant_id, status, created_at DESC)"
    )
    op.execute(
        """
        CREATE TABLE ledgerloop.agent_run_event (
          run_id uuid NOT NULL REFERENCES ledgerloop.agent_run(id) ON DELETE CASCADE,
          tenant_id uuid NOT NULL,
          sequence bigint NOT NULL,
          event_type text NOT NULL,
          payload jsonb NOT NULL DEFAULT '{}'::jsonb,
          created_at timestamptz NOT NULL DEFAULT now(),
          PRIMARY KEY (run_id, sequence)
        )
        """
    )
    for table in ("agent_run", "agent_run_event"):
        op.execute(f"ALTER TABLE ledgerloop.{table} ENABLE ROW LEVEL SECURITY")
        op.execute(
            f"CREATE POLICY tenant_isolation ON ledgerloop.{table} TO ledgerloop_tenant "
            "USING (tenant_id = ledgerloop.current_tenant()) "
            "WITH CHECK (tenant_id = ledgerloop.current_tenant())"
        )
        op.execute(f"GRANT SELECT, INSERT, UPDATE ON ledgerloop.{table} TO ledgerloop_tenant")
    op.execute("GRANT USAGE ON SCHEMA ledgerloop TO ledgerloop_tenant")
    op.execute("GRANT EXECUTE ON FUNCTION ledgerloop.current_tenant() TO ledgerloop_tenant")
