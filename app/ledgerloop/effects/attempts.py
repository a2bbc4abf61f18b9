"""What one delivery attempt's answer means, and how the relay makes attempts: its settings,
its HTTP client, the backoff between attempts, and the decision that turns an answer into
the outcome to record (used by the relay's own deliveries and by those it makes for act
steps alike)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Literal

import httpx

from ledgerloop.effects.delivery import Delivery, Requester, Verdict
from ledgerloop.effects.messages import DeliveryRequest, EffectStatus, OutboxStatus
from ledgerloop.effects.outbox import Claimed, Outcome
from ledgerloop.effects.transport import LeanClient, LeanTransport


@dataclass(frozen=True)
class RelayConfig:
    batch_size: int = 100
    #: Calls in flight at once; also the HTTP client's connection limit.
    concurrency: int = 100
    #: Fallback wake-up for notifications missed while the listener reconnected.
    safety_poll_s: float = 5.0
    #: A claim's lease is the request timeout plus this (time to record the outcome).
    lease_margin_s: float = 5.0
    #: How long an unknown outcome rests before the reconciler looks: a request that timed out
    #: here may still be running (and commit) at the destination.
    settle_after_s: float = 5.0
    backoff_base_s: float = 0.25
    backoff_cap_s: float = 30.0
    reconnect_s: float = 1.0
    shutdown_grace_s: float = 10.0
    record_batch: int = 500
    #: Connections for act steps' records of the effects this relay sends at once (`records`).
    step_connections: int = 8
    #: Idle keep-alive connections close before a typical server's (uvicorn: 5 s), so a request
    #: is never written onto a socket the server is closing: that would read as "unknown".
    keepalive_expiry_s: float = 2.0
    #: "lean": ledgerloop.effects.transport (about a tenth of httpx's CPU per call); "httpx":
    #: httpx's own transport (proxies, HTTP/2). Both classify answers the same way.
    transport: Literal["lean", "httpx"] = "lean"


def no_cookies() -> CookieJar:
    """A cookie jar that keeps nothing. The relay's and the reconciler's clients serve every
    run and tenant: a cookie one delivery was given must never ride another to the same
    destination, so none is kept (a destination that needs a session must be given one
    in the request itself)."""
    return CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))


def http_client(config: RelayConfig) -> Requester:
    """One pooled keep-alive client for every destination, keeping no cookies."""
    if config.transport == "lean":
        return LeanClient(
            LeanTransport(
                max_connections=config.concurrency, keepalive_expiry=config.keepalive_expiry_s
            )
        )
    return httpx.AsyncClient(
        limits=httpx.Limits(
            max_connections=config.concurrency,
            max_keepalive_connections=config.concurrency,
            keepalive_expiry=config.keepalive_expiry_s,
        ),
        cookies=no_cookies(),
        headers={"User-Agent": LeanClient.USER_AGENT},
    )


def backoff_s(attempt: int, base: float, cap: float, rand: Callable[[], float]) -> float:
    """Exponential in the attempt number, with jitter so retries of a burst spread out."""
    ceiling = min(cap, base * 2.0 ** max(attempt - 1, 0))
    return ceiling / 2 + rand() * ceiling / 2


def failure(claimed: Claimed, reason: str, outbox_status: OutboxStatus) -> Outcome:
    """A non-retryable end; a compensation parks for a person instead (it must not just stop)."""
    if claimed.compensates is not None:
        return Outcome(
            claimed,
            EffectStatus.NEEDS_HUMAN,
            outbox_status,
            error=f"compensation failed: {reason}",
            evidence={
                "reason": f"compensation failed: {reason}",
                "last_error": reason,
                "attempts": claimed.effect_attempts,
                "request": claimed.request,
            },
        )
    return Outcome(claimed, EffectStatus.FAILED, outbox_status, error=reason)


def decide(
    claimed: Claimed,
    request: DeliveryRequest,
    delivery: Delivery,
    config: RelayConfig,
    rand: Callable[[], float] = random.random,
) -> Outcome:
    """What one answer means for the effect and its outbox row."""
    if delivery.verdict is Verdict.SUCCEEDED:
        return Outcome(
            claimed,
            EffectStatus.SUCCEEDED,
            OutboxStatus.DONE,
            external_reference=delivery.external_reference,
            result=delivery.result,
        )
    if delivery.verdict is Verdict.FAILED:
        return failure(claimed, delivery.detail, OutboxStatus.DONE)
    if delivery.verdict is Verdict.UNKNOWN:
        return Outcome(
            claimed,
            EffectStatus.OUTCOME_UNKNOWN,
            OutboxStatus.DONE,
            error=delivery.detail,
            evidence={
                "last_error": delivery.detail,
                "status_code": delivery.status_code,
                "attempts": claimed.effect_attempts,
            },
            lease_s=config.settle_after_s,
        )
    attempt = claimed.attempts
    if attempt >= request.max_attempts:
        return failure(
            claimed,
            f"gave up after {attempt} attempts (max_attempts {request.max_attempts}): "
            f"{delivery.detail}",
            OutboxStatus.DEAD,
        )
    delay = delivery.retry_after_s
    if delay is None:
        delay = backoff_s(attempt, config.backoff_base_s, config.backoff_cap_s, rand)
    if delay >= claimed.deadline_left_s():
        return failure(
            claimed,
            f"deadline of {request.deadline_s:g}s passes before attempt {attempt + 1}: "
            f"{delivery.detail}",
            OutboxStatus.DEAD,
        )
    return Outcome(
        claimed,
        EffectStatus.PENDING,
        OutboxStatus.PENDING,
        error=f"attempt {attempt} of {request.max_attempts}: {delivery.detail}",
        retry_in_s=delay,
    )
