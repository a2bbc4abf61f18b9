"""The Anthropic client, model tiers, and the one place a model call is made."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Any, Protocol
from urllib.parse import urlsplit

import anthropic

from ledgerloop.config import Settings
from ledgerloop.errors import ConfigError

log = logging.getLogger(__name__)

# A sent model call gets LEDGERLOOP_MODEL_TIMEOUT_S (240 s) to answer. A call that was sent
# and did not answer may have been billed: it is never sent again. Neither the SDK nor DBOS
# retries anything (no hidden second retry layer); refusals are retried here.

#: Refusals: the API said no before doing any work (rate limited, overloaded), or the
#: connection was refused before the request was sent. Nothing was billed, so these, and
#: only these, are tried again.
REFUSAL_STATUSES = frozenset({429, 529})


@dataclass(frozen=True)
class RefusalRetry:
    #: Attempts in all, the first included.
    max_attempts: int = 5
    #: The longest single wait, whatever Retry-After asks for.
    max_wait_s: float = 60.0
    #: The wait when the refusal names none, doubling per attempt up to max_wait_s.
    first_wait_s: float = 1.0


def _retry_after_s(exc: anthropic.APIStatusError) -> float | None:
    """The server's Retry-After: `retry-after-ms`, else `retry-after` (seconds or a date)."""
    headers = exc.response.headers
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def refusal_wait(exc: BaseException, attempt: int, policy: RefusalRetry) -> float | None:
    """How long to wait before trying a refused call again; None when `exc` is not a refusal.

    A timeout, a reset or any answer after the request was sent is not a refusal: that call
    may have been billed and is never repeated.
    """
    backoff = min(policy.first_wait_s * 2 ** (attempt - 1), policy.max_wait_s)
    if isinstance(exc, anthropic.APIStatusError) and exc.status_code in REFUSAL_STATUSES:
        asked = _retry_after_s(exc)
        return backoff if asked is None else min(asked, policy.max_wait_s)
    # Only a connection that was never made: the SDK's transport raises ConnectError before
    # it writes a byte (httpx's, or the SDK's bundled copy of it). A timeout is not one.
    never_sent = (
        isinstance(exc, anthropic.APIConnectionError)
        and not isinstance(exc, anthropic.APITimeoutError)
        and type(exc.__cause__).__name__ == "ConnectError"
    )
    return backoff if never_sent else None


class Limiter(Protocol):
    """The fleet's model limits (models/limits.py): a call waits its turn, a 429 is shared."""

    async def before_call(self, tier: str, request: dict[str, Any]) -> float: ...

    async def after_refusal(self, tier: str, retry_after_s: float) -> None: ...


class Tier(StrEnum):
    CHEAP = "cheap"
    STRONG = "strong"


#: HTTP connection pools a worker spreads its model calls over. httpx's pool checks every
#: idle connection it holds (a socket poll each) before and after every request, so one pool
#: serving a few hundred concurrent runs spends more of the event loop on that scan than on
#: the calls themselves (a profile of a worker taking over 100 runs beside its own 100: over
#: a third of its loop). Each call goes to the pool with the fewest calls under way, so a
#: lone run keeps one warm connection and a busy worker's pools each hold a sixteenth.
HTTP_POOLS = 16


@dataclass(frozen=True)
class ModelClient:
    #: Makes one SDK client (with its own connection pool); called when a pool is first used.
    new_client: Callable[[], anthropic.AsyncAnthropic]
    tiers: dict[Tier, str]
    server_address: str
    server_port: int
    retry: RefusalRetry = field(default_factory=RefusalRetry)
    #: The fleet's limits, when configured (set by the worker once its pool exists).
    limiter: Limiter | None = None
    #: The SDK clients made so far, and the calls under way on each (both touched only by
    #: the event loop the calls run on).
    _clients: list[anthropic.AsyncAnthropic] = field(init=False, repr=False, compare=False)
    _in_flight: list[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_clients", [])
        object.__setattr__(self, "_in_flight", [0] * HTTP_POOLS)

    def model_for(self, tier: Tier | str) -> str:
        try:
            return self.tiers[Tier(tier)]
        except ValueError:
            raise ConfigError(
                f"unknown model tier {tier!r}", fix=f"use one of {[t.value for t in Tier]}"
            ) from None

    def tier_of(self, model: object) -> str:
        """The tier a model name serves (the cheap one for a model no tier names)."""
        for tier, name in self.tiers.items():
            if name == model:
                return tier.value
        return Tier.CHEAP.value

    def in_flight(self) -> list[int]:
        """Calls under way on each connection pool (tests read it)."""
        return list(self._in_flight)

    def sdk(self) -> anthropic.AsyncAnthropic:
        """The SDK client that calls made one at a time go through (benchmarks call it
        directly for their bare baselines)."""
        if not self._clients:
            self._clients.append(self.new_client())
        return self._clients[0]

    def pools_open(self) -> int:
        """Connection pools made so far (each an SDK client)."""
        return len(self._clients)

    async def close(self) -> None:
        clients, self._clients[:] = list(self._clients), []
        for client in clients:
            await client.close()

    async def create(
        self, *, on_text: Callable[[str], None] | None = None, **request: Any
    ) -> dict[str, Any]:
        """One messages.create; the whole response (tool_use blocks included) as JSON data.

        With `on_text`, the call streams (`messages.stream`): each text delta is handed to
        `on_text` as it arrives, and the answer is the same whole message, accumulated.

        A refusal (429, 529, connection refused) is tried again after the server's
        Retry-After (or a doubling backoff), each wait capped, within `retry.max_attempts`;
        anything else, a timeout after sending above all, is raised at once.

        With the fleet's limits configured, each attempt first waits its turn (the response
        then says how long, in `rate_limit_wait_s`), and a 429 is owed by the whole fleet.
        """
        attempt = 0
        waited = 0.0
        tier = self.tier_of(request.get("model"))
        while True:
            attempt += 1
            if self.limiter is not None:
                waited += await self.limiter.before_call(tier, request)
            try:
                data = await self._send(request, on_text)
            except Exception as exc:
                wait = refusal_wait(exc, attempt, self.retry)
                if wait is None or attempt >= self.retry.max_attempts:
                    raise
                if self.limiter is not None and getattr(exc, "status_code", None) == 429:
                    # Owed by the fleet: the next attempt's turn (above) comes after it.
                    await self.limiter.after_refusal(tier, wait)
                    wait = 0.0
                log.info(
                    "model call refused (%s); attempt %d of %d in %.1f s",
                    getattr(exc, "status_code", type(exc).__name__),
                    attempt + 1,
                    self.retry.max_attempts,
                    wait,
                )
                await asyncio.sleep(wait)
                continue
            if waited > 0:
                data["rate_limit_wait_s"] = round(waited, 3)
            return data

    async def _send(
        self, request: dict[str, Any], on_text: Callable[[str], None] | None
    ) -> dict[str, Any]:
        # The least busy pool; the first on a tie, so calls one at a time share a connection.
        loads = self._in_flight
        index = loads.index(min(loads))
        while len(self._clients) <= index:
            self._clients.append(self.new_client())
        loads[index] += 1
        try:
            client = self._clients[index]
            if on_text is None:
                message = await client.messages.create(**request)
                data: dict[str, Any] = message.model_dump(mode="json")
                return data
            # A refusal raises here, before any text: it is retried like create's. The
            # events are read as the JSON they are (no SDK object per event).
            streaming = client.messages.with_streaming_response.create(**request, stream=True)
            async with streaming as response:
                return await _accumulate(response.iter_lines(), on_text)
        finally:
            loads[index] -= 1


class StreamCutOff(Exception):
    """A streamed model call ended before its message did, or with an error event."""


async def _accumulate(lines: AsyncIterator[str], on_text: Callable[[str], None]) -> dict[str, Any]:
    """A streamed message (Server-Sent Events lines) as the whole message `create` returns
    (its JSON data), each text delta handed to `on_text` as it arrives. It reads the events'
    JSON as is: the SDK's own stream makes an object per event and rebuilds a snapshot of
    the message at each, a cost a turn with a handful of calls notices."""
    message: dict[str, Any] = {}
    blocks: list[dict[str, Any]] = []
    texts: list[list[str]] = []
    for_tool: list[list[str]] = []
    stopped = False
    async for line in lines:
        if not line.startswith("data:"):
            continue
        event = json.loads(line[5:])
        kind = event.get("type")
        if kind == "content_block_delta":
            delta, index = event["delta"], event["index"]
            if delta["type"] == "text_delta":
                texts[index].append(delta["text"])
                on_text(delta["text"])
            elif delta["type"] == "input_json_delta":
                for_tool[index].append(delta["partial_json"])
        elif kind == "content_block_start":
            blocks.append(event["content_block"])
            texts.append([])
            for_tool.append([])
        elif kind == "message_start":
            message = event["message"]
        elif kind == "message_delta":
            message.update(event.get("delta") or {})
            message["usage"] = {**message.get("usage", {}), **(event.get("usage") or {})}
        elif kind == "message_stop":
            stopped = True
        elif kind == "error":
            error = event.get("error") or {}
            raise StreamCutOff(f"{error.get('type', 'error')}: {error.get('message', '')}")
    if not stopped:
        # Cut off without an error (the connection closed early): not a whole message.
        raise StreamCutOff("the model's stream ended before message_stop")
    for block, text, partial in zip(blocks, texts, for_tool, strict=True):
        if block.get("type") == "text":
            block["text"] = block.get("text", "") + "".join(text)
        elif partial:
            block["input"] = json.loads("".join(partial))
    message["content"] = blocks
    return message


def make_model_client(settings: Settings) -> ModelClient:
    """Build the client; with neither an API key nor a base URL, fail clearly at start-up."""
    if not settings.anthropic_api_key and not settings.anthropic_base_url:
        raise ConfigError(
            "no model access configured: ANTHROPIC_API_KEY and ANTHROPIC_BASE_URL are unset",
            fix="set ANTHROPIC_API_KEY, or point ANTHROPIC_BASE_URL at a scripted model "
            "(`ledgerloop scripted-model --script FILE --port N`)",
        )
    base_url = settings.anthropic_base_url or "https://api.anthropic.com"

    # The SDK's connection budget (1,000 open, 100 kept idle) split over the pools, so that
    # 16 pools keep no more idle connections, and their buffers, than one pool did.
    default = anthropic.DEFAULT_CONNECTION_LIMITS
    limits = type(default)(
        max_connections=-(-(default.max_connections or 1000) // HTTP_POOLS),
        max_keepalive_connections=-(-(default.max_keepalive_connections or 100) // HTTP_POOLS),
        keepalive_expiry=default.keepalive_expiry,
    )

    def new_client() -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(
            # The scripted server ignores the key; the SDK insists on having one.
            api_key=settings.anthropic_api_key or "scripted-model",
            base_url=base_url,
            max_retries=0,
            timeout=settings.model_timeout_s,
            # Our `chat {model}` span is the one span per model call (with the GenAI
            # attributes, and never content unless opted in); the SDK's own span would
            # duplicate it. Trace-context propagation to the API stays on.
            open_telemetry=False,
            http_client=anthropic.DefaultAsyncHttpxClient(limits=limits),
        )

    parts = urlsplit(base_url)
    return ModelClient(
        new_client=new_client,
        tiers={Tier.CHEAP: settings.model_cheap, Tier.STRONG: settings.model_strong},
        server_address=parts.hostname or "",
        server_port=parts.port or (443 if parts.scheme == "https" else 80),
        retry=RefusalRetry(
            max_attempts=settings.model_refusal_attempts,
            max_wait_s=settings.model_refusal_max_wait_s,
        ),
    )
