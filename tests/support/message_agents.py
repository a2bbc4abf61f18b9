"""Agents for the tests of messages to a running agent (imported by worker subprocesses too).

- `chatty`: the built-in loop with a read tool `hold` that returns once the file named by
  LEDGERLOOP_TEST_HOLD_FILE exists, so a test can send a message while a turn is under way;
- `listener`: a custom orchestration that waits for a message (a short wait that times out
  first), and ends the run with what it received.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ledgerloop.agent.context import RunContext
from ledgerloop.agent.definition import Agent, register_agent
from ledgerloop.agent.orchestration import orchestration
from ledgerloop.agent.primitives import finish, wait_for_message
from ledgerloop.runs.states import RunStatus
from ledgerloop.tools.registry import ToolContext, read_tool
from tests.support.agents import echo


class NoArgs(BaseModel):
    pass


@read_tool("hold", "Wait until the operator lets go.", NoArgs)
async def hold(args: NoArgs, ctx: ToolContext) -> str:
    path = Path(os.environ["LEDGERLOOP_TEST_HOLD_FILE"])
    Path(f"{path}.reached").touch()  # the test waits for this, then sends and lets go
    while not path.exists():
        await asyncio.sleep(0.02)  # a file written by another process: nothing to await
    return "let go"


CHATTY = register_agent(Agent(name="chatty", system="Test agent.", tools=(hold, echo)))
LISTENER = register_agent(Agent(name="listener", system="Waits for people.", tools=()))

#: How long `listener` waits for its first message before it waits again (it times out).
FIRST_WAIT_S = 0.2


@orchestration(LISTENER)
async def listen(run: RunContext) -> dict[str, Any]:
    nothing = await wait_for_message(run, FIRST_WAIT_S)
    got = await wait_for_message(run, 600)
    if got is None:
        return await finish(run, RunStatus.FAILED, "no_message", {"first": nothing is None})
    return await finish(
        run,
        RunStatus.SUCCEEDED,
        "message_received",
        {"first_timed_out": nothing is None, "text": got.text, "sent_by": got.sent_by},
    )
