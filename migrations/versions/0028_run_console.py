"""The run console's list: keyset pages of a tenant's runs, newest first, in one index range.

`GET /v1/runs` had only a limit, ordered by `created_at DESC, id` with no index that ends in
`id`, so a page past the first re-read every earlier row, and a filtered page sorted the whole
tenant. The console pages with a cursor, `(created_at, id)` of the last row shown; each index
below answers one page as a range scan of `limit` entries, whatever the history's size:

- `agent_run_tenant_created`: every run of a tenant (the unfiltered list);
- `agent_run_tenant_status_created` replaces `agent_run_tenant_status`, adding `id` so a
  status filter pages the same way (the sweeper and retention use their own partial indexes);
- `agent_run_tenant_agent_created`: the agent filter.

`CREATE INDEX` (not CONCURRENTLY) takes a SHARE lock on agent_run: starts wait while it builds,
about a second per 300,000 runs on a small machine. A team with a large history can build the
three indexes CONCURRENTLY beforehand under these names; `IF NOT EXISTS` then skips them.

Revision ID: 0028
Revises: 0027
"""

from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE INDEX IF NOT EXISTS agent_run_tenant_created
          ON ledgerloop.agent_run (tenant_id, created_at DESC, id DESC);
        CREATE INDEX IF NOT EXISTS agent_run_tenant_status_created
          ON ledgerloop.agent_run (tenant_id, status, created_at DESC, id DESC);
        CREATE INDEX IF NOT EXISTS agent_run_tenant_agent_created
          ON ledgerloop.agent_run (tenant_id, agent, created_at DESC, id DESC);
        DROP INDEX IF EXISTS ledgerloop.agent_run_tenant_status;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        CREATE INDEX IF NOT EXISTS agent_run_tenant_status
          ON ledgerloop.agent_run (tenant_id, status, created_at DESC);
        DROP INDEX IF EXISTS ledgerloop.agent_run_tenant_agent_created;
        DROP INDEX IF EXISTS ledgerloop.agent_run_tenant_status_created;
        DROP INDEX IF EXISTS ledgerloop.agent_run_tenant_created;
        """
    )
