"""Agents with sandbox tools, for the sandbox tests (loaded beside the shipped examples).

Importing it registers the other test agents too, so that a worker in any test process sees
the same agents whatever ran before it, and sandbox_policy.yaml names all their write tools.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ledgerloop.agent.definition import Agent, register_agent
from ledgerloop.examples.analyst import run_code
from ledgerloop.examples.ops_agent import write_ticket
from ledgerloop.tools.registry import SandboxCommand, sandbox_tool
from tests.support.agents import broken_lookup  # registers the other test agents too


class ShellArgs(BaseModel):
    script: str = Field(min_length=1, max_length=10_000)


def _shell(args: Any) -> SandboxCommand:
    shell: ShellArgs = args
    return SandboxCommand(argv=("python3", "-I", "-c", shell.script))


#: The same command under gVisor (the policy names the backend per tool).
run_code_gvisor = sandbox_tool("run_code_gvisor", "Run Python in gVisor.", ShellArgs)(_shell)

CODER = register_agent(
    Agent(
        name="coder",
        system="Test agent that runs code.",
        # broken_lookup: a tool that raises, to fail a run while its sandbox is live.
        tools=(run_code, run_code_gvisor, write_ticket, broken_lookup),
    )
)
