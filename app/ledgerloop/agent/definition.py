"""Agents: a name, a system prompt, a model tier, tools, and the rules for a good answer."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ledgerloop.errors import ConfigError
from ledgerloop.models.client import Tier
from ledgerloop.tools.registry import Tool


@dataclass(frozen=True)
class Agent:
    name: str
    system: str
    tools: tuple[Tool, ...]
    tier: Tier = Tier.CHEAP
    max_tokens: int = 2048
    #: Returns why a final answer is not acceptable, or None. A rejected answer goes back to
    #: the model and counts against the run's max_rejected_answers budget.
    validate_answer: Callable[[str], str | None] | None = None
    prompt_version: str = "1"

    def tool(self, name: str) -> Tool | None:
        for candidate in self.tools:
            if candidate.name == name:
                return candidate
        return None


_AGENTS: dict[str, Agent] = {}


def register_agent(agent: Agent) -> Agent:
    existing = _AGENTS.get(agent.name)
    if existing is not None and existing is not agent:
        raise ConfigError(f"two agents are named {agent.name!r}", fix="rename one of them")
    _AGENTS[agent.name] = agent
    return agent


def get_agent(name: str) -> Agent | None:
    return _AGENTS.get(name)


def agents() -> dict[str, Agent]:
    return dict(_AGENTS)


def load_agent_modules(modules: Iterable[str]) -> None:
    """Import the modules that register agents (the examples and the user's own)."""
    for module in ("ledgerloop.examples.ops_agent", *modules):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(
                f"cannot import agent module {module!r}: {exc}",
                fix="check LEDGERLOOP_AGENT_MODULES (comma-separated importable modules)",
            ) from exc
