"""Agents and tools the tests run (also imported by worker subprocesses in crash tests)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

import ledgerloop.examples.ops_agent  # noqa: F401 (the tests run the example agent too)
from ledgerloop.agent.definition import Agent, register_agent
from ledgerloop.models.client import Tier
from ledgerloop.tools.errors import PolicyDenied, ToolTimeout
from ledgerloop.tools.registry import HttpEffect, Tool, ToolContext, read_tool, write_tool


class EchoArgs(BaseModel):
    text: str = Field(max_length=1000)


def _count(name: str) -> None:
    """Append a line per real execution, so tests across processes can count them."""
    path = os.environ.get("LEDGERLOOP_TEST_TOOL_LOG")
    if path:
        with Path(path).open("a") as log:
            log.write(name + "\n")


@read_tool("echo", "Echo the text back.", EchoArgs)
async def echo(args: EchoArgs, ctx: ToolContext) -> str:
    _count(f"echo:{ctx.tool_call_id}")
    return f"echo: {args.text}"


class SizeArgs(BaseModel):
    kib: int = Field(ge=1, le=4096)


@read_tool("big_output", "Return a large document of the given size.", SizeArgs)
async def big_output(args: SizeArgs, ctx: ToolContext) -> str:
    return "x" * (args.kib * 1024)


FLAKY_CALLS: dict[str, int] = {}


class FlakyArgs(BaseModel):
    key: str
    fail_times: int = Field(ge=0, le=10)


@read_tool("flaky", "Times out fail_times times, then answers.", FlakyArgs)
async def flaky(args: FlakyArgs, ctx: ToolContext) -> str:
    FLAKY_CALLS[args.key] = FLAKY_CALLS.get(args.key, 0) + 1
    if FLAKY_CALLS[args.key] <= args.fail_times:
        raise ToolTimeout(f"attempt {FLAKY_CALLS[args.key]} timed out")
    return f"ok after {FLAKY_CALLS[args.key]} attempts"


class DenyArgs(BaseModel):
    key: str


@read_tool("denied", "Always refused by policy.", DenyArgs)
async def denied(args: DenyArgs, ctx: ToolContext) -> Any:
    FLAKY_CALLS[args.key] = FLAKY_CALLS.get(args.key, 0) + 1
    raise PolicyDenied("not allowed for this tenant")


BROKEN_CALLS: dict[str, int] = {}


class LookupArgs(BaseModel):
    key: str


@read_tool("broken_lookup", "Looks a key up in a table that does not have it (a bug).", LookupArgs)
async def broken_lookup(args: LookupArgs, ctx: ToolContext) -> str:
    BROKEN_CALLS[args.key] = BROKEN_CALLS.get(args.key, 0) + 1
    table: dict[str, str] = {}
    return table[args.key]  # KeyError: nobody planned for it


class NoArgs(BaseModel):
    pass


@read_tool("whose", "Say which tenant is asking (cached by policy).", NoArgs)
async def whose(args: NoArgs, ctx: ToolContext) -> str:
    _count(f"whose:{ctx.tenant_id}")
    return f"tenant {ctx.tenant_id}"


LOOPER = register_agent(
    Agent(
        name="looper",
        system="Test agent.",
        tools=(echo, big_output, flaky, denied, whose),
    )
)


def _must_mention_pg_wal(text: str) -> str | None:
    return None if "pg_wal" in text else "the answer must name pg_wal"


PICKY = register_agent(
    Agent(
        name="picky",
        system="Test agent whose answers are checked.",
        tools=(echo,),
        validate_answer=_must_mention_pg_wal,
    )
)

STRONG_ONLY = register_agent(
    Agent(
        name="strong_only", system="Test agent on the strong tier.", tools=(echo,), tier=Tier.STRONG
    )
)


# -- write tools against the three kinds of ticket-service endpoint ----------------------


class TicketArgs(BaseModel):
    title: str = Field(min_length=1, max_length=200)
    priority: str = "normal"


def _ticket_body(args: Any) -> dict[str, Any]:
    ticket: TicketArgs = args
    # The service accepts low/normal/high only: any other priority is the downstream's 422.
    return {"title": ticket.title, "body": "filed by a test", "priority": ticket.priority}


def _write(name: str, kind: str, *, idempotent: bool, lookup: bool, undo: bool = False) -> Tool:
    effect = HttpEffect(
        destination="tickets",
        method="POST",
        path=f"/{kind}/tickets",
        honours_idempotency=idempotent,
        lookup_path=f"/{kind}/tickets/by-key/{{key}}" if lookup else None,
        compensate_path="/tickets/{ref}/close" if undo else None,
    )
    return write_tool(name, f"File a ticket ({kind} endpoint).", TicketArgs, effect)(_ticket_body)


TICKET_IDEMPOTENT = _write("ticket_idempotent", "idempotent", idempotent=True, lookup=True)
TICKET_LOOKUP = _write("ticket_lookup", "lookup", idempotent=False, lookup=True)
TICKET_PLAIN = _write("ticket_plain", "plain", idempotent=False, lookup=False)
URGENT_TICKET = _write("urgent_ticket", "idempotent", idempotent=True, lookup=True)
PATIENT_TICKET = _write("patient_ticket", "idempotent", idempotent=True, lookup=True)
UNDOABLE_TICKET = _write("ticket_undoable", "idempotent", idempotent=True, lookup=True, undo=True)

WRITER = register_agent(
    Agent(
        name="writer",
        system="Test agent with write tools.",
        tools=(
            TICKET_IDEMPOTENT,
            TICKET_LOOKUP,
            TICKET_PLAIN,
            URGENT_TICKET,
            PATIENT_TICKET,
            UNDOABLE_TICKET,
            echo,
            broken_lookup,
        ),
    )
)


TICKET_READER = register_agent(
    Agent(
        name="ticket_reader",
        system="Summarise the ticket.",
        tools=(echo,),
        first_message=lambda data: (
            f"Ticket {data['ticket_id']} ({data['priority']}): {data['summary']}"
        ),
    )
)


# -- two agents, one tool name: each agent's `send` goes to its own destination -------------


class SendArgs(BaseModel):
    text: str = Field(min_length=1, max_length=200)


def _send(destination: str) -> Tool:
    effect = HttpEffect(
        destination=destination,
        method="POST",
        path="/idempotent/tickets",
        honours_idempotency=True,
        lookup_path="/idempotent/tickets/by-key/{key}",
    )

    def body(args: Any) -> dict[str, Any]:
        return {"title": f"{destination}: {args.text}", "body": "sent", "priority": "low"}

    return write_tool("send", f"Send a note to {destination}.", SendArgs, effect)(body)


ALPHA = register_agent(Agent(name="alpha", system="Sends to alpha.", tools=(_send("alpha"),)))
BETA = register_agent(Agent(name="beta", system="Sends to beta.", tools=(_send("beta"),)))
