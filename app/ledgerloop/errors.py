"""The one base class for errors a user can act on.

Every error carries the problem and the fix, so the CLI can print one clear line and exit 2
instead of a traceback. Subclasses live next to the code that raises them; their docstring is
the default message.
"""

from __future__ import annotations


class LedgerloopError(Exception):
    """Ledgerloop failed."""

    #: Whether retrying the same operation unchanged can succeed.
    retryable: bool = False

    def __init__(self, message: str | None = None, *, fix: str | None = None) -> None:
        self.message = message or (type(self).__doc__ or type(self).__name__).strip()
        self.fix = fix
        super().__init__(self.message)

    def __str__(self) -> str:
        return f"{self.message} ({self.fix})" if self.fix else self.message

    def one_line(self) -> str:
        """The message and its fix on one line, for terminals and logs."""
        text = str(self)
        return " ".join(text.split())


class ConfigError(LedgerloopError):
    """The configuration is invalid."""
