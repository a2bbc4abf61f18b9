"""The run's budgets as data: what is exhausted, what a child is handed, what the error says."""

from __future__ import annotations

from ledgerloop.agent.budgets import RunBudget, Spent


def test_turns_and_tokens_are_exhausted_at_their_caps() -> None:
    budget = RunBudget(iterations=3, tokens=1000)
    assert budget.exhausted(Spent(turns=2, input_tokens=600, output_tokens=399)) is None
    assert budget.exhausted(Spent(turns=3)) == "iterations"
    assert budget.exhausted(Spent(turns=1, input_tokens=600, output_tokens=400)) == "tokens"
    assert RunBudget().exhausted(Spent(turns=10**6, input_tokens=10**9)) is None  # no caps


def test_a_child_is_handed_what_is_left_and_never_less_than_nothing() -> None:
    budget = RunBudget(iterations=8, tokens=5000)
    assert budget.left(Spent(turns=5, input_tokens=1000, output_tokens=500)) == RunBudget(3, 3500)
    assert budget.left(Spent(turns=9, input_tokens=9000)) == RunBudget(0, 0)
    assert RunBudget(tokens=10).left(Spent(turns=4)) == RunBudget(None, 10)
    assert RunBudget.from_json(budget.as_json()) == budget
    assert RunBudget.from_json(None) == RunBudget()


def test_what_a_child_spent_adds_to_the_run() -> None:
    run = Spent(turns=1, input_tokens=10, output_tokens=5)
    run.add(Spent.from_json({"turns": 3, "input_tokens": 100, "output_tokens": 50}))
    run.add_usage({"input_tokens": 7, "output_tokens": None})
    assert run.as_json() == {"turns": 4, "input_tokens": 117, "output_tokens": 55}
    assert run.tokens == 172


def test_the_error_names_the_cap_the_reason_and_what_was_spent() -> None:
    budget = RunBudget(iterations=3, tokens=8000)
    spent = Spent(turns=2, input_tokens=300, output_tokens=10_000)
    error = budget.exceeded("tokens", spent)
    assert error.reason == "token_budget"
    assert str(error) == "the run has spent its budget of 8000 tokens (10300 used)"
    assert error.details == {"max_run_tokens": 8000, "spent": spent.as_json()}
    assert budget.exceeded("iterations", Spent(turns=3)).reason == "iteration_cap"
