"""Fault switches for the ticket service: what a misbehaving downstream looks like on the wire.

Tests arm faults over HTTP (`POST /_faults`); each matching create request consumes one count.
The responses here are what an outbox relay has to classify: a refusal it may retry, a silent
commit it must not treat as success, or a commit whose answer never arrives intact.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

Kind = Literal["idempotent", "lookup", "plain"]
KINDS: tuple[Kind, ...] = ("idempotent", "lookup", "plain")

FaultMode = Literal["slow", "fail_before_commit", "rate_limit", "commit_then_drop", "garbage"]

# Modes that refuse the request before anything is created; the rest commit first.
REFUSING_MODES: frozenset[FaultMode] = frozenset({"fail_before_commit", "rate_limit"})

GARBAGE_BODY = b"<<<not json"


class FaultSpec(BaseModel):
    """Body of `POST /_faults`: one fault, consumed `count` times by matching create requests."""

    model_config = ConfigDict(extra="forbid")

    mode: FaultMode
    count: int = Field(default=1, ge=1, le=10_000)
    delay_ms: int = Field(default=0, ge=0, le=60_000)
    kind: Kind | None = None

    @model_validator(mode="after")
    def _slow_needs_delay(self) -> Self:
        if self.mode == "slow" and self.delay_ms == 0:
            raise ValueError("mode 'slow' needs delay_ms > 0")
        return self


@dataclass
class ArmedFault:
    """A fault waiting to be consumed; `remaining` drops by one per matching request."""

    mode: FaultMode
    remaining: int
    delay_ms: int
    kind: Kind | None

    @classmethod
    def from_spec(cls, spec: FaultSpec) -> ArmedFault:
        return cls(mode=spec.mode, remaining=spec.count, delay_ms=spec.delay_ms, kind=spec.kind)

    def matches(self, kind: Kind) -> bool:
        return self.kind is None or self.kind == kind

    def as_json(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "remaining": self.remaining,
            "delay_ms": self.delay_ms,
            "kind": self.kind,
        }


@dataclass(frozen=True)
class FaultHit:
    """The fault one request consumed."""

    mode: FaultMode
    delay_ms: int


def take_fault(faults: list[ArmedFault], kind: Kind) -> FaultHit | None:
    """Consume one count of the first fault matching `kind` (caller holds the store lock)."""
    for index, fault in enumerate(faults):
        if fault.matches(kind):
            fault.remaining -= 1
            if fault.remaining == 0:
                del faults[index]
            return FaultHit(mode=fault.mode, delay_ms=fault.delay_ms)
    return None


def refusal_response(mode: FaultMode) -> Response:
    """503 or 429 with `Retry-After: 0`, so a relay retries at once instead of stalling tests."""
    status = 429 if mode == "rate_limit" else 503
    return JSONResponse(
        {"detail": f"injected fault: {mode}"}, status_code=status, headers={"Retry-After": "0"}
    )


def garbage_response() -> Response:
    """A 200 that claims JSON but is not: the client cannot learn the ticket id from it."""
    return Response(GARBAGE_BODY, status_code=200, media_type="application/json")


class ConnectionDropped(Exception):
    """Raised on purpose after the response headers went out, so the server aborts the socket."""


class DropConnectionResponse(Response):
    """Promise a body with Content-Length, send none of it, then raise.

    An ASGI app cannot reach the socket, but the server can: uvicorn closes the transport when
    the app raises after `http.response.start`. The client then sees the connection end before
    the promised body, which httpx reports as `RemoteProtocolError`. The ticket is already
    committed by then, which is exactly the ambiguity a relay must record as `outcome_unknown`.
    """

    def __init__(self) -> None:
        super().__init__(status_code=201, media_type="application/json")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": self.status_code,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", b"256"),
                ],
            }
        )
        raise ConnectionDropped("commit_then_drop: aborting the connection on purpose")


class _HideDeliberateDrops(logging.Filter):
    """Drop uvicorn's 'Exception in ASGI application' record for our own deliberate aborts."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, BaseExceptionGroup):
            return not all(isinstance(e, ConnectionDropped) for e in exc.exceptions)
        return not isinstance(exc, ConnectionDropped)


_DROP_FILTER = _HideDeliberateDrops()


def hide_deliberate_drops() -> None:
    """Keep injected drops out of the logs (idempotent: `addFilter` ignores a repeat)."""
    logging.getLogger("uvicorn.error").addFilter(_DROP_FILTER)
