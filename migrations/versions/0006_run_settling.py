"""Runs that always end: same-state history events recorded once per step, and the index the
sweeper reads unfinished runs through.

Revision ID: 0006
Revises: 0005
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The step that wrote an event. A step runs at least once, so an event that leaves the
    # status where it was (an answer rejected, a second tool executing, another reconciling
    # round) is only told apart from its own repeat by the step that wrote it.
    op.execute("ALTER TABLE ledgerloop.agent_run_event ADD COLUMN step text")
    op.execute(
        "CREATE UNIQUE INDEX agent_run_event_step ON ledgerloop.agent_run_event (run_id, step) "
        "WHERE step IS NOT NULL"
    )
    # Unfinished runs only: the sweeper's one query stays an index scan over in-flight runs
    # however many finished runs the table holds.
    op.execute(
        "CREATE INDEX agent_run_unfinished ON ledgerloop.agent_run (created_at) "
        "WHERE status NOT IN ('succeeded', 'failed', 'cancelled')"
    )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ledgerloop.agent_run_unfinished")
    op.execute("DROP INDEX IF EXISTS ledgerloop.agent_run_event_step")
    op.execute("ALTER TABLE ledgerloop.agent_run_event DROP COLUMN IF EXISTS step")
