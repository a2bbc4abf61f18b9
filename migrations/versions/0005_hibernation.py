"""Wake hibernated runs: a message to a run parked out of memory puts it back on the queue.

Revision ID: 0005
Revises: 0004
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A trigger on DBOS's message table, so every sender (a decision, an effect's outcome, an
    # operator's resolve, DBOS.send itself) wakes the run in its own transaction. It locks the
    # workflow row before looking at it, as the park does (agent/hibernation.sql): either
    # the park sees this message and re-enqueues, or this sees the parked row and wakes it.
    # Only Ledgerloop's runs: other DELAYED workflows (a user's delayed or debounced ones)
    # keep their delay. SECURITY DEFINER: senders need no rights on dbos.workflow_status.
    op.execute(
        """
        CREATE FUNCTION ledgerloop.wake_hibernated_run() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        DECLARE
          v_status text;
        BEGIN
          SELECT status INTO v_status
          FROM dbos.workflow_status
          WHERE workflow_uuid = NEW.destination_uuid AND name = 'ledgerloop_run'
          FOR UPDATE;
          IF v_status = 'DELAYED' THEN
            UPDATE dbos.workflow_status
            SET status = 'ENQUEUED',
                delay_until_epoch_ms = NULL,
                updated_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
            WHERE workflow_uuid = NEW.destination_uuid AND status = 'DELAYED';
          END IF;
          RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER ledgerloop_wake_hibernated AFTER INSERT ON dbos.notifications "
        "FOR EACH ROW EXECUTE FUNCTION ledgerloop.wake_hibernated_run()"
    )
    op.execute("REVOKE EXECUTE ON FUNCTION ledgerloop.wake_hibernated_run() FROM PUBLIC")
