"""Effects: the ledger, the transactional outbox, the relay and the reconciler."""
