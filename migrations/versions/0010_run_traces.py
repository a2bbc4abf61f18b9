"""One trace per run: where a resumed execution records itself, and the run's traceparent.

Revision ID: 0010
Revises: 0006
"""

from alembic import op

revision = "0010"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Telemetry only: the execution of a run that is running now, written when a resumed
    # execution takes over (never on a run's first execution, never per step) and marked
    # ended when it hibernates or its worker stops. The next execution reads it to emit the
    # span of one that was killed. NULL for runs that never resumed.
    op.execute("ALTER TABLE ledgerloop.agent_run ADD COLUMN execution jsonb")
    # The run's root span as a W3C traceparent, so a caller that starts a run from SQL can
    # link its own span to the run: the trace id is the run id, the root span id the first 8
    # bytes of sha256('ledgerloop.run.root:' || the run id's 16 bytes) (see
    # ledgerloop.telemetry.runtrace.root_span_id).
    op.execute(
        """
        CREATE FUNCTION ledgerloop.run_traceparent(run_id uuid) RETURNS text
        LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
          SELECT '00-' || replace(run_id::text, '-', '') || '-' ||
                 CASE WHEN root = '\\x0000000000000000'::bytea THEN '0000000000000001'
                      ELSE encode(root, 'hex') END || '-01'
          FROM (SELECT substr(sha256('ledgerloop.run.root:'::bytea ||
                       decode(replace(run_id::text, '-', ''), 'hex')), 1, 8) AS root) AS r
        $$
        """
    )
    op.execute("GRANT EXECUTE ON FUNCTION ledgerloop.run_traceparent(uuid) TO PUBLIC")


def downgrade() -> None:
    op.execute("DROP FUNCTION ledgerloop.run_traceparent(uuid)")
    op.execute("ALTER TABLE ledgerloop.agent_run DROP COLUMN execution")
