"""The agent loop's tables: conversation messages, offloaded payloads, executor heartbeats.

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Append-only conversation memory: memory-save-{i} writes only turn i's messages, so a
    # long conversation never rewrites its whole history at every step.
    op.execute(
        """
        CREATE TABLE ledgerloop.agent_message (
          run_id uuid NOT NULL REFERENCES ledgerloop.agent_run(id) ON DELETE CASCADE,
          tenant_id uuid NOT NULL,
          conversation_id text NOT NULL,
          sequence int NOT NULL,
          turn int NOT NULL,
          role text NOT NULL CHECK (role IN ('user', 'assistant')),
          content jsonb NOT NULL,
          created_at timestamptz NOT NULL DEFAULT now(),
          PRIMARY KEY (run_id, sequence)
        )
        """
    )
    op.execute(
        "CREATE INDEX agent_message_conversation ON ledgerloop.agent_message "
        "(tenant_id, conversation_id, created_at, sequence)"
    )
    # Large tool outputs live here; the journal holds only the reference.
    op.execute(
        """
        CREATE TABLE ledgerloop.payload (
          id uuid PRIMARY KEY,
          tenant_id uuid NOT NULL,
          run_id uuid NOT NULL REFERENCES ledgerloop.agent_run(id) ON DELETE CASCADE,
          kind text NOT NULL,
          size_bytes bigint NOT NULL,
          sha256 text NOT NULL,
          content text NOT NULL,
          created_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute("CREATE INDEX payload_run ON ledgerloop.payload (run_id)")
    # Each worker process heartbeats here; a survivor recovers the runs of a silent one.
    op.execute(
        """
        CREATE TABLE ledgerloop.executor (
          id text PRIMARY KEY,
          application_version text NOT NULL,
          hostname text NOT NULL,
          pid int NOT NULL,
          started_at timestamptz NOT NULL DEFAULT now(),
          heartbeat_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    # Tenant policies: migration 0024.
