"""What model calls cost: a price table per model, from configuration (LEDGERLOOP_MODEL_PRICES).

Prices are US dollars per million tokens, input and output. A response names a dated model
(`claude-haiku-4-5-20251001`); a table entry for `claude-haiku-4-5` prices it too (the longest
entry the name starts with, followed by `-`). A model with no entry has no cost (None), never
a guessed one: the console and the CLI say "unpriced" instead.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field


class ModelPrice(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    input_per_mtok: float = Field(ge=0, description="USD per million input tokens")
    output_per_mtok: float = Field(ge=0, description="USD per million output tokens")


def price_for(prices: Mapping[str, ModelPrice], model: str | None) -> ModelPrice | None:
    if not model:
        return None
    found = prices.get(model)
    if found is not None:
        return found
    matches = [name for name in prices if model.startswith(name + "-")]
    return prices[max(matches, key=len)] if matches else None


def cost_usd(
    prices: Mapping[str, ModelPrice],
    model: str | None,
    input_tokens: int | None,
    output_tokens: int | None,
) -> float | None:
    """One call's cost, or None when the model has no price."""
    price = price_for(prices, model)
    if price is None:
        return None
    return (
        (input_tokens or 0) * price.input_per_mtok + (output_tokens or 0) * price.output_per_mtok
    ) / 1_000_000
