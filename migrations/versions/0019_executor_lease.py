"""Each worker's row records the lease its last heartbeat granted it.

A worker that executes runs heartbeats more often and takes a shorter lease than an idle
one, so its peers must read the lease from its row instead of assuming their own
(fleet/queries.sql, executor_heartbeat). Rows of workers started before this revision have
none; peers judge those by the idle lease, as before.

Revision ID: 0019
Revises: 0018
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE ledgerloop.executor ADD COLUMN lease_until timestamptz")


def downgrade() -> None:
    op.execute("ALTER TABLE ledgerloop.executor DROP COLUMN lease_until")
