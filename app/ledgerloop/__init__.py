"""Ledgerloop: durable, Postgres-native workflows for tool-using AI agents.

The names in `__all__` are the public API (docs/agents.md). Every other module is internal
and may change between releases; `ledgerloop.testing` (the pytest plugin and crash-test
helpers) and `ledgerloop.examples` are public too, and are loaded only when imported.

Names load on first use, so `import ledgerloop` stays cheap (no DBOS, no HTTP stack) and
importing one part of the package never drags in the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ledgerloop.version import __version__

if TYPE_CHECKING:
    from ledgerloop.agent.context import Approved, Ended, RunContext, Stop, Thought
    from ledgerloop.agent.definition import Agent, register_agent
    from ledgerloop.agent.episodes import (
        EpisodeBudget,
        EpisodeBudgetExceeded,
        EpisodeError,
        EpisodeFailed,
        run_episode,
    )
    from ledgerloop.agent.loop import run_turns
    from ledgerloop.agent.orchestration import orchestration
    from ledgerloop.agent.primitives import (
        act,
        call_read_tool,
        end_after_failure,
        finish,
        memory_load,
        memory_save,
        remember,
        think,
        wait_for_approval,
        wait_for_message,
        write_effect,
    )
    from ledgerloop.config import Settings, load_settings
    from ledgerloop.errors import ConfigError, LedgerloopError
    from ledgerloop.models.client import Tier
    from ledgerloop.runs.start import start_run
    from ledgerloop.runs.states import RunStatus
    from ledgerloop.schedules.definition import Schedule, register_schedule
    from ledgerloop.tools.errors import NonRetryableToolError, RetryableToolError
    from ledgerloop.tools.files import file_tools
    from ledgerloop.tools.registry import (
        HttpEffect,
        SandboxCommand,
        ToolContext,
        read_tool,
        sandbox_tool,
        write_tool,
    )
    from ledgerloop.worker import WorkerOptions, run_worker

#: Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    # Agents and their tools
    "Agent": "ledgerloop.agent.definition",
    "register_agent": "ledgerloop.agent.definition",
    "Tier": "ledgerloop.models.client",
    "read_tool": "ledgerloop.tools.registry",
    "write_tool": "ledgerloop.tools.registry",
    "HttpEffect": "ledgerloop.tools.registry",
    "sandbox_tool": "ledgerloop.tools.registry",
    "SandboxCommand": "ledgerloop.tools.registry",
    "ToolContext": "ledgerloop.tools.registry",
    "RetryableToolError": "ledgerloop.tools.errors",
    "NonRetryableToolError": "ledgerloop.tools.errors",
    "file_tools": "ledgerloop.tools.files",
    # Runs on a cron expression, one per tick for the fleet
    "Schedule": "ledgerloop.schedules.definition",
    "register_schedule": "ledgerloop.schedules.definition",
    # Durable primitives, for custom orchestrations
    "orchestration": "ledgerloop.agent.orchestration",
    "RunContext": "ledgerloop.agent.context",
    "Ended": "ledgerloop.agent.context",
    "Stop": "ledgerloop.agent.context",
    "Thought": "ledgerloop.agent.context",
    "Approved": "ledgerloop.agent.context",
    "memory_load": "ledgerloop.agent.primitives",
    "memory_save": "ledgerloop.agent.primitives",
    "remember": "ledgerloop.agent.primitives",
    "think": "ledgerloop.agent.primitives",
    "act": "ledgerloop.agent.primitives",
    "call_read_tool": "ledgerloop.agent.primitives",
    "wait_for_approval": "ledgerloop.agent.primitives",
    "wait_for_message": "ledgerloop.agent.primitives",
    "write_effect": "ledgerloop.agent.primitives",
    "finish": "ledgerloop.agent.primitives",
    "end_after_failure": "ledgerloop.agent.primitives",
    "run_turns": "ledgerloop.agent.loop",
    # What finish and memory_save take, and what a run's status reads
    "RunStatus": "ledgerloop.runs.states",
    # Typed child episodes
    "run_episode": "ledgerloop.agent.episodes",
    "EpisodeBudget": "ledgerloop.agent.episodes",
    "EpisodeError": "ledgerloop.agent.episodes",
    "EpisodeBudgetExceeded": "ledgerloop.agent.episodes",
    "EpisodeFailed": "ledgerloop.agent.episodes",
    # Starting runs, running workers
    "start_run": "ledgerloop.runs.start",
    "Settings": "ledgerloop.config",
    "load_settings": "ledgerloop.config",
    "run_worker": "ledgerloop.worker",
    "WorkerOptions": "ledgerloop.worker",
    # Errors
    "LedgerloopError": "ledgerloop.errors",
    "ConfigError": "ledgerloop.errors",
}

__all__ = [
    "Agent",
    "Approved",
    "ConfigError",
    "Ended",
    "EpisodeBudget",
    "EpisodeBudgetExceeded",
    "EpisodeError",
    "EpisodeFailed",
    "HttpEffect",
    "LedgerloopError",
    "NonRetryableToolError",
    "RetryableToolError",
    "RunContext",
    "RunStatus",
    "SandboxCommand",
    "Schedule",
    "Settings",
    "Stop",
    "Thought",
    "Tier",
    "ToolContext",
    "WorkerOptions",
    "__version__",
    "act",
    "call_read_tool",
    "end_after_failure",
    "file_tools",
    "finish",
    "load_settings",
    "memory_load",
    "memory_save",
    "orchestration",
    "read_tool",
    "register_agent",
    "register_schedule",
    "remember",
    "run_episode",
    "run_turns",
    "run_worker",
    "sandbox_tool",
    "start_run",
    "think",
    "wait_for_approval",
    "wait_for_message",
    "write_effect",
    "write_tool",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ledgerloop' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
