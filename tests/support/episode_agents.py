"""A parent that runs one child episode with the budget its input names, and ends the run
with the proposal or with the episode's typed error (tests read the run's state); and a
parent that takes a model turn of its own after its episode, as a user's could, to show
whose budget the child spends."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field

from ledgerloop.agent.context import RunContext
from ledgerloop.agent.definition import Agent, register_agent
from ledgerloop.agent.episodes import (
    EpisodeBudget,
    EpisodeBudgetExceeded,
    EpisodeError,
    run_episode,
)
from ledgerloop.agent.orchestration import orchestration
from ledgerloop.agent.primitives import finish, memory_save, think
from ledgerloop.examples.investigate import DATA_ROOT
from ledgerloop.runs.states import RunStatus
from ledgerloop.tools.files import file_tools


class Finding(BaseModel):
    cause: str = Field(min_length=3)
    severity: Literal["low", "high"]


READER = register_agent(
    Agent(name="episode_reader", system="Read the files; report.", tools=file_tools(DATA_ROOT))
)
PARENT = register_agent(
    Agent(
        name="episode_parent",
        system="(never asked)",
        tools=(),
        first_message=lambda run_input: json.dumps(run_input),
    )
)


@orchestration(PARENT)
async def parent(run: RunContext) -> dict[str, Any]:
    asked = json.loads(run.messages[-1]["content"])
    budget = EpisodeBudget(**asked["budget"])
    try:
        finding = await run_episode(
            run, READER, {"message": asked["message"]}, output=Finding, budget=budget
        )
    except EpisodeError as exc:
        details = {
            "episode": exc.episode,
            "episode_reason": exc.reason,
            "budget_exceeded": isinstance(exc, EpisodeBudgetExceeded),
            "error": str(exc),
            "turns": exc.details["turns"],
        }
        return await finish(run, RunStatus.FAILED, "episode_ended", details)
    payload = {"finding": finding.model_dump()}
    await memory_save(run, 0, [], RunStatus.SUCCEEDED, "succeeded", payload)
    return {"status": "succeeded", **payload}


SPENDING_PARENT = register_agent(
    Agent(
        name="episode_spending_parent",
        system="Say what you make of the finding.",
        tools=(),
        # The parent's own conversation, told apart by the scripted model from the child's.
        first_message=lambda run_input: f"PARENT TURN {json.dumps(run_input)}",
    )
)


@orchestration(SPENDING_PARENT)
async def spending_parent(run: RunContext) -> dict[str, Any]:
    """The episode (with its own generous budget), then one turn of the parent's own: both
    spend the run's turns and tokens. What the run spent is in its state."""
    asked = json.loads(run.messages[-1]["content"].removeprefix("PARENT TURN "))
    episode: dict[str, Any]
    try:
        finding = await run_episode(
            run,
            READER,
            {"message": asked["message"]},
            output=Finding,
            budget=EpisodeBudget(turns=10),
        )
        episode = {"finding": finding.model_dump()}
    except EpisodeError as exc:
        episode = {"reason": exc.reason, "spent": exc.spent.as_json()}
    after_episode = run.spent.as_json()
    thought = await think(run, 0)
    payload = {
        "episode": episode,
        "after_episode": after_episode,
        "parent_said": thought.text,
        "spent": run.spent.as_json(),
    }
    await memory_save(run, 0, [], RunStatus.SUCCEEDED, "succeeded", payload)
    return {"status": "succeeded", **payload}
