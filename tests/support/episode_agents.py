"""A parent that runs one child episode with the budget its input names, and ends the run
with the proposal or with the episode's typed error (tests read the run's state)."""

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
from ledgerloop.agent.primitives import finish, memory_save
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
