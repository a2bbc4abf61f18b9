"""Run states and the one transition table. docs/state_machine.md is checked against it."""

from __future__ import annotations

from enum import StrEnum

from ledgerloop.errors import LedgerloopError


class RunStatus(StrEnum):
    RECEIVED = "received"
    PLANNING = "planning"
    AWAITING_APPROVAL = "awaiting_approval"
    EXECUTING = "executing"
    RECONCILING = "reconciling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


S = RunStatus

#: from -> the statuses it may move to. Everything not listed is refused. A status listed as
#: its own target records an event without changing the status (an answer rejected and
#: planning again, a second tool executing, another reconciling round): the history keeps
#: every observable decision.
TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    S.RECEIVED: frozenset({S.PLANNING, S.FAILED, S.CANCELLED}),
    S.PLANNING: frozenset(
        {S.PLANNING, S.EXECUTING, S.AWAITING_APPROVAL, S.SUCCEEDED, S.FAILED, S.CANCELLED}
    ),
    # approved -> executing; rejected with on_reject=continue -> planning;
    # rejected with on_reject=cancel, or expired with on_timeout=cancel -> cancelled.
    S.AWAITING_APPROVAL: frozenset({S.EXECUTING, S.PLANNING, S.CANCELLED, S.FAILED}),
    S.EXECUTING: frozenset(
        {
            S.EXECUTING,
            S.PLANNING,
            S.RECONCILING,
            S.AWAITING_APPROVAL,
            S.SUCCEEDED,
            S.FAILED,
            S.CANCELLED,
        }
    ),
    S.RECONCILING: frozenset({S.RECONCILING, S.EXECUTING, S.PLANNING, S.FAILED, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}

TERMINAL: frozenset[RunStatus] = frozenset(s for s, targets in TRANSITIONS.items() if not targets)


class InvalidTransition(LedgerloopError):
    """The run cannot move between these states."""

    def __init__(self, current: RunStatus, target: RunStatus, run_id: str | None = None) -> None:
        self.current = current
        self.target = target
        where = f"run {run_id} " if run_id else ""
        reason = " (terminal)" if current in TERMINAL else ""
        super().__init__(
            f"{where}cannot move from {current.value}{reason} to {target.value}",
            fix="check the run's status first; see docs/state_machine.md for allowed moves",
        )


def can_move(current: RunStatus, target: RunStatus) -> bool:
    return target in TRANSITIONS[current]


def check_move(current: RunStatus, target: RunStatus, run_id: str | None = None) -> None:
    if not can_move(current, target):
        raise InvalidTransition(current, target, run_id)
