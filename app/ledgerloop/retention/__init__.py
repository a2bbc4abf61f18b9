"""Retention: purging finished runs from both schemas (`ledgerloop runs purge`)."""
