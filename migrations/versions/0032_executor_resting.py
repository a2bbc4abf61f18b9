"""An idle worker rests: it stops writing its heartbeat row.

A worker with nothing to execute for a while writes `resting_since` once and then keeps
only its heartbeat session (and the advisory lock it holds there) until it has work again.
Peers judge a resting worker by that lock alone: held, it is alive however old its
`heartbeat_at`; free, it is gone once its lease has run out (fleet/queries.sql,
executor_heartbeat). Its first heartbeat with work clears the column. Rows written by older
releases have none and are judged as before.

Revision ID: 0032
Revises: 0027
"""

from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE ledgerloop.executor ADD COLUMN resting_since timestamptz")


def downgrade() -> None:
    op.execute("ALTER TABLE ledgerloop.executor DROP COLUMN resting_since")
