"""The run's budgets: model turns and tokens, spent by every agent the run's workflow drives.

    RunBudget(iterations=8, tokens=2_000_000)     settings.max_iterations, max_run_tokens
    Spent(turns, input_tokens, output_tokens)     what the run has used so far

A run has one budget, fixed when it starts (journaled by its `memory-load`, so a resumed run
counts against the budget it began with, whatever the settings say by then). Every `think`
spends from it: the run's own agent's, a second agent's (`RunContext.with_agent`), and those
of every child episode, which is handed what is left and reports what it used back to the
parent (`run_episode`). A `think` asked for with nothing left raises RunBudgetExceeded before
it calls the model; the run's workflow ends the run failed with the budget's reason
(`end_after_failure`).

A turn is one `think` (a retry on the strong tier after an empty turn is part of its turn);
tokens are the input and output tokens every model call reported. The token budget is
checked before each call, so the call that crosses it is the last: the run may pass its
budget by at most that one call's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ledgerloop.errors import LedgerloopError

#: Which of the run's budgets ran out.
RunBudgetName = Literal["iterations", "tokens"]

#: The reason a run that spent the budget ends with (`iteration_cap` is the built-in loop's).
REASONS: dict[RunBudgetName, str] = {"iterations": "iteration_cap", "tokens": "token_budget"}


@dataclass
class Spent:
    """What a run (or one child episode of it) has used: its turns and its tokens."""

    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add_usage(self, usage: dict[str, Any] | None) -> None:
        """Count a model call's reported usage (a journaled response's `usage`)."""
        usage = usage or {}
        self.input_tokens += int(usage.get("input_tokens") or 0)
        self.output_tokens += int(usage.get("output_tokens") or 0)

    def add(self, other: Spent) -> None:
        self.turns += other.turns
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens

    def as_json(self) -> dict[str, int]:
        return {
            "turns": self.turns,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Spent:
        data = data or {}
        return cls(
            int(data.get("turns") or 0),
            int(data.get("input_tokens") or 0),
            int(data.get("output_tokens") or 0),
        )


@dataclass(frozen=True)
class RunBudget:
    """The turns and tokens a run may spend; None: no cap (a run begun before the budgets
    were journaled keeps the rules it began with)."""

    iterations: int | None = None
    tokens: int | None = None

    def exhausted(self, spent: Spent) -> RunBudgetName | None:
        """Which budget `spent` has used up (no turn may start), or None."""
        if self.iterations is not None and spent.turns >= self.iterations:
            return "iterations"
        if self.tokens is not None and spent.tokens >= self.tokens:
            return "tokens"
        return None

    def left(self, spent: Spent) -> RunBudget:
        """What is left after `spent` (what a child episode is handed)."""
        return RunBudget(
            None if self.iterations is None else max(self.iterations - spent.turns, 0),
            None if self.tokens is None else max(self.tokens - spent.tokens, 0),
        )

    def as_json(self) -> dict[str, int | None]:
        return {"iterations": self.iterations, "tokens": self.tokens}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> RunBudget:
        data = data or {}
        return cls(data.get("iterations"), data.get("tokens"))

    def exceeded(self, which: RunBudgetName, spent: Spent) -> RunBudgetExceeded:
        cap = self.iterations if which == "iterations" else self.tokens
        unit = "model turns" if which == "iterations" else "tokens"
        used = spent.turns if which == "iterations" else spent.tokens
        return RunBudgetExceeded(
            f"the run has spent its budget of {cap} {unit} ({used} used)",
            which=which,
            details={
                "max_iterations" if which == "iterations" else "max_run_tokens": cap,
                "spent": spent.as_json(),
            },
        )


class RunBudgetExceeded(LedgerloopError):
    """The run has spent one of its budgets: no further model turn may start."""

    def __init__(self, message: str, *, which: RunBudgetName, details: dict[str, Any]) -> None:
        super().__init__(message)
        #: "iterations" or "tokens".
        self.which = which
        #: The run's end reason: iteration_cap or token_budget.
        self.reason = REASONS[which]
        self.details = details
