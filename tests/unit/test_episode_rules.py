"""run_episode's refusals (before anything durable happens) and how an answer is judged."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from ledgerloop.agent.context import RunContext, Thought
from ledgerloop.agent.definition import Agent
from ledgerloop.agent.episodes import EpisodeBudget, run_episode, validate_answer
from ledgerloop.errors import ConfigError
from ledgerloop.examples.investigate import INVESTIGATOR, Remediation
from ledgerloop.examples.ops_agent import OPS_AGENT


class Answer(BaseModel):
    cause: str
    count: int


def _run() -> RunContext:
    return RunContext("run", INVESTIGATOR, "tenant", "conv", deadline=0.0, now=0.0, messages=[])


def _episode(agent: Agent, output: Any = Remediation) -> None:
    asyncio.run(run_episode(_run(), agent, {"message": "x"}, output=output))


def test_an_agent_with_a_write_tool_is_refused_naming_the_tool_and_the_fix() -> None:
    with pytest.raises(ConfigError) as refused:
        _episode(OPS_AGENT)
    text = str(refused.value)
    assert "write tool 'write_ticket'" in text
    assert "read tools only" in text


def test_an_agent_with_mcp_servers_is_refused() -> None:
    agent = Agent(name="mcp_reader", system="", tools=(), mcp_servers=("tickets_mcp",))
    with pytest.raises(ConfigError, match="MCP servers"):
        _episode(agent)


def test_an_output_model_a_resumed_worker_could_not_import_is_refused() -> None:
    class Local(BaseModel):
        x: int

    with pytest.raises(ConfigError, match="module level"):
        _episode(INVESTIGATOR, Local)
    with pytest.raises(ConfigError, match="not a pydantic model"):
        _episode(INVESTIGATOR, dict)


def test_outside_a_workflow_it_says_where_to_call_it() -> None:
    with pytest.raises(ConfigError, match="outside a workflow"):
        _episode(INVESTIGATOR)


@pytest.mark.parametrize("field", ["turns", "passes"])
def test_a_budget_below_one_is_refused(field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        EpisodeBudget(**{field: 0})


def _text(text: str) -> Thought:
    return Thought([{"type": "text", "text": text}])


def test_an_answer_validates_as_the_model_prose_and_fences_forgiven() -> None:
    assert validate_answer(Answer, _text('{"cause": "pool", "count": 3}')) == (
        "",
        {"cause": "pool", "count": 3},
    )
    fenced = 'Found it.\n```json\n{"cause": "pool", "count": 3}\n```'
    assert validate_answer(Answer, _text(fenced))[1] == {"cause": "pool", "count": 3}


def test_a_rejected_answer_says_what_is_wrong() -> None:
    problem, value = validate_answer(Answer, _text('{"cause": "pool", "count": "many"}'))
    assert value is None
    assert problem.startswith("count: ")
    assert validate_answer(Answer, _text("the pool"))[0] == "the answer is not a JSON object"
    assert "count: Field required" in validate_answer(Answer, _text('{"cause": "x"}'))[0]
