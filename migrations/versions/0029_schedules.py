"""Schedules: agents run on a cron expression, one run per tick for the whole fleet.

Every worker that declares a schedule keeps its ticks, so one row per schedule decides which
of them makes a tick's run: the worker that locks the row (`FOR UPDATE SKIP LOCKED`) starts
the run and moves `last_tick` forward in the same transaction. A worker killed between the
two leaves neither, and the next one to lock the row makes the run; the run's idempotency key
(`schedule:{name}:{tick}`) makes a second start of the same tick return the first run.

The row also holds what operators change (`paused`) and a copy of the definition in code,
so `ledgerloop schedules list` and the HTTP API show it without the agent's modules. It
belongs to a tenant (the runs it makes do), so it is scoped like the other tenant tables
(migration 0024); nothing is granted to the application role.

Revision ID: 0029
Revises: 0027
"""

from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

_SCOPE = "ledgerloop.current_tenant() IS NULL OR tenant_id = ledgerloop.current_tenant()"


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE ledgerloop.schedule (
          name text PRIMARY KEY,
          tenant_id uuid NOT NULL,
          agent text NOT NULL,
          cron text NOT NULL,
          timezone text NOT NULL,
          input jsonb NOT NULL,
          missed text NOT NULL CHECK (missed IN ('skip', 'catch_up')),
          paused boolean NOT NULL DEFAULT false,
          -- Every tick at or before it is decided: its run made, or skipped by the policy.
          last_tick timestamptz NOT NULL,
          last_run_id uuid,
          -- When a worker last started with this schedule in its code.
          declared_at timestamptz NOT NULL DEFAULT now(),
          updated_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute("ALTER TABLE ledgerloop.schedule ENABLE ROW LEVEL SECURITY")
    # FORCE: the owner, which workers and the HTTP API connect as, is bound too.
    op.execute("ALTER TABLE ledgerloop.schedule FORCE ROW LEVEL SECURITY")
    op.execute(
        f"CREATE POLICY tenant_scope ON ledgerloop.schedule USING ({_SCOPE}) WITH CHECK ({_SCOPE})"
    )


def downgrade() -> None:
    op.execute("DROP TABLE ledgerloop.schedule")
