"""Live runs, part two: typed durable events, and tokens as they are generated.

Typed durable events. A run's stream ids are its version (migration 0026): each status move
bumps it and records its event under it, in one statement. The events below are recorded
the same way, each inside the statement that already writes what it reports, so they add no
statement: `ledgerloop.run_event_append` bumps the version and inserts the event. Triggers
call it for an approval's decision (`approval.decided`), an effect's creation and status
changes (`effect.status`) and a message to the run (`message.received`); the step
checkpoint's statement (db/dbos_checkpoint.sql) records `step.finished` itself. Nothing is
appended once the run is finished: its stream has closed with `run.finished`. The trigger
functions are SECURITY DEFINER (the tenant scope role writing a message may not call
run_event_append itself); row-level security still binds them, as it binds the owner.

Model text, as it is generated: a model call's text deltas, kept only while they are live.

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


_APPEND = """
CREATE FUNCTION ledgerloop.run_event_append(p_run uuid, p_type text, p_payload jsonb)
RETURNS void LANGUAGE sql AS $$
  WITH moved AS (
    UPDATE ledgerloop.agent_run r SET version = r.version + 1
    WHERE r.id = p_run AND r.status NOT IN ('succeeded', 'failed', 'cancelled')
    RETURNING r.id, r.tenant_id, r.version
  )
  INSERT INTO ledgerloop.agent_run_event (run_id, tenant_id, sequence, event_type, payload)
  SELECT id, tenant_id, version, p_type, p_payload FROM moved
$$
"""

_APPROVAL = """
CREATE FUNCTION ledgerloop.approval_event() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, ledgerloop AS $$
BEGIN
  PERFORM ledgerloop.run_event_append(NEW.run_id, 'approval.decided', jsonb_build_object(
    'approval_id', NEW.id, 'tool', NEW.tool, 'tool_call_id', NEW.tool_call_id,
    'status', NEW.status, 'decided_by', NEW.decided_by_name, 'reason', NEW.reason));
  RETURN NULL;
END $$
"""

_EFFECT = """
CREATE FUNCTION ledgerloop.effect_event() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, ledgerloop AS $$
BEGIN
  PERFORM ledgerloop.run_event_append(NEW.run_id, 'effect.status', jsonb_build_object(
    'idempotency_key', NEW.idempotency_key, 'tool', NEW.tool, 'status', NEW.status,
    'previous', CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END,
    'attempts', NEW.attempts, 'external_reference', NEW.external_reference));
  RETURN NULL;
END $$
"""

_MESSAGE = """
CREATE FUNCTION ledgerloop.message_event() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, ledgerloop AS $$
BEGIN
  PERFORM ledgerloop.run_event_append(NEW.run_id, 'message.received', jsonb_build_object(
    'message_id', NEW.id, 'sent_by', NEW.sent_by));
  RETURN NULL;
END $$
"""

_FUNCTIONS = (
    "run_event_append(uuid, text, jsonb)",
    "approval_event()",
    "effect_event()",
    "message_event()",
    "run_text_notify()",
)


def upgrade() -> None:
    for create in (_APPEND, _APPROVAL, _EFFECT, _MESSAGE):
        op.execute(create)
    op.execute(
        """
        CREATE TRIGGER approval_decided_event
        AFTER UPDATE OF status ON ledgerloop.approval
        FOR EACH ROW WHEN (OLD.status = 'pending' AND NEW.status <> 'pending')
        EXECUTE FUNCTION ledgerloop.approval_event()
        """
    )
    op.execute(
        """
        CREATE TRIGGER effect_created_event
        AFTER INSERT ON ledgerloop.activity_effect
        FOR EACH ROW EXECUTE FUNCTION ledgerloop.effect_event()
        """
    )
    op.execute(
        """
        CREATE TRIGGER effect_status_event
        AFTER UPDATE OF status ON ledgerloop.activity_effect
        FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
        EXECUTE FUNCTION ledgerloop.effect_event()
        """
    )
    op.execute(
        """
        CREATE TRIGGER message_received_event
        AFTER INSERT ON ledgerloop.run_message
        FOR EACH ROW EXECUTE FUNCTION ledgerloop.message_event()
        """
    )
    op.execute(
        """
        CREATE UNLOGGED TABLE ledgerloop.run_text (
          id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
          run_id uuid NOT NULL,
          tenant_id uuid NOT NULL,
          step text NOT NULL,
          attempt int NOT NULL,
          -- 'text' (deltas), 'tool.called', 'tool.result'.
          kind text NOT NULL DEFAULT 'text',
          -- The first delta's index in this attempt's text (a client sees a lost batch).
          seq int NOT NULL,
          text text NOT NULL,
          data jsonb,
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
    for function in _FUNCTIONS:
        op.execute(f"REVOKE EXECUTE ON FUNCTION ledgerloop.{function} FROM PUBLIC")
    op.execute("ALTER TABLE ledgerloop.run_text ENABLE ROW LEVEL SECURITY")
    op.execute("ALTER TABLE ledgerloop.run_text FORCE ROW LEVEL SECURITY")
    op.execute(
        f"CREATE POLICY tenant_scope ON ledgerloop.run_text USING ({_SCOPE}) WITH CHECK ({_SCOPE})"
    )


def downgrade() -> None:
    op.execute("DROP TABLE ledgerloop.run_text")
    op.execute("DROP TRIGGER message_received_event ON ledgerloop.run_message")
    op.execute("DROP TRIGGER effect_status_event ON ledgerloop.activity_effect")
    op.execute("DROP TRIGGER effect_created_event ON ledgerloop.activity_effect")
    op.execute("DROP TRIGGER approval_decided_event ON ledgerloop.approval")
    for function in reversed(_FUNCTIONS):
        op.execute(f"DROP FUNCTION ledgerloop.{function}")
