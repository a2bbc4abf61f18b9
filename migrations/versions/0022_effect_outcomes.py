"""The relay's outcomes as a set the planner knows is small: each effect found by its key.

The relay records outcomes in one statement (effects/queries.sql, outbox_record): a JSON
array unpacked into rows and joined to activity_effect by key. The planner estimates 100
rows for any `jsonb_to_recordset`, and the join's guard (`status = 'started'`) let it read
the effects through the partial index of unsettled ones (activity_effect_unsettled). So it
hashed every unsettled effect to record one outcome: with 5,000 effects in flight, an
outcome took 2.4 ms of the server's time instead of 0.15 ms, growing with every effect in
flight or of unknown outcome, which is when a relay must keep up. It did that both with
fresh statistics (a pkey lookup per row of the 100 it expected looked dearer) and with stale
ones (the partial index looked nearly empty).

`effect_outcomes` unpacks the same array and tells the planner to expect one row (ROWS 1;
a SQL function that is STRICT is never inlined, so the estimate holds). The statement also
compares the effect's status with a status that comes with each outcome (`from_status`)
rather than with a literal, so the partial index never matches the join: each effect is a
primary-key lookup, whatever the statistics say.

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
        LANGUAGE sql STABLE STRICT ROWS 1 AS $$
          SELECT * FROM jsonb_to_recordset(p_outcomes) AS x(
            outbox_id bigint, key text, attempt int, from_status text, status text,
            outbox_status text, external_reference text, result jsonb, error text,
            evidence jsonb, lease_s float8, retry_in_s float8, replan_step text)
        $$
        """
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION ledgerloop.effect_outcomes(jsonb)")
