"""Helpers for testing Ledgerloop applications against a real Postgres (shipped for users too)."""
