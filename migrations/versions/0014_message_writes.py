"""Conversation memory without a foreign-key check per message.

A run's messages are saved in one multi-row insert with its final status; the foreign key to
agent_run made Postgres run a `SELECT ... FOR KEY SHARE` on the run for every message row
(a dozen per run, the most frequent statement of the hot path). Only the run store writes
these rows, in the run's own transaction, so the reference cannot dangle; the purge deletes
them explicitly (retention/purge.py, messages_delete_for_runs).

Revision ID: 0014
Revises: 0013
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE ledgerloop.agent_message DROP CONSTRAINT agent_message_run_id_fkey")


def downgrade() -> None:
    op.execute(
        "DELETE FROM ledgerloop.agent_message m WHERE NOT EXISTS "
        "(SELECT 1 FROM ledgerloop.agent_run r WHERE r.id = m.run_id)"
    )
    op.execute(
        "ALTER TABLE ledgerloop.agent_message ADD CONSTRAINT agent_message_run_id_fkey "
        "FOREIGN KEY (run_id) REFERENCES ledgerloop.agent_run(id) ON DELETE CASCADE"
    )
