"""Tool failure classes. Retryable or not is a type, never a string match."""

from __future__ import annotations

from ledgerloop.errors import LedgerloopError


class ToolError(LedgerloopError):
    """The tool failed."""


class NonRetryableToolError(ToolError):
    """The tool call cannot succeed as asked; it goes back to the model as an error result."""


class InvalidArguments(NonRetryableToolError):
    """The tool's arguments do not match its input schema."""


class UnknownTool(NonRetryableToolError):
    """The model asked for a tool this agent does not have."""


class PolicyDenied(NonRetryableToolError):
    """The tool policy does not allow this call."""


class RetryableToolError(ToolError):
    """A transient failure (timeout, 429, 5xx): retried inside the step within the policy."""

    retryable = True


class ToolTimeout(RetryableToolError):
    """The tool did not answer within the policy's timeout."""
