"""Reserved: filled in by the change that needs it.

Revision ID: 0024
Revises: 0023
"""

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
