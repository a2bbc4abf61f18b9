"""Live runs: every run event NOTIFYs its run and sequence, and messages to a running agent.

A subscriber to a run's stream (GET /v1/runs/{id}/events, app/ledgerloop/streams) reads the
durable record from agent_run_event and learns of new rows from one LISTEN per process on
`ledgerloop_run_events`. The trigger is statement-level over the inserted rows (a transition
table): one notification per run and statement, carrying only `run_id:sequence` (the largest
sequence the statement wrote). The payload never carries the event itself, so nothing a
tenant may not read travels on a channel every session of the database may LISTEN to; the
listener reads the rows back. Notifications are sent on commit, so a rolled-back step
announces nothing.

`run_message` holds what a person sends a running agent (POST /v1/runs/{id}/messages): one
row per (run, Idempotency-Key), tenant-scoped with row-level security forced on every role
like the other tenant tables (migration 0024). Nothing is granted to the application role:
it starts runs and nothing else (docs/security.md).

Revision ID: 0026
Revises: 0025
"""

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

_SCOPE = "ledgerloop.current_tenant() IS NULL OR tenant_id = ledgerloop.current_tenant()"


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION ledgerloop.run_event_notify() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE
          r record;
        BEGIN
          FOR r IN SELECT run_id, max(sequence) AS last FROM inserted GROUP BY run_id LOOP
            PERFORM pg_notify('ledgerloop_run_events', r.run_id::text || ':' || r.last);
          END LOOP;
          RETURN NULL;
        END $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER agent_run_event_notify
        AFTER INSERT ON ledgerloop.agent_run_event
        REFERENCING NEW TABLE AS inserted
        FOR EACH STATEMENT EXECUTE FUNCTION ledgerloop.run_event_notify()
        """
    )
    op.execute("REVOKE EXECUTE ON FUNCTION ledgerloop.run_event_notify() FROM PUBLIC")
    op.execute(
        """
        CREATE TABLE ledgerloop.run_message (
          id uuid PRIMARY KEY,
          run_id uuid NOT NULL REFERENCES ledgerloop.agent_run(id) ON DELETE CASCADE,
          tenant_id uuid NOT NULL,
          idempotency_key text NOT NULL,
          content jsonb NOT NULL,
          sent_by text NOT NULL,
          created_at timestamptz NOT NULL DEFAULT now(),
          -- When the agent took it into its conversation (a turn boundary or wait_for_message).
          consumed_at timestamptz,
          UNIQUE (run_id, idempotency_key)
        )
        """
    )
    op.execute(
        "CREATE INDEX run_message_pending ON ledgerloop.run_message (run_id, created_at) "
        "WHERE consumed_at IS NULL"
    )
    op.execute("ALTER TABLE ledgerloop.run_message ENABLE ROW LEVEL SECURITY")
    # FORCE: the owner, which workers and the HTTP API connect as, is bound too.
    op.execute("ALTER TABLE ledgerloop.run_message FORCE ROW LEVEL SECURITY")
    op.execute(
        f"CREATE POLICY tenant_scope ON ledgerloop.run_message "
        f"USING ({_SCOPE}) WITH CHECK ({_SCOPE})"
    )


def downgrade() -> None:
    op.execute("DROP TABLE ledgerloop.run_message")
    op.execute("DROP TRIGGER agent_run_event_notify ON ledgerloop.agent_run_event")
    op.execute("DROP FUNCTION ledgerloop.run_event_notify()")
