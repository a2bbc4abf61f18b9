"""The input's depth check keeps one plan: start_run no longer plans a query per run.

`jsonb_depth_exceeds` (migration 0015) walks a run's input level by level with one query
whose parameter is the level's values. PL/pgSQL gave that query a custom plan at every
execution: the planner always expected a custom plan to beat the generic one, so it never
switched. That planning took 0.12-0.15 ms of every `start_run` (pg_stat_statements with
track_planning, inside `scripts/bench turn_write`'s runs), about a sixth of the call. The
query's shape does not depend on its parameter, so the generic plan is the right one for
every input: the function now asks for it.

Revision ID: 0023
Revises: 0022
"""

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER FUNCTION ledgerloop.jsonb_depth_exceeds(jsonb, int) "
        "SET plan_cache_mode = force_generic_plan"
    )


def downgrade() -> None:
    op.execute("ALTER FUNCTION ledgerloop.jsonb_depth_exceeds(jsonb, int) RESET plan_cache_mode")
