"""An effect's message is sent once a workflow waits for it, not for every outcome.

Every outcome the relay or the reconciler records on an effect sent the run's workflow a DBOS
message (activity_effect_reported, migration 0003): a row in DBOS's message table, its index
entries and a NOTIFY that wakes each worker's listener. A write that a worker's own relay
delivers, though, is read back by the step that sent it: that step takes the outcome from the
delivery and no workflow ever receives the message.

So an effect now says whether a workflow may wait for it (`awaited`). Effects recorded for
a relay elsewhere, and compensations, are awaited from the start, as before. The record of a
write this worker's relay delivers (effect_record_claimed) is not: its step marks it awaited
(agent/write_steps.py, effect_await) before it waits, and only if the outcome it got is not
settled. Marking it sends the message of a status already recorded
(activity_effect_awaited), so a workflow hears of every status recorded before or after it
began to wait, as before. Both updates lock the row, so of the outcome's record and the mark,
whichever comes second sees the other.

Revision ID: 0021
Revises: 0020
"""

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

# The statuses a waiting workflow hears about (ledgerloop.effects.messages.REPORTED).
_REPORTED = "'succeeded', 'failed', 'outcome_unknown', 'needs_human'"

_REPORTED_TRIGGER = f"""
    CREATE TRIGGER activity_effect_reported
    AFTER UPDATE OF status ON ledgerloop.activity_effect
    FOR EACH ROW
    WHEN (NEW.status IS DISTINCT FROM OLD.status AND NEW.status IN ({_REPORTED})CONDITION)
    EXECUTE FUNCTION ledgerloop.activity_effect_reported()
"""


def upgrade() -> None:
    # A constant default: no table rewrite, and every effect recorded so far stays awaited.
    op.execute(
        "ALTER TABLE ledgerloop.activity_effect ADD COLUMN awaited boolean NOT NULL DEFAULT true"
    )
    op.execute("DROP TRIGGER activity_effect_reported ON ledgerloop.activity_effect")
    op.execute(_REPORTED_TRIGGER.replace("CONDITION", " AND NEW.awaited"))
    op.execute(
        f"""
        CREATE TRIGGER activity_effect_awaited
        AFTER UPDATE OF awaited ON ledgerloop.activity_effect
        FOR EACH ROW
        WHEN (NEW.awaited AND NOT OLD.awaited AND NEW.status IN ({_REPORTED}))
        EXECUTE FUNCTION ledgerloop.activity_effect_reported()
        """
    )
    op.execute(_RECORD_CLAIMED_UNAWAITED)


def downgrade() -> None:
    op.execute(_RECORD_CLAIMED)
    op.execute("DROP TRIGGER activity_effect_awaited ON ledgerloop.activity_effect")
    op.execute("DROP TRIGGER activity_effect_reported ON ledgerloop.activity_effect")
    op.execute(_REPORTED_TRIGGER.replace("CONDITION", ""))
    op.execute("ALTER TABLE ledgerloop.activity_effect DROP COLUMN awaited")


# effect_record_claimed as migration 0020 made it, but for the effect born not awaited.
_RECORD_CLAIMED_UNAWAITED = """
        CREATE OR REPLACE FUNCTION ledgerloop.effect_record_claimed(
          p_key text, p_run_id uuid, p_tenant_id uuid, p_tool text, p_request_hash text,
          p_destination text, p_request jsonb, p_timeout_ms float8, p_lease_margin_s float8,
          p_deadline_s float8, p_approval_id uuid, p_step text, p_payload jsonb,
          p_allowed_from text[]
        ) RETURNS TABLE (
          current text, granted boolean, there boolean,
          idempotency_key text, run_id uuid, tenant_id uuid, tool text, request_hash text,
          destination text, status text, external_reference text, result jsonb, error text,
          evidence jsonb, attempts integer, lease_until timestamptz, compensates text,
          resolved_by text, created_at timestamptz, updated_at timestamptz,
          outbox_id bigint, deadline_in_s float8
        )
        LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
        -- The output columns share the tables' column names: a name in a query is a column.
        #variable_conflict use_column
        BEGIN
          -- Nothing is written unless the approval, when there is one, is approved by a
          -- principal for exactly this action; the effect is written only when the run is
          -- there under this step (moved now, or by an earlier execution of the step). The
          -- answer says what held: no effect columns means the approval, the run or the key
          -- said no.
          RETURN QUERY
          WITH granted AS (
            SELECT 1 WHERE p_approval_id IS NULL
            UNION ALL
            SELECT 1 FROM ledgerloop.approval a
            WHERE a.id = p_approval_id
              AND a.status = 'approved'
              AND a.decided_by_principal IS NOT NULL
              AND a.auth_role IS NOT NULL
              AND a.action_hash = p_request_hash
          ), cur AS (
            SELECT r.id, r.status FROM ledgerloop.agent_run r WHERE r.id = p_run_id
            FOR NO KEY UPDATE
          ), seen AS (
            SELECT 1 FROM ledgerloop.agent_run_event e
            WHERE e.run_id = p_run_id AND e.step = p_step
          ), moved AS (
            UPDATE ledgerloop.agent_run r
            SET status = 'executing', version = r.version + 1, updated_at = now()
            FROM cur
            WHERE r.id = cur.id
              AND cur.status = ANY(p_allowed_from)
              AND EXISTS (SELECT 1 FROM granted)
              AND NOT EXISTS (SELECT 1 FROM seen)
            RETURNING r.id, r.tenant_id, r.version
          ), event AS (
            INSERT INTO ledgerloop.agent_run_event
              (run_id, tenant_id, sequence, event_type, payload, step)
            SELECT m.id, m.tenant_id, m.version, 'executing', p_payload, p_step FROM moved m
          ), effect AS (
            INSERT INTO ledgerloop.activity_effect
              (idempotency_key, run_id, tenant_id, tool, request_hash, destination, status,
               attempts, lease_until, awaited)
            SELECT p_key, p_run_id, p_tenant_id, p_tool, p_request_hash, p_destination,
                   'started', 1,
                   now() + make_interval(secs => p_timeout_ms / 1000 + p_lease_margin_s),
                   false
            WHERE EXISTS (SELECT 1 FROM granted)
              AND (EXISTS (SELECT 1 FROM moved) OR EXISTS (SELECT 1 FROM seen))
            ON CONFLICT (idempotency_key) DO NOTHING
            RETURNING *
          ), queued AS (
            INSERT INTO ledgerloop.outbox
              (idempotency_key, tenant_id, destination, request, deadline_at, status,
               attempts, lease_until)
            SELECT f.idempotency_key, f.tenant_id, f.destination, p_request,
                   now() + make_interval(secs => p_deadline_s), 'claimed', 1, f.lease_until
            FROM effect f
            RETURNING id, extract(epoch FROM deadline_at - now())::float8 AS deadline_in_s
          )
          SELECT cur.status,
                 EXISTS (SELECT 1 FROM granted),
                 EXISTS (SELECT 1 FROM moved) OR EXISTS (SELECT 1 FROM seen),
                 f.idempotency_key, f.run_id, f.tenant_id, f.tool, f.request_hash,
                 f.destination, f.status, f.external_reference, f.result, f.error,
                 f.evidence, f.attempts, f.lease_until, f.compensates, f.resolved_by,
                 f.created_at, f.updated_at, q.id, q.deadline_in_s
          FROM cur
          LEFT JOIN (effect f CROSS JOIN queued q) ON true;
        END $$
"""

# As migration 0020 made it: the effect born awaited (the column's default).
_RECORD_CLAIMED = _RECORD_CLAIMED_UNAWAITED.replace(
    "attempts, lease_until, awaited)", "attempts, lease_until)"
).replace("p_lease_margin_s),\n                   false", "p_lease_margin_s)")
