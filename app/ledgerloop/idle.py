"""Polls that back off while they find nothing: an idle `ledgerloop up` costs its database
little (docs/operations.md, Idle cost). A pass that finds work brings the poll back to its
base interval at once."""

from __future__ import annotations

#: The longest an idle poll waits: this long, or 15 times its base interval if that is less
#: (a test's short interval stays short), and never less than the base interval.
IDLE_POLL_S = 30.0
IDLE_FACTOR = 15.0


class IdleBackoff:
    """The wait before a poll's next pass: its base interval after a pass that found work,
    doubled after each pass that found none, up to the longest idle wait."""

    def __init__(self, base_s: float) -> None:
        self.base_s = base_s
        self.longest_s = max(base_s, min(IDLE_POLL_S, base_s * IDLE_FACTOR))
        self._next_s = base_s

    def after(self, found: bool) -> float:
        """The wait after a pass that found work (`found`) or none."""
        if found:
            self._next_s = self.base_s
            return self.base_s
        wait = self._next_s
        self._next_s = min(self._next_s * 2, self.longest_s)
        return wait
