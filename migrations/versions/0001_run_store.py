"""The run store: agent_run snapshots and agent_run_event history, each row with its tenant.

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
    # No role is created: the tenant scope is a setting that row-level security reads, and
    # its policies are migration 0024's (installing needs no CREATEROLE).
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
