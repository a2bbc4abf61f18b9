"""The analyst agent: the model writes a short Python script, and it runs in a sandbox.

`run_code` is a sandbox tool. The script and the data file it was given (query_latency.csv,
shipped beside this module) are written into the sandbox's /work, and `python3 main.py` runs
there: no network, no host files but /usr, no worker environment, within the policy's limits
(tool_policy.yaml: sandbox, limits, files_out). Load it with
LEDGERLOOP_AGENT_MODULES=ledgerloop.examples.analyst; the worker then refuses to start unless
the tool's sandbox backend is installed (scripts/install-sandbox).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ledgerloop.agent.definition import Agent, register_agent
from ledgerloop.tools.registry import SandboxCommand, sandbox_tool

DATA_FILE = Path(__file__).parent / "data" / "query_latency.csv"


class CodeArgs(BaseModel):
    code: str = Field(
        min_length=1,
        max_length=20_000,
        description="A Python 3 script. query_latency.csv is in the working directory.",
    )


@sandbox_tool(
    "run_code",
    "Run a short Python 3 script in an isolated sandbox (no network). The working directory "
    "holds query_latency.csv (hour,service,p50_ms,p99_ms,errors); print what you find.",
    CodeArgs,
)
def run_code(args: Any) -> SandboxCommand:
    code: CodeArgs = args
    return SandboxCommand(
        argv=("python3", "-I", "main.py"),
        files={"main.py": code.code, DATA_FILE.name: DATA_FILE.read_text()},
    )


ANALYST_AGENT = register_agent(
    Agent(
        name="analyst",
        system=(
            "You analyse operational data. Write a short Python script with run_code to "
            "compute what the question asks, then answer from its output."
        ),
        tools=(run_code,),
    )
)
