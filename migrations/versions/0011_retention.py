"""Retention: finished runs can be found by when they finished, and can outlive their journals.

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Set when a purge removed the run's journal and messages but kept its audit history
    # (`ledgerloop runs purge --keep-audit`); a later purge without it deletes the rest.
    op.execute("ALTER TABLE ledgerloop.agent_run ADD COLUMN journal_purged_at timestamptz")
    # A terminal run is never updated again, so updated_at is when it finished. Partial
    # indexes: the purge walks only finished runs, in finishing order, and running ones never
    # pay for them.
    op.execute(
        "CREATE INDEX agent_run_finished ON ledgerloop.agent_run (updated_at, id) "
        "WHERE status IN ('succeeded', 'failed', 'cancelled')"
    )
    op.execute(
        "CREATE INDEX agent_run_finished_with_journal ON ledgerloop.agent_run (updated_at, id) "
        "WHERE status IN ('succeeded', 'failed', 'cancelled') AND journal_purged_at IS NULL"
    )
    # Deleting an effect checks that no compensation references it; without an index that
    # check scans every effect, once per deleted effect (a purge of 500 runs took seconds).
    op.execute(
        "CREATE INDEX activity_effect_compensates ON ledgerloop.activity_effect (compensates) "
        "WHERE compensates IS NOT NULL"
    )
