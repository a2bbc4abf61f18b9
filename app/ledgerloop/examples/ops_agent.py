"""The ops agent: searches runbooks, then files a ticket once a person approves it.

`search_kb` is a read tool (runs inline in its step, cacheable). `write_ticket` is a write
tool: it needs approval, and its effect goes through the outbox to the ticket service with an
idempotency key, so a crash at any point files at most one ticket.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ledgerloop.agent.definition import Agent, register_agent
from ledgerloop.tools.registry import HttpEffect, ToolContext, read_tool, write_tool

RUNBOOKS = {
    "disk-full": "Disk full on a database host: check pg_wal size, remove old base backups, "
    "extend the volume; never delete files under pg_wal by hand.",
    "replica-lag": "Replica lag: check long-running queries on the primary and "
    "max_standby_streaming_delay; restart the replica only as a last resort.",
    "connection-storm": "Connection storm: put PgBouncer in front, lower "
    "idle_in_transaction_session_timeout, find the client that leaks connections.",
}


class SearchArgs(BaseModel):
    query: str = Field(min_length=1, max_length=500, description="What to look for")


@read_tool("search_kb", "Search the operations runbooks; returns matching entries.", SearchArgs)
async def search_kb(args: SearchArgs, ctx: ToolContext) -> dict[str, Any]:
    words = {w.strip(".,").lower() for w in args.query.split()}
    hits = [
        {"id": key, "text": text}
        for key, text in RUNBOOKS.items()
        if words & set(key.split("-")) or any(w in text.lower() for w in words if len(w) > 3)
    ]
    return {"query": args.query, "results": hits[:3]}


class TicketArgs(BaseModel):
    title: str = Field(min_length=1, max_length=200)
    body: str = Field(default="", max_length=10_000)
    priority: Literal["low", "normal", "high"] = "normal"


def _ticket_preview(args: Any) -> str:
    return f"[{args.priority}] {args.title}"


@write_tool(
    "write_ticket",
    "File a ticket in the ticket system. Needs a person's approval.",
    TicketArgs,
    HttpEffect(
        destination="tickets",
        method="POST",
        path="/idempotent/tickets",
        honours_idempotency=True,
        lookup_path="/idempotent/tickets/by-key/{key}",
    ),
    preview=_ticket_preview,
)
def write_ticket(args: Any) -> dict[str, Any]:
    ticket: TicketArgs = args
    return ticket.model_dump()


OPS_AGENT = register_agent(
    Agent(
        name="ops",
        system=(
            "You are an operations assistant. Search the runbooks before acting. File a "
            "ticket only when a human needs to act, with a short title and a clear body."
        ),
        tools=(search_kb, write_ticket),
    )
)
