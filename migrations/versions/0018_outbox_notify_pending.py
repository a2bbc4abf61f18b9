"""Wake the relay only for outbox rows it may claim.

An act step in a worker that runs the relay records its effect's outbox row already claimed
and delivers it itself (effects/queries.sql, effect_insert_claimed). Such a row is not the
relay's to take, so its INSERT must not wake the relay: the wake would cost a claim and a
due-time read that find nothing. Rows inserted pending (every other writer) wake it as before.

Revision ID: 0018
Revises: 0017
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


_NOTIFY = """
    CREATE OR REPLACE FUNCTION ledgerloop.outbox_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
    DECLARE
      first_id bigint;
    BEGIN
      SELECT min(id) INTO first_id FROM inserted WHERE_CLAUSE;
      IF first_id IS NOT NULL THEN
        PERFORM pg_notify('ledgerloop_outbox', first_id::text);
      END IF;
      RETURN NULL;
    END $$
"""


def upgrade() -> None:
    op.execute(_NOTIFY.replace(" WHERE_CLAUSE", " WHERE status = 'pending'"))


def downgrade() -> None:
    op.execute(_NOTIFY.replace(" WHERE_CLAUSE", ""))
