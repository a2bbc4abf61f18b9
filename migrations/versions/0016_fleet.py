"""A fleet on one database: worker identity and liveness, and a wake-up for every queued run.

Revision ID: 0016
Revises: 0015
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A row per worker process start. The id is random (never host name and pid: a peer in
    # another PID namespace has the same pid); host and pid are kept for people only.
    # streak_started_at: since when this worker's heartbeats have landed without a gap, by the
    # database's clock; only a worker with an unbroken streak may judge others (after an
    # outage nobody has one, so nobody is declared dead for having been unreachable).
    # lock_key: the session advisory lock its heartbeat connection holds while it lives.
    op.execute(
        """
        ALTER TABLE ledgerloop.executor
          ADD COLUMN streak_started_at timestamptz NOT NULL DEFAULT now(),
          ADD COLUMN lock_key int NOT NULL DEFAULT 0,
          ADD COLUMN software_version text NOT NULL DEFAULT ''
        """
    )
    # Every run that becomes ENQUEUED on Ledgerloop's queue (started from SQL or HTTP, woken
    # from hibernation, handed back by a takeover or a clean stop, promoted from DELAYED)
    # wakes the workers' dispatchers. The payload is constant, so Postgres folds a burst in
    # one transaction into one notification. The WHEN clause keeps the cost off every other
    # write to DBOS's table.
    op.execute(
        """
        CREATE FUNCTION ledgerloop.notify_run_enqueued() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
          PERFORM pg_notify('ledgerloop_runs', '');
          RETURN NULL;
        END $$
        """
    )
    for event in ("INSERT", "UPDATE OF status"):
        name = "ledgerloop_run_enqueued_" + event.split()[0].lower()
        op.execute(
            f"CREATE TRIGGER {name} AFTER {event} ON dbos.workflow_status FOR EACH ROW "
            "WHEN (NEW.status = 'ENQUEUED' AND NEW.queue_name = 'ledgerloop_runs') "
            "EXECUTE FUNCTION ledgerloop.notify_run_enqueued()"
        )
