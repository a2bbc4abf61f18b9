"""Custom orchestrations: a run whose agent has one is driven by it instead of the built-in turns.

An orchestration is plain workflow code over the durable primitives: it receives the run (as
memory-load read it) and returns the run's result, ending the run with `finish` or with a
successful `memory_save`. It runs inside the run's workflow, so its runs start, wait,
hibernate, resume and are cancelled like any other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ledgerloop.agent.context import RunContext
from ledgerloop.agent.definition import Agent
from ledgerloop.errors import ConfigError

Orchestration = Callable[[RunContext], Awaitable[dict[str, Any]]]

_ORCHESTRATIONS: dict[str, Orchestration] = {}


def orchestration(agent: Agent) -> Callable[[Orchestration], Orchestration]:
    """Decorate `async def flow(run: RunContext) -> dict` to drive the runs of `agent`."""

    def register(flow: Orchestration) -> Orchestration:
        existing = _ORCHESTRATIONS.get(agent.name)
        if existing is not None and existing is not flow:
            raise ConfigError(
                f"agent {agent.name!r} has two orchestrations",
                fix="register one orchestration per agent",
            )
        _ORCHESTRATIONS[agent.name] = flow
        return flow

    return register


def get_orchestration(agent_name: str) -> Orchestration | None:
    return _ORCHESTRATIONS.get(agent_name)
