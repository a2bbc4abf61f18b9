"""Reserved: filled in by the change that needs it.

Revision ID: 0026
Revises: 0025
"""

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
