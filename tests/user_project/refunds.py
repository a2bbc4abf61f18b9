"""A refund agent as a user would write it: one read tool, one write tool behind approval."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ledgerloop import Agent, HttpEffect, ToolContext, read_tool, register_agent, write_tool

ORDERS = {"A-1": {"order": "A-1", "paid_cents": 12_500, "customer": "c-42"}}


class OrderArgs(BaseModel):
    order: str = Field(min_length=1, max_length=40)


@read_tool("find_order", "Look an order up by its number.", OrderArgs)
async def find_order(args: OrderArgs, ctx: ToolContext) -> dict[str, Any]:
    return ORDERS.get(args.order, {"order": args.order, "error": "no such order"})


class RefundArgs(BaseModel):
    order: str = Field(min_length=1, max_length=40)
    amount_cents: int = Field(gt=0, le=1_000_000)


@write_tool(
    "issue_refund",
    "Refund part or all of an order. A person approves every refund.",
    RefundArgs,
    HttpEffect(
        destination="payments",
        method="POST",
        path="/refunds",
        # Like most payment APIs: a repeated Idempotency-Key returns the first answer, and
        # there is no lookup by key, so an unknown outcome is settled by sending again.
        honours_idempotency=True,
        # A run that fails after refunding takes the refund back: nothing half-done is left
        # for a person to find. `{ref}` is the id the payments API answered with.
        compensate_path="/refunds/{ref}/reverse",
    ),
)
def issue_refund(args: Any) -> dict[str, Any]:
    refund: RefundArgs = args
    return refund.model_dump()


REFUNDS = register_agent(
    Agent(
        name="refunds",
        system="You handle refund requests. Look the order up before refunding it.",
        tools=(find_order, issue_refund),
    )
)
