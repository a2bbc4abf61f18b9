"""Sandbox failures. Each says what went wrong and what to do about it."""

from __future__ import annotations

from ledgerloop.errors import ConfigError, LedgerloopError


class SandboxUnavailable(ConfigError):
    """No sandbox backend can run here."""


class SandboxError(LedgerloopError):
    """The sandbox could not run the command."""


class SandboxGone(SandboxError):
    """The sandbox's working directory no longer exists on this host."""
