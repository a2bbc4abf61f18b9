"""An agent whose tools are real HTTP calls, for the database-blip crash test: a read tool
that GETs a document from the downstream under a path of its own per call, and the
idempotent ticket write (POST, one idempotency key per call)."""

from __future__ import annotations

import os

import httpx
from pydantic import BaseModel, Field

from ledgerloop.agent.definition import Agent, register_agent
from ledgerloop.tools.registry import ToolContext, read_tool
from tests.support.agents import TICKET_IDEMPOTENT

#: Where `fetch_doc` reads from (the test's recording downstream).
READ_URL_ENV = "LEDGERLOOP_TEST_READ_URL"


class DocArgs(BaseModel):
    name: str = Field(min_length=1, max_length=100)


@read_tool("fetch_doc", "Read a document by name.", DocArgs)
async def fetch_doc(args: DocArgs, ctx: ToolContext) -> str:
    # One path per call (its idempotency key), so the downstream counts GETs per call.
    url = f"{os.environ[READ_URL_ENV]}/docs/{args.name}/{ctx.idempotency_key}"
    async with httpx.AsyncClient(timeout=5.0) as client:
        response = await client.get(url)
    return f"{args.name}: HTTP {response.status_code}"


BLIPPER = register_agent(
    Agent(
        name="blipper",
        system="Reads documents and files tickets.",
        tools=(fetch_doc, TICKET_IDEMPOTENT),
    )
)
