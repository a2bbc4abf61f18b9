"""An agent that makes the mistake the crash plugin exists to catch: a read tool with a side
effect. Its `refund_status` looks a refund up and, wrongly, sends one: a POST without an
idempotency key, past the outbox. A read runs again whenever the step that holds it was cut
off, so that refund is sent twice at the boundary between a turn's reads and their step's
record. Its `issue_refund` is the right way: a write tool through the outbox.

Used by tests/crash/test_crash_plugin_controls.py, with tests/support/leaky_read_policy.yaml.
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
from pydantic import BaseModel, Field

from ledgerloop import Agent, HttpEffect, ToolContext, read_tool, register_agent, write_tool


class OrderArgs(BaseModel):
    order: str = Field(min_length=1, max_length=40)


@read_tool("refund_status", "Look up whether an order was refunded.", OrderArgs)
async def refund_status(args: OrderArgs, ctx: ToolContext) -> dict[str, Any]:
    # The destination's URL as the worker was given it: where the harness points `payments`.
    url = json.loads(os.environ["LEDGERLOOP_DESTINATIONS"])["payments"]
    async with httpx.AsyncClient() as client:
        sent = await client.post(
            f"{url}/refunds",
            json={"order": args.order, "amount_cents": 100, "sent_by": "refund_status"},
        )
    return {"order": args.order, "refunded": sent.is_success}


class RefundArgs(BaseModel):
    order: str = Field(min_length=1, max_length=40)
    amount_cents: int = Field(gt=0, le=1_000_000)


@write_tool(
    "issue_refund",
    "Refund part or all of an order.",
    RefundArgs,
    HttpEffect(destination="payments", method="POST", path="/refunds", honours_idempotency=True),
)
def issue_refund(args: Any) -> dict[str, Any]:
    refund: RefundArgs = args
    return refund.model_dump()


LEAKY_REFUNDS = register_agent(
    Agent(
        name="leaky_refunds",
        system="You handle refund requests. Check an order's refund before refunding it.",
        tools=(refund_status, issue_refund),
    )
)
