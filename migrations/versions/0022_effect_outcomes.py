"""The relay's outcomes as a set the planner knows is small: each effect found by its key.

The relay records outcomes in one statement (effects/queries.sql, outbox_record): a JSON
array unpacked into rows and joined to activity_effect by key. The planner estimates 100
rows for any `jsonb_to_recordset`, and the join's guard (`status = 'started'`) let it read
the effects through the partial index of unsettled ones (activity_effect_unsettled). So it
hashed every unsettled effect to record one outcome, when many are in flight or of unknown
outcome, which is when a relay must keep up (`scripts/bench outcomes`: 3.0x the time of a
record with none in flight at 5,000, 10.4x at 20,000). Fresh statistics did not prevent it
(100 key lookups looked dearer than one pass over 5,000 entries), nor stale ones (the
partial index looked nearly empty).

`effect_outcomes` unpacks the same array and tells the planner to expect one row (ROWS 1).
A PL/pgSQL function is never inlined, so the estimate holds, and it keeps its plan for the
session (a SQL function that is not inlined plans its body at every call: 0.06 ms more per
outcome). The statement also compares the effect's status with a status that comes with
each outcome (`from_status`) rather than with a literal, so the partial index never matches
the join: each effect is a primary-key lookup, whatever the statistics say.

Revision ID: 0022
Revises: 0021
"""

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION ledgerloop.effect_outcomes(p_outcomes jsonb) RETURNS TABLE (
          outbox_id bigint, key text, attempt int, from_status text, status text,
          outbox_status text, external_reference text, result jsonb, error text,
          evidence jsonb, lease_s float8, retry_in_s float8, replan_step text
        )
        LANGUAGE plpgsql STABLE STRICT ROWS 1 AS $$
        BEGIN
          RETURN QUERY SELECT * FROM jsonb_to_recordset(p_outcomes) AS x(
            outbox_id bigint, key text, attempt int, from_status text, status text,
            outbox_status text, external_reference text, result jsonb, error text,
            evidence jsonb, lease_s float8, retry_in_s float8, replan_step text);
        END $$
        """
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION ledgerloop.effect_outcomes(jsonb)")
