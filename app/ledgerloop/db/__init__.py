"""Postgres access: URLs, connections, error translation, provisioning and migrations."""
