"""Model limits shared by the fleet: one token bucket per limit, in the database.

A provider's limit (requests or input tokens per minute) is the whole fleet's, so each worker
counting its own calls would overrun it by the number of workers, and learn of it from 429s.
One row per limit holds what is left (`available`, refilled at `per_minute` / 60 a second up
to one second's worth); a model call takes its share from the rows that apply to it in one
UPDATE, and waits for as long as the row is in debt. A 429 puts the row further in debt by
its Retry-After, so every worker's next call waits it out.

No tenant data: a limit belongs to the model account all tenants' runs share. Nothing is
granted to the application role.

Revision ID: 0030
Revises: 0029
"""

from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE ledgerloop.model_budget (
          -- 'requests', 'input_tokens', or either with ':{tier}'.
          name text PRIMARY KEY,
          per_minute float8 NOT NULL CHECK (per_minute > 0),
          available float8 NOT NULL,
          updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
          refusals bigint NOT NULL DEFAULT 0,
          refused_at timestamptz
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE ledgerloop.model_budget")
