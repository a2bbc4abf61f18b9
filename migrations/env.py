"""Alembic environment for schema `ledgerloop` (DBOS migrates schema `dbos` itself).

Migrations run only through `ledgerloop db upgrade`, which holds the advisory lock and hands
the locked connection in through `config.attributes["connection"]`.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

SCHEMA = "ledgerloop"

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations with `ledgerloop db upgrade`, not the alembic CLI")

connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
context.configure(
    connection=connection,
    target_metadata=None,
    version_table="alembic_version",
    version_table_schema=SCHEMA,
    transaction_per_migration=True,
)
with context.begin_transaction():
    context.run_migrations()
