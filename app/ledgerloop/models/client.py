"""The Anthropic client, model tiers, and the one place a model call is made."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

import anthropic

from ledgerloop.config import Settings
from ledgerloop.errors import ConfigError

#: One attempt within this many seconds: a failed model call costs money and is rarely
#: transient, so neither the SDK nor DBOS retries it (no hidden second retry layer).
MODEL_CALL_TIMEOUT_S = 240.0


class Tier(StrEnum):
    CHEAP = "cheap"
    STRONG = "strong"


@dataclass(frozen=True)
class ModelClient:
    client: anthropic.AsyncAnthropic
    tiers: dict[Tier, str]
    server_address: str
    server_port: int

    def model_for(self, tier: Tier | str) -> str:
        try:
            return self.tiers[Tier(tier)]
        except ValueError:
            raise ConfigError(
                f"unknown model tier {tier!r}", fix=f"use one of {[t.value for t in Tier]}"
            ) from None

    async def create(self, **request: Any) -> dict[str, Any]:
        """One messages.create; the whole response (tool_use blocks included) as JSON data."""
        message = await self.client.messages.create(**request)
        data: dict[str, Any] = message.model_dump(mode="json")
        return data


def make_model_client(settings: Settings) -> ModelClient:
    """Build the client; with neither an API key nor a base URL, fail clearly at start-up."""
    if not settings.anthropic_api_key and not settings.anthropic_base_url:
        raise ConfigError(
            "no model access configured: ANTHROPIC_API_KEY and ANTHROPIC_BASE_URL are unset",
            fix="set ANTHROPIC_API_KEY, or point ANTHROPIC_BASE_URL at a scripted model "
            "(`ledgerloop scripted-model --script FILE --port N`)",
        )
    base_url = settings.anthropic_base_url or "https://api.anthropic.com"
    client = anthropic.AsyncAnthropic(
        # The scripted server ignores the key; the SDK insists on having one.
        api_key=settings.anthropic_api_key or "scripted-model",
        base_url=base_url,
        max_retries=0,
        timeout=MODEL_CALL_TIMEOUT_S,
        # Our `chat {model}` span is the one span per model call (with the GenAI attributes,
        # and never content unless opted in); the SDK's own span would duplicate it.
        # Trace-context propagation to the API stays on.
        open_telemetry=False,
    )
    parts = urlsplit(base_url)
    return ModelClient(
        client=client,
        tiers={Tier.CHEAP: settings.model_cheap, Tier.STRONG: settings.model_strong},
        server_address=parts.hostname or "",
        server_port=parts.port or (443 if parts.scheme == "https" else 80),
    )
