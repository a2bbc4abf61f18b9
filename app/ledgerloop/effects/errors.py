"""Errors of the effect ledger. Every one is non-retryable: retrying unchanged cannot help."""

from __future__ import annotations

from ledgerloop.errors import LedgerloopError


class KeyReuse(LedgerloopError):
    """The idempotency key is already bound to a different request."""

    def __init__(self, key: str, stored_hash: str, new_hash: str) -> None:
        self.key = key
        self.stored_hash = stored_hash
        self.new_hash = new_hash
        super().__init__(
            f"idempotency key {key!r} is bound to request hash {stored_hash}, not {new_hash}",
            fix="a changed action needs a new tool call id (and its own approval)",
        )


class EffectNotFound(LedgerloopError):
    """No such effect (or it belongs to another tenant)."""


class EffectNotResolvable(LedgerloopError):
    """The effect is not in a state a person may resolve."""


class RetryUnsafe(LedgerloopError):
    """No automatic retry where the policy says it is unsafe."""


class InvalidDeliveryRequest(LedgerloopError):
    """The outbox request is malformed."""


class InvalidCompensation(LedgerloopError):
    """This compensation is not allowed."""
