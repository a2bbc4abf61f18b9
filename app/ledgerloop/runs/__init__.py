"""The run state machine and its store (snapshot + history, changed in one transaction)."""
