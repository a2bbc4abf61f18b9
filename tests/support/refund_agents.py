"""A refund agent whose one write tool needs a person only for large amounts.

Loaded beside tests.support.agents by the tests of the policy's conditions and previews; its
policy entry is written by those tests (tests/support/policy.yaml does not name it).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ledgerloop.agent.definition import Agent, register_agent
from ledgerloop.tools.registry import HttpEffect, write_tool


class Customer(BaseModel):
    name: str = Field(min_length=1, max_length=100)
    country: str = Field(min_length=2, max_length=2)


class RefundArgs(BaseModel):
    amount_cents: int = Field(ge=1, le=10_000_000)
    customer: Customer
    reason: str = Field(default="", max_length=500)


def _preview(args: Any) -> str:
    refund: RefundArgs = args
    return f"refund {refund.amount_cents} cents to {refund.customer.name} (tool's own preview)"


@write_tool(
    "refund",
    "Refund a customer.",
    RefundArgs,
    HttpEffect(
        destination="tickets",
        method="POST",
        path="/idempotent/tickets",
        honours_idempotency=True,
        lookup_path="/idempotent/tickets/by-key/{key}",
    ),
    preview=_preview,
)
def refund(args: Any) -> dict[str, Any]:
    # The ticket service stands in for a payments API: one ticket per refund.
    r: RefundArgs = args
    return {
        "title": f"refund {r.amount_cents} to {r.customer.name}",
        "body": r.reason,
        "priority": "normal",
    }


REFUNDER = register_agent(Agent(name="refunder", system="Refund customers.", tools=(refund,)))

#: The rules the tests run `refund` under: a person for 5,000 cents or more.
REFUND_RULES: dict[str, Any] = {
    "requires_approval": {
        "when": {
            "all": [
                {"field": "amount_cents", "gte": 5000},
                {"not": {"field": "customer.country", "in": ["XX"]}},
            ]
        }
    },
    "summary": "Refund {amount_cents} cents to {customer.name} ({customer.country})",
    "on_reject": "continue",
    "timeout_ms": 2000,
}


# -- a payout whose downstream's behaviour only the policy's destination entry declares -----


class PayArgs(BaseModel):
    title: str = Field(min_length=1, max_length=200)


@write_tool(
    "pay",
    "Pay out (the code declares no idempotency and no lookup).",
    PayArgs,
    HttpEffect(destination="payments", method="POST", path="/lookup/tickets"),
)
def pay(args: Any) -> dict[str, Any]:
    p: PayArgs = args
    return {"title": p.title, "body": "payout", "priority": "normal"}


PAYER = register_agent(Agent(name="payer", system="Pay out.", tools=(pay,)))
