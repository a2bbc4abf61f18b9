from __future__ import annotations

import pytest

from ledgerloop.runs.states import TERMINAL, TRANSITIONS, InvalidTransition, RunStatus, check_move


def test_every_status_has_a_row() -> None:
    assert set(TRANSITIONS) == set(RunStatus)


def test_terminal_states_are_exactly_the_three_final_ones() -> None:
    assert {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED} == TERMINAL


def test_same_state_events_are_allowed_exactly_where_a_run_repeats_a_phase() -> None:
    # planning again after a rejected answer, a second tool executing, another reconciling
    # round; the store records each once per step (see test_run_store).
    loops = {status for status, targets in TRANSITIONS.items() if status in targets}
    assert loops == {RunStatus.PLANNING, RunStatus.EXECUTING, RunStatus.RECONCILING}


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
