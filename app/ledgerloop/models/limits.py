"""The model provider's limits, kept for the whole fleet in the database.

`LEDGERLOOP_MODEL_RPM` and `LEDGERLOOP_MODEL_INPUT_TPM` (and `..._CHEAP` / `..._STRONG` for
one tier) are the provider's limits, which every worker's calls share. Each limit is a token
bucket row (migration 0030): before a model call, one UPDATE takes the call's share (one
request, its estimated input tokens) from every row that applies and returns how long the
row is in debt; the call waits that long on the event loop (an `await`, holding no thread),
then is sent. The debt orders the fleet's calls at the limit's pace without a second round
trip. A 429 puts the rows further in debt by its Retry-After, so every worker waits it out,
not only the one refused.

A refill holds at most one second's worth, so no window of the provider's minute sees more
than the limit plus one second's share.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from psycopg_pool import ConnectionPool

from ledgerloop.config import Settings
from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries

log = logging.getLogger(__name__)

Q = load_queries("ledgerloop.models", "limits.sql")

REQUESTS = "requests"
INPUT_TOKENS = "input_tokens"


@dataclass(frozen=True)
class ModelLimits:
    """Per-minute limits by budget name: `requests`, `input_tokens`, or `{either}:{tier}`."""

    per_minute: Mapping[str, int]

    @classmethod
    def from_settings(cls, settings: Settings) -> ModelLimits:
        found: dict[str, int | None] = {
            REQUESTS: settings.model_rpm,
            INPUT_TOKENS: settings.model_input_tpm,
            f"{REQUESTS}:cheap": settings.model_rpm_cheap,
            f"{REQUESTS}:strong": settings.model_rpm_strong,
            f"{INPUT_TOKENS}:cheap": settings.model_input_tpm_cheap,
            f"{INPUT_TOKENS}:strong": settings.model_input_tpm_strong,
        }
        return cls({name: value for name, value in found.items() if value is not None})

    def shares(self, tier: str, input_tokens: int) -> dict[str, float]:
        """What one call of `tier` takes from each budget that applies to it."""
        wanted = {
            REQUESTS: 1.0,
            f"{REQUESTS}:{tier}": 1.0,
            INPUT_TOKENS: float(input_tokens),
            f"{INPUT_TOKENS}:{tier}": float(input_tokens),
        }
        return {name: amount for name, amount in wanted.items() if name in self.per_minute}


def input_tokens_estimate(request: Mapping[str, Any]) -> int:
    """About four characters a token over what the call sends as input (the provider counts
    exactly afterwards; a budget needs the share before the call)."""
    sent = {k: request.get(k) for k in ("system", "messages", "tools") if request.get(k)}
    return max(1, len(json.dumps(sent, separators=(",", ":"))) // 4)


class FleetLimiter:
    """The limits of `ModelLimits`, taken from the database's budget rows."""

    def __init__(self, pool: ConnectionPool[Conn], limits: ModelLimits) -> None:
        self._pool = pool
        self.limits = limits

    def declare(self) -> None:
        """Write this worker's limits (the last worker started sets them)."""
        with self._pool.connection() as conn, conn.transaction():
            for name, per_minute in sorted(self.limits.per_minute.items()):
                conn.execute(Q["budget_declare"], {"name": name, "per_minute": per_minute})

    def _take(self, shares: dict[str, float]) -> dict[str, float]:
        with self._pool.connection() as conn:
            rows = conn.execute(
                Q["budget_take"], {"names": list(shares), "amounts": list(shares.values())}
            ).fetchall()
        return {row["name"]: float(row["wait_s"]) for row in rows}

    async def before_call(self, tier: str, request: Mapping[str, Any]) -> float:
        """Take the call's share and wait while the budget is in debt; the seconds waited."""
        shares = self.limits.shares(tier, input_tokens_estimate(request))
        if not shares:
            return 0.0
        waits = await asyncio.to_thread(self._take, shares)
        wait = max(waits.values(), default=0.0)
        if wait > 0:
            budget = max(waits, key=lambda name: waits[name])
            # On the call's own span (chat {model}): the trace shows where the time went.
            trace.get_current_span().add_event(
                "ledgerloop.model.budget_wait", {"ledgerloop.budget": budget, "wait_s": wait}
            )
            await asyncio.sleep(wait)
        return wait

    def _refused(self, names: list[str], retry_after_s: float) -> None:
        with self._pool.connection() as conn:
            conn.execute(Q["budget_refused"], {"names": names, "retry_after_s": retry_after_s})

    async def after_refusal(self, tier: str, retry_after_s: float) -> None:
        """A 429: the whole fleet owes the Retry-After on the request budgets of this call."""
        names = [n for n in self.limits.shares(tier, 0) if n.startswith(REQUESTS)]
        names = names or list(self.limits.shares(tier, 1))
        if names:
            await asyncio.to_thread(self._refused, names, retry_after_s)
