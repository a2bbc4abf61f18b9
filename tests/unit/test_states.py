from __future__ import annotations

import pytest

from ledgerloop.runs.states import TERMINAL, TRANSITIONS, InvalidTransition, RunStatus, check_move


def test_every_status_has_a_row() -> None:
    assert set(TRANSITIONS) == set(RunStatus)


def test_terminal_states_are_exactly_the_three_final_ones() -> None:
    assert {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED} == TERMINAL


def test_no_self_loops() -> None:
    # The store relies on this to recognise a re-delivered event.
    assert all(status not in targets for status, targets in TRANSITIONS.items())


def test_every_non_terminal_state_can_be_cancelled_or_failed() -> None:
    for status, targets in TRANSITIONS.items():
        if status not in TERMINAL:
            assert RunStatus.CANCELLED in targets
            assert RunStatus.FAILED in targets


def test_invalid_transition_names_both_states() -> None:
    with pytest.raises(InvalidTransition) as info:
        check_move(RunStatus.CANCELLED, RunStatus.EXECUTING, "r-1")
    assert "cancelled" in str(info.value)
    assert "executing" in str(info.value)
    assert "terminal" in str(info.value)
