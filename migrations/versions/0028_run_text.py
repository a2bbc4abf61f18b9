"""Tokens as they are generated: a model call's text deltas, kept only while they are live.

The think step streams its model call and appends each batch of text deltas to `run_text`
(streams/publish.py); a statement-level trigger NOTIFYs `ledgerloop_run_text` with
`run_id:id` (the largest id the statement wrote), and each HTTP process's one listener reads
the new rows back for the runs it serves (streams/hub.py). As with the run events (0026),
the payload carries no text: any session may LISTEN on a channel, and a tenant's model text
must not travel where another tenant's role can hear it.

The table is UNLOGGED: deltas are not the record (the journal keeps one final message per
model call), so they cost no WAL, and a crash of the database empties the table, which
loses nothing a stream promised. `attempt` counts the executions of a step that streamed
(1, 2, ...): a step cut off mid-stream and run again streams under the next attempt, so a
client discards the partial text of the one before. Rows of finished runs are swept
(streams/publish.py). Row-level security is forced like every tenant table.

Revision ID: 0028
Revises: 0027
"""

from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

_SCOPE = "ledgerloop.current_tenant() IS NULL OR tenant_id = ledgerloop.current_tenant()"


def upgrade() -> None:
    op.execute(
        """
        CREATE UNLOGGED TABLE ledgerloop.run_text (
          id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
          run_id uuid NOT NULL,
          tenant_id uuid NOT NULL,
          step text NOT NULL,
          attempt int NOT NULL,
          -- The first delta's index in this attempt's text (a client sees a lost batch).
          seq int NOT NULL,
          text text NOT NULL,
          created_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute("CREATE INDEX run_text_run ON ledgerloop.run_text (run_id, id)")
    op.execute(
        """
        CREATE FUNCTION ledgerloop.run_text_notify() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE
          r record;
        BEGIN
          FOR r IN SELECT run_id, max(id) AS last FROM inserted GROUP BY run_id LOOP
            PERFORM pg_notify('ledgerloop_run_text', r.run_id::text || ':' || r.last);
          END LOOP;
          RETURN NULL;
        END $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER run_text_notify
        AFTER INSERT ON ledgerloop.run_text
        REFERENCING NEW TABLE AS inserted
        FOR EACH STATEMENT EXECUTE FUNCTION ledgerloop.run_text_notify()
        """
    )
    op.execute("REVOKE EXECUTE ON FUNCTION ledgerloop.run_text_notify() FROM PUBLIC")
    op.execute("ALTER TABLE ledgerloop.run_text ENABLE ROW LEVEL SECURITY")
    op.execute("ALTER TABLE ledgerloop.run_text FORCE ROW LEVEL SECURITY")
    op.execute(
        f"CREATE POLICY tenant_scope ON ledgerloop.run_text USING ({_SCOPE}) WITH CHECK ({_SCOPE})"
    )


def downgrade() -> None:
    op.execute("DROP TABLE ledgerloop.run_text")
    op.execute("DROP FUNCTION ledgerloop.run_text_notify()")
