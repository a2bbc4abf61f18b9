"""Conversation memory as one row per save, and run history without a foreign-key check.

A run's save wrote a row per message: a heap tuple, three index entries and a speculative
insert's confirmation each, about 7 KB of WAL for a 5-turn run (a third of the run's WAL).
A save is now one row of `agent_message_batch` holding its messages as one compact JSON text
(`json`, not `jsonb`: about a sixth smaller for a run's messages, and always read whole), with
one entry in each of two indexes; Postgres compresses the rows past 2 KB.

Additive, so workers of the previous release keep working during a deploy: `agent_message`
stays a table (its rows, and any an old worker still writes, are read with the new ones), and
the view `conversation_message` shows both, a message a row with its sequence and turn.

agent_run_event's foreign key made Postgres lock the run row (`SELECT ... FOR KEY SHARE`) for
every event: three statements and three lock records per run. Only the run store writes
events, in the statement or transaction that locks or creates the run, so the reference
cannot dangle; the purge deletes a run's events itself (retention/purge.py).

Revision ID: 0017
Revises: 0016
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE ledgerloop.agent_message_batch (
          run_id uuid NOT NULL,
          tenant_id uuid NOT NULL,
          conversation_id text NOT NULL,
          first_sequence int NOT NULL,
          messages json NOT NULL CHECK (json_typeof(messages) = 'array'),
          created_at timestamptz NOT NULL DEFAULT now(),
          PRIMARY KEY (run_id, first_sequence)
        )
        """
    )
    op.execute(
        "CREATE INDEX agent_message_batch_conversation ON ledgerloop.agent_message_batch "
        "(tenant_id, conversation_id, created_at, run_id, first_sequence)"
    )
    # An assistant message opens its turn; the user's first message is turn 0.
    op.execute(
        """
        CREATE VIEW ledgerloop.conversation_message AS
        SELECT run_id, tenant_id, conversation_id, sequence,
               greatest(0, count(*) FILTER (WHERE role = 'assistant')
                             OVER (PARTITION BY run_id ORDER BY sequence) - 1)::int AS turn,
               role, content, created_at
        FROM (
          SELECT run_id, tenant_id, conversation_id, sequence, role, content, created_at
          FROM ledgerloop.agent_message
          UNION ALL
          SELECT b.run_id, b.tenant_id, b.conversation_id,
                 b.first_sequence + m.ord::int - 1,
                 m.message->>'role', (m.message->'content')::jsonb, b.created_at
          FROM ledgerloop.agent_message_batch b
          CROSS JOIN LATERAL json_array_elements(b.messages) WITH ORDINALITY AS m(message, ord)
        ) AS messages
        """
    )
    op.execute("ALTER TABLE ledgerloop.agent_run_event DROP CONSTRAINT agent_run_event_run_id_fkey")


def downgrade() -> None:
    op.execute(
        """
        INSERT INTO ledgerloop.agent_message
          (run_id, tenant_id, conversation_id, sequence, turn, role, content, created_at)
        SELECT c.run_id, c.tenant_id, c.conversation_id, c.sequence, c.turn, c.role, c.content,
               c.created_at
        FROM ledgerloop.conversation_message c
        WHERE EXISTS (SELECT 1 FROM ledgerloop.agent_message_batch b WHERE b.run_id = c.run_id)
        ON CONFLICT (run_id, sequence) DO NOTHING
        """
    )
    op.execute("DROP VIEW ledgerloop.conversation_message")
    op.execute("DROP TABLE ledgerloop.agent_message_batch")
    op.execute(
        "DELETE FROM ledgerloop.agent_run_event e WHERE NOT EXISTS "
        "(SELECT 1 FROM ledgerloop.agent_run r WHERE r.id = e.run_id)"
    )
    op.execute(
        "ALTER TABLE ledgerloop.agent_run_event ADD CONSTRAINT agent_run_event_run_id_fkey "
        "FOREIGN KEY (run_id) REFERENCES ledgerloop.agent_run(id) ON DELETE CASCADE"
    )
