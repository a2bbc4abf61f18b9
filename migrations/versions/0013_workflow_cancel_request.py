"""Cancel requests: a cancelled run's DBOS workflow, until DBOS's own cancel has stopped it.

Revision ID: 0013
Revises: 0011
"""

from alembic import op

revision = "0013"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Cancelling a run commits the run as cancelled and one row here; DBOS's cancel_workflow
    # runs after the commit (it has its own transaction) and then deletes the row. A row that
    # outlives its requester (a crash in between, the database gone for a moment) is settled
    # by a worker's sweep, so no cancelled run keeps a live workflow.
    op.execute(
        """
        CREATE TABLE ledgerloop.workflow_cancel_request (
          run_id uuid PRIMARY KEY REFERENCES ledgerloop.agent_run (id) ON DELETE CASCADE,
          requested_at timestamptz NOT NULL DEFAULT now(),
          attempts integer NOT NULL DEFAULT 0
        )
        """
    )
    op.execute(
        "CREATE INDEX workflow_cancel_request_due ON ledgerloop.workflow_cancel_request "
        "(requested_at)"
    )
