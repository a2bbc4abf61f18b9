"""The server timeline each worker last saw, so that a worker started after a failover marks
the runs it takes over from a worker that died with the old primary.

A worker that lived through a failover runs the rewind check (fleet/heartbeat.py) and names
the runs that lost their recent past in `run_rewound`. A worker that died with the old
primary never does: its row stays on the new primary until a survivor, or a worker started
later that has nothing in memory to compare, takes it over. Each heartbeat now records the
timeline its worker knows (`executor.timeline`); a takeover of a worker whose row names
another timeline than the server's names that worker's runs in `run_rewound` too: their
writes may have been delivered under a record the failover lost, so they are found again by
their key before any send.

Revision ID: 0031
Revises: 0027
"""

from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE ledgerloop.executor ADD COLUMN timeline int")


def downgrade() -> None:
    op.execute("ALTER TABLE ledgerloop.executor DROP COLUMN timeline")
