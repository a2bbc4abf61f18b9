"""Ledgerloop: durable, Postgres-native workflows for tool-using AI agents."""

__version__ = "0.1.0"
