"""The relay's side of the outbox: claim due rows, record many outcomes at once.

Async (the relay is an asyncio service) and set-based: one statement claims a batch and
commits `started` on its effects; one transaction records a batch of outcomes. At 1,000
deliveries/s that is a handful of round trips per batch instead of several per row.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from ledgerloop.db import footprint
from ledgerloop.db.connect import observe_async, watching_async
from ledgerloop.db.errors import DatabaseUnreachable, translated
from ledgerloop.db.pooling import connect_kwargs
from ledgerloop.db.url import validate_url
from ledgerloop.effects.ledger import Claim, Effect, Q
from ledgerloop.effects.messages import EffectStatus, OutboxStatus

AConn = psycopg.AsyncConnection[dict[str, Any]]

log = logging.getLogger(__name__)

CHANNEL = "ledgerloop_outbox"


async def connect_async(url: str, application_name: str = "ledgerloop-relay") -> AConn:
    """An autocommit async connection with dict rows; driver errors become LedgerloopErrors.
    Through a transaction-mode pooler it prepares no statements (db/pooling.py)."""
    url = validate_url(url)
    with translated(url, "connecting"):
        conn: AConn = await psycopg.AsyncConnection.connect(
            url,
            autocommit=True,
            row_factory=dict_row,
            application_name=footprint.application_name(application_name),
            **connect_kwargs(url),
        )
        await _observed(conn)
        return conn


#: The server's timeline each connection reached when it opened (inside a worker: see
#: db.connect.watch_async_connections). A claim is delivered only from a connection on the
#: timeline the worker knows (effects.relay).
_timelines: weakref.WeakKeyDictionary[AConn, int | None] = weakref.WeakKeyDictionary()


async def _observed(conn: AConn) -> None:
    if watching_async():
        _timelines[conn] = await observe_async(conn)


def connection_timeline(conn: AConn) -> int | None:
    """The timeline `conn` reached when it opened (None: unknown, or not watched)."""
    return _timelines.get(conn)


async def open_async_pool(url: str, size: int, name: str) -> AsyncConnectionPool[AConn]:
    """A pool of up to `size` autocommit async connections with dict rows, open at once.

    It does not wait for its first connection: opened in a moment the database is away, it
    connects in the background once it is back, and a borrower meanwhile waits (then gets
    `PoolTimeout`, a transient `OperationalError`) instead of the owner failing to start.
    """
    pool: AsyncConnectionPool[AConn] = AsyncConnectionPool(
        validate_url(url),
        min_size=1,
        max_size=size,
        name=name,
        kwargs={
            "autocommit": True,
            "row_factory": dict_row,
            "application_name": footprint.application_name(name),
            **connect_kwargs(url),
        },
        configure=_observed,
        open=False,
    )
    await pool.open(wait=False)
    return pool


async def connect_async_or_later(url: str, who: str) -> AConn | None:
    """`connect_async`, or None while the database is away.

    A service inside `ledgerloop up` starts a moment after the worker found the database;
    an outage that begins in that moment must not end the service (and with it the worker).
    Its loop reconnects like after any lost connection. Every other error (a wrong
    password, a missing database) is still raised: waiting would not fix it.
    """
    try:
        return await connect_async(url, f"ledgerloop-{who.replace(' ', '-')}")
    except DatabaseUnreachable as exc:
        log.warning("%s starts without a database connection and will reconnect: %s", who, exc)
        return None


@dataclass(frozen=True)
class Claimed:
    """An outbox row this relay now owns, its effect already committed as `started`."""

    outbox_id: int
    key: str
    destination: str
    request: dict[str, Any]
    #: Attempts in the current budget, this one included.
    attempts: int
    #: Seconds left until the deadline when the row was claimed (see `claimed_at`).
    deadline_in_s: float
    #: The effect's attempt counter after this claim; the record must match it.
    effect_attempts: int
    compensates: str | None
    claimed_at: float
    #: The act step under whose name the run moves back to planning when this attempt's
    #: outcome settles the effect (the last write of a turn sent by its own step), in the
    #: outcome's own record (outbox_record). None: the record moves nothing.
    replan_step: str | None = None

    def deadline_left_s(self) -> float:
        return self.deadline_in_s - (time.monotonic() - self.claimed_at)

    @classmethod
    def at_insert(
        cls,
        effect: Effect,
        claim: Claim,
        request: dict[str, Any],
        replan_step: str | None = None,
    ) -> Claimed:
        """The row an act step recorded claimed (agent.effect_record): its first attempt."""
        return cls(
            outbox_id=claim.outbox_id,
            key=effect.key,
            destination=effect.destination,
            request=request,
            attempts=1,
            deadline_in_s=claim.deadline_in_s,
            effect_attempts=effect.attempts,
            compensates=effect.compensates,
            claimed_at=time.monotonic(),
            replan_step=replan_step,
        )


@dataclass(frozen=True)
class Outcome:
    """What to record for one claimed row."""

    claimed: Claimed
    status: EffectStatus
    outbox_status: OutboxStatus
    external_reference: str | None = None
    result: Any = None
    error: str | None = None
    evidence: dict[str, Any] | None = None
    #: outcome_unknown: how long the reconciler leaves it alone (the call may still land).
    lease_s: float | None = None
    #: A retry: when the row is due again.
    retry_in_s: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "outbox_id": self.claimed.outbox_id,
            "key": self.claimed.key,
            "attempt": self.claimed.effect_attempts,
            # What the claim left the effect in; the record settles only from there.
            "from_status": EffectStatus.STARTED.value,
            "status": self.status.value,
            "outbox_status": self.outbox_status.value,
            "external_reference": self.external_reference,
            "result": self.result,
            "error": self.error,
            "evidence": self.evidence,
            "lease_s": self.lease_s,
            "retry_in_s": self.retry_in_s,
            "replan_step": self.claimed.replan_step,
        }


class Deliverer(Protocol):
    """What an act step hands its freshly claimed effect to (the relay of its own worker)."""

    @property
    def lease_margin_s(self) -> float: ...

    def delivers_here(self) -> bool: ...

    async def deliver_now(self, claimed: Claimed) -> Outcome | None: ...

    async def send_now(self, claimed: Claimed) -> tuple[Outcome, asyncio.Future[bool]] | None: ...

    def records(self) -> AbstractAsyncContextManager[AConn]:
        """An autocommit connection on this loop for an act step's record of an effect this
        deliverer sends: no thread hand-off between the record and its delivery."""
        ...


#: Why an outbox row was refused: the relay sends only what a run's own step recorded.
UNVOUCHED = (
    "refused unsent: no act step of its run recorded this effect (or its call's approval "
    "does not grant exactly this action)"
)


async def outbox_claim(conn: AConn, *, limit: int, lease_margin_s: float) -> list[Claimed]:
    """Claim up to `limit` due rows and commit `started` on their effects (one statement)."""
    cursor = await conn.execute(
        Q["outbox_claim"], {"limit": limit, "lease_margin_s": lease_margin_s}
    )
    rows = await cursor.fetchall()
    now = time.monotonic()
    refused = [row["id"] for row in rows if not row["vouched"]]
    if refused:
        log.warning(
            "relay refused %d outbox row(s) no run vouches for (keys %s): never sent",
            len(refused),
            ", ".join(row["idempotency_key"] for row in rows if not row["vouched"]),
        )
        await conn.execute(Q["outbox_refuse"], {"ids": refused, "error": UNVOUCHED})
    orphans = [row["id"] for row in rows if row["vouched"] and not row["started"]]
    if orphans:
        await conn.execute(
            Q["outbox_close_orphans"],
            {"ids": orphans, "error": "closed unsent: its effect was no longer pending"},
        )
    return [
        Claimed(
            outbox_id=row["id"],
            key=row["idempotency_key"],
            destination=row["destination"],
            request=row["request"],
            attempts=row["attempts"],
            deadline_in_s=row["deadline_in_s"],
            effect_attempts=row["effect_attempts"],
            compensates=row["compensates"],
            claimed_at=now,
        )
        for row in rows
        if row["started"]
    ]


async def outbox_record(conn: AConn, outcomes: list[Outcome]) -> set[str]:
    """Record outcomes in one statement; returns the keys this relay still owned.

    A key missing from the answer was settled by someone else meanwhile (a reconciler after
    this relay's lease ran out); its outcome is dropped, which is safe: the settlement that won
    was made with the same or better knowledge.
    """
    # One statement on an autocommit connection is its own transaction: no BEGIN, no COMMIT.
    cursor = await conn.execute(
        Q["outbox_record"], {"outcomes": Jsonb([o.as_json() for o in outcomes])}
    )
    return {row["idempotency_key"] for row in await cursor.fetchall()}


async def outbox_next_due(conn: AConn) -> float | None:
    """Seconds until the earliest pending row is due (<= 0: due now); None when none is."""
    cursor = await conn.execute(Q["outbox_next_due"])
    row = await cursor.fetchone()
    return None if row is None else row["due_in_s"]
