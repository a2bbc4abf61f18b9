"""Agents: a name, a system prompt, a model tier, tools, and the rules for a good answer."""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ledgerloop.errors import ConfigError
from ledgerloop.models.client import Tier
from ledgerloop.schedules.definition import Schedule, registered_from
from ledgerloop.schedules.ticker import for_agent
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
    #: MCP servers (names in tool_policy.yaml's mcp_servers) whose tools this agent gets;
    #: each run lists them once, in its `mcp-discover` step.
    mcp_servers: tuple[str, ...] = ()
    #: How a run's input becomes the model's first user message: a string, or a list of
    #: content blocks. By default, `input["message"]` when it is a string, else the whole
    #: input as JSON. Called once per run, in `memory-load` (a resumed run reuses the result).
    first_message: Callable[[dict[str, Any]], str | list[dict[str, Any]]] | None = None
    #: Runs made on a cron expression (schedules/definition.py), one per tick for the fleet.
    schedules: tuple[Schedule, ...] = ()

    def user_message(self, run_input: dict[str, Any]) -> str | list[dict[str, Any]]:
        """The first user message of a run with this input."""
        if self.first_message is not None:
            content = self.first_message(run_input)
            if not isinstance(content, str | list):
                raise TypeError(
                    f"agent {self.name}: first_message returned {type(content).__name__}; "
                    "return a string or a list of content blocks"
                )
            return content
        message = run_input.get("message")
        return message if isinstance(message, str) else json.dumps(run_input)

    def __post_init__(self) -> None:
        # A model names a tool by its name alone: two of one name would make what runs
        # depend on which is found first.
        names = [tool.name for tool in self.tools]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ConfigError(
                f"agent {self.name!r} has more than one tool named {', '.join(twice)}",
                fix="give each of the agent's tools its own name",
            )

    def tool(self, name: str) -> Tool | None:
        for candidate in self.tools:
            if candidate.name == name:
                return candidate
        return None


_AGENTS: dict[str, Agent] = {}
#: The module that registered each agent (a worker checks the agents of its own modules).
_ORIGINS: dict[str, str] = {}


def register_agent(agent: Agent) -> Agent:
    existing = _AGENTS.get(agent.name)
    if existing is not None and existing is not agent:
        raise ConfigError(f"two agents are named {agent.name!r}", fix="rename one of them")
    _AGENTS[agent.name] = agent
    caller = sys._getframe(1).f_globals.get("__name__", "")
    _ORIGINS.setdefault(agent.name, str(caller))
    return agent


def agents_from(modules: Iterable[str]) -> list[Agent]:
    """The agents registered by these modules (in this process, others may be registered)."""
    wanted = set(modules)
    return [agent for name, agent in _AGENTS.items() if _ORIGINS.get(name) in wanted]


def schedules_from(modules: Iterable[str]) -> list[Schedule]:
    """The schedules a worker with these agent modules keeps: those its agents declare and
    those the modules register by agent name."""
    modules = tuple(modules)
    declared = [s for agent in agents_from(modules) for s in for_agent(agent.name, agent.schedules)]
    return declared + registered_from(modules)


def get_agent(name: str) -> Agent | None:
    return _AGENTS.get(name)


def agents() -> dict[str, Agent]:
    return dict(_AGENTS)


#: The example agent `ledgerloop demo` runs. Like any agent module, it registers only when
#: named (LEDGERLOOP_AGENT_MODULES): a deployment runs the agents it asks for and no others.
EXAMPLE_AGENT_MODULE = "ledgerloop.examples.ops_agent"


def load_agent_modules(modules: Iterable[str]) -> None:
    """Import the modules that register agents.

    The current directory is searched first, as `python -m` does: an agent module beside
    where `ledgerloop` is run imports without PYTHONPATH=. (a console script's sys.path
    starts at its own bin directory instead)."""
    modules = tuple(modules)
    if modules and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            if exc.name is not None and f"{module}.".startswith(f"{exc.name}."):
                # The module itself (or its package) is missing, not one of its imports.
                raise ConfigError(
                    f"cannot import agent module {module!r}: {exc}",
                    fix="check LEDGERLOOP_AGENT_MODULES (comma-separated importable modules) "
                    f"and that it is under the current directory ({os.getcwd()}) or on "
                    "PYTHONPATH",
                ) from exc
            raise _import_failed(module, exc) from exc
        except Exception as exc:
            raise _import_failed(module, exc) from exc


def _import_failed(module: str, exc: BaseException) -> ConfigError:
    """One line naming the agent module and what its import raised (the traceback is on
    the error's cause, shown with LEDGERLOOP_DEBUG=1)."""
    detail = " ".join(str(exc).split())[:300]
    where = ""
    tb = exc.__traceback__
    while tb is not None:  # the innermost frame: where in the user's code it failed
        where = f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return ConfigError(
        f"importing agent module {module!r} raised {type(exc).__name__}: {detail}{where}",
        fix="fix the module, or remove it from LEDGERLOOP_AGENT_MODULES",
    )
