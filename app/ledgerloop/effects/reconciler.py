"""The reconciler: settles effects whose outcome nobody knows.

It takes `outcome_unknown` effects once their settle delay has passed and `started` effects
whose relay lease expired (the relay died or hung mid-call), and decides by what the
destination offers:

- a lookup: ask what the key created. Found: succeeded (several found: still succeeded, with
  the duplicates in the evidence). Not found: nothing committed, so a resend with the same key
  is safe (or, without attempts left, the effect failed: it provably never happened).
- no lookup, but idempotency keys honoured: resend with the same key; the destination returns
  the original result if the first call did commit.
- neither: needs_human, with the evidence a person needs to decide.

"Not found proves nothing committed" holds only once the original call can no longer land.
The relay's lease outlasts the call's own timeout, and an unknown outcome rests for the
relay's `settle_after_s` before it is looked up, so the request has long been answered,
refused or abandoned by then. A destination that keeps working on a request for longer than
that after the client gave up needs a longer settle delay.

Every settlement is one guarded statement, and the ledger's trigger messages the workflow in
that same transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType
from typing import Any

import httpx
import psycopg
from psycopg.types.json import Jsonb

from ledgerloop.db.errors import DatabaseUnreachable
from ledgerloop.effects.attempts import no_cookies
from ledgerloop.effects.delivery import Lookup, LookupAnswer, lookup
from ledgerloop.effects.errors import InvalidDeliveryRequest
from ledgerloop.effects.ledger import Effect, Q
from ledgerloop.effects.messages import DeliveryRequest, EffectStatus, OutboxStatus
from ledgerloop.effects.outbox import AConn, connect_async, connect_async_or_later
from ledgerloop.errors import LedgerloopError
from ledgerloop.idle import IdleBackoff
from ledgerloop.mcptools.calls import mcp_lookup
from ledgerloop.mcptools.client import McpConnections
from ledgerloop.telemetry.effect_spans import settled_span
from ledgerloop.tools.policy import McpServer

log = logging.getLogger(__name__)

MIN_WAIT_S = 0.05


@dataclass(frozen=True)
class ReconcilerConfig:
    batch_size: int = 100
    concurrency: int = 16
    #: How long one reconciler owns an effect while it asks the destination.
    claim_lease_s: float = 60.0
    #: When the lookup could not answer (down, 5xx, timeout): ask again after this.
    retry_in_s: float = 10.0
    lookup_timeout_s: float = 5.0


@dataclass(frozen=True)
class Unsettled:
    """An effect this reconciler claimed, with what its outbox row knows."""

    effect: Effect
    request: dict[str, Any]
    budget_attempts: int
    last_error: str | None
    deadline_in_s: float

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Unsettled:
        return cls(
            effect=Effect.from_row(row),
            request=row["request"],
            budget_attempts=row["budget_attempts"],
            last_error=row["outbox_last_error"],
            deadline_in_s=row["deadline_in_s"],
        )


class Action(StrEnum):
    SETTLE = "settle"
    REQUEUE = "requeue"
    DEFER = "defer"


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    status: EffectStatus | None = None
    external_reference: str | None = None
    result: Any = None
    evidence: dict[str, Any] = field(default_factory=dict)


def _evidence(u: Unsettled, answer: LookupAnswer | None, reason: str) -> dict[str, Any]:
    return {
        "reason": reason,
        "from_status": u.effect.status.value,
        "last_error": u.last_error or u.effect.error,
        "attempts": u.effect.attempts,
        "request": u.request,
        "lookup": answer.evidence() if answer else None,
    }


def _settle(
    u: Unsettled, status: EffectStatus, reason: str, answer: LookupAnswer | None
) -> Decision:
    if status is EffectStatus.FAILED and u.effect.compensates is not None:
        status, reason = EffectStatus.NEEDS_HUMAN, f"compensation failed: {reason}"
    return Decision(Action.SETTLE, reason, status, evidence=_evidence(u, answer, reason))


def decide(u: Unsettled, request: DeliveryRequest, answer: LookupAnswer | None) -> Decision:
    """The reconciler's rules (module docstring), as a pure function of what it learned."""
    budget = f"{u.budget_attempts} of {request.max_attempts} attempts"
    can_resend = u.budget_attempts < request.max_attempts and u.deadline_in_s > 0
    spent = "the deadline passed" if u.deadline_in_s <= 0 else f"all {budget} are spent"
    if answer is not None:
        if answer.kind is Lookup.FOUND:
            refs = answer.references
            reason = f"the lookup found {refs[0]}"
            evidence = _evidence(u, answer, reason)
            if len(refs) > 1:
                # More than one was created (resends to a destination without idempotency);
                # the effect happened, and a person may want to clean up the extra ones.
                reason = f"the lookup found {len(refs)}: {', '.join(refs)}"
                evidence = {**_evidence(u, answer, reason), "duplicates": refs[1:]}
            return Decision(
                Action.SETTLE,
                reason,
                EffectStatus.SUCCEEDED,
                external_reference=refs[0],
                result=answer.matches[0],
                evidence=evidence,
            )
        if answer.kind is Lookup.ABSENT:
            if can_resend:
                reason = "the lookup found nothing: it never committed; sending again"
                return Decision(Action.REQUEUE, reason, evidence=_evidence(u, answer, reason))
            return _settle(
                u,
                EffectStatus.FAILED,
                f"the lookup found nothing, so it never happened, and {spent}",
                answer,
            )
        if answer.kind is Lookup.TRANSIENT:
            return Decision(
                Action.DEFER,
                answer.detail,
                evidence={"last_lookup": answer.evidence()},
            )
        return _settle(
            u,
            EffectStatus.NEEDS_HUMAN,
            f"the lookup gave an answer the reconciler cannot read: {answer.detail}",
            answer,
        )
    if request.honours_idempotency:
        if can_resend:
            reason = "the destination honours idempotency keys: sending again with the same key"
            return Decision(Action.REQUEUE, reason, evidence=_evidence(u, None, reason))
        return _settle(
            u,
            EffectStatus.NEEDS_HUMAN,
            f"outcome unknown and {spent}; the destination honours idempotency keys, so a "
            "retry is safe once it is healthy",
            None,
        )
    return _settle(
        u,
        EffectStatus.NEEDS_HUMAN,
        "outcome unknown, and the destination neither honours idempotency keys nor offers a "
        f"lookup: a person must check whether it happened (declare honours_idempotency or "
        f"lookup_path under destinations.{u.effect.destination} in the policy file, "
        "docs/policy.md)",
        None,
    )


#: Lookup answers kept at most while their verdicts wait to be saved (oldest out first).
MAX_KEPT_ANSWERS = 1024


async def _wait(timeout: float, stop: asyncio.Event) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout)


class Reconciler:
    """Use as `async with Reconciler(url, destinations) as r: await r.reconcile_once()`."""

    def __init__(
        self,
        url: str,
        destinations: Mapping[str, str],
        config: ReconcilerConfig | None = None,
        mcp_servers: Mapping[str, McpServer] | None = None,
    ) -> None:
        self.url = url
        self.destinations = dict(destinations)
        self.mcp_servers = dict(mcp_servers or {})
        self._mcp = McpConnections()
        self.config = config or ReconcilerConfig()
        self._conn: AConn | None = None
        self._client: httpx.AsyncClient | None = None
        #: Lookup answers whose verdict is not saved yet, by (key, status, attempts) as
        #: claimed: a save that failed (the database went away) is retried with the answer
        #: received, not by asking the destination again (as agent.keep does for a step).
        self._answers: OrderedDict[tuple[str, str, int], LookupAnswer] = OrderedDict()

    async def __aenter__(self) -> Reconciler:
        self._client = httpx.AsyncClient(cookies=no_cookies())  # as the relay's (attempts)
        try:
            # None while the database is away: `run` connects once it is back.
            self._conn = await connect_async_or_later(self.url, "reconciler")
        except BaseException:
            await self._client.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._mcp.aclose()
        if self._client is not None:
            await self._client.aclose()
        if self._conn is not None:
            await self._conn.close()

    def _db(self) -> AConn:
        assert self._client is not None, "use the reconciler inside `async with`"
        if self._conn is None:
            raise DatabaseUnreachable("the reconciler has had no database connection yet")
        return self._conn

    async def reconcile_once(self) -> int:
        """Claim what is due and settle or resend it; returns how many it settled or resent."""
        cursor = await self._db().execute(
            Q["effect_claim_unsettled"],
            {"limit": self.config.batch_size, "lease_s": self.config.claim_lease_s},
        )
        claimed = [Unsettled.from_row(row) for row in await cursor.fetchall()]
        if not claimed:
            return 0
        slots = asyncio.Semaphore(self.config.concurrency)

        async def one(u: Unsettled) -> bool:
            async with slots:
                return await self._reconcile(u)

        done = await asyncio.gather(*(one(u) for u in claimed))
        return sum(done)

    async def run(self, stop: asyncio.Event, interval_s: float = 5.0) -> None:
        """Reconcile until `stop`, waking every `interval_s` or when the next lease runs out;
        while there is nothing to settle and no lease to wait for, less often (ledgerloop.idle:
        a row that appears meanwhile is found within the longest idle wait)."""
        backoff = IdleBackoff(interval_s)
        while not stop.is_set():
            try:
                done = await self.reconcile_once()
                cursor = await self._db().execute(Q["effect_next_unsettled"])
                row = await cursor.fetchone()
                due_in = row["due_in_s"] if row else None
            except (psycopg.OperationalError, LedgerloopError) as exc:
                log.warning("reconciler lost its database connection: %s", exc)
                await _wait(interval_s, stop)
                await self._reconnect()
                continue
            idle_s = backoff.after(bool(done) or due_in is not None)
            timeout = idle_s if due_in is None else min(max(due_in, MIN_WAIT_S), interval_s)
            await _wait(timeout, stop)

    async def _reconnect(self) -> None:
        if self._conn is not None:
            await self._conn.close()
        try:
            self._conn = await connect_async(self.url, "ledgerloop-reconciler")
        except LedgerloopError as exc:
            log.warning("reconciler cannot reconnect yet: %s", exc)

    async def _reconcile(self, u: Unsettled) -> bool:
        # The same effect in the same state (no attempt since): the answer it had still holds.
        slot = (u.effect.key, u.effect.status.value, u.effect.attempts)
        kept = self._answers.get(slot)
        if kept is not None:
            request = DeliveryRequest.from_json(u.request)
            applied = await self._apply(u, decide(u, request, kept))
            self._answers.pop(slot, None)
            return applied
        answer = await self._ask(u)
        if isinstance(answer, bool):
            return answer
        request, received = answer
        decision = decide(u, request, received)
        if received is not None and decision.action is not Action.DEFER:
            self._answers[slot] = received
            while len(self._answers) > MAX_KEPT_ANSWERS:
                self._answers.popitem(last=False)
        applied = await self._apply(u, decision)  # raises while the database is away
        self._answers.pop(slot, None)
        return applied

    async def _ask(self, u: Unsettled) -> bool | tuple[DeliveryRequest, LookupAnswer | None]:
        """The request and what the destination says of its key (None: no lookup declared);
        or whether an unreadable request or unknown destination was settled."""
        try:
            request = DeliveryRequest.from_json(u.request)
        except InvalidDeliveryRequest as exc:
            return await self._apply(
                u, _settle(u, EffectStatus.NEEDS_HUMAN, f"unreadable request: {exc}", None)
            )
        answer = None
        if request.mcp_lookup_tool is not None:
            server = self.mcp_servers.get(u.effect.destination)
            if server is None:
                reason = f"cannot look up: unknown MCP server {u.effect.destination!r}"
                return await self._apply(u, _settle(u, EffectStatus.NEEDS_HUMAN, reason, None))
            answer = await mcp_lookup(
                self._mcp, u.effect.destination, server, request.mcp_lookup_tool, u.effect.key
            )
        elif request.lookup_path is not None:
            base_url = self.destinations.get(u.effect.destination)
            if base_url is None:
                known = ", ".join(sorted(self.destinations)) or "none"
                reason = (
                    f"cannot look up: unknown destination {u.effect.destination!r}; "
                    f"this reconciler knows: {known}"
                )
                return await self._apply(u, _settle(u, EffectStatus.NEEDS_HUMAN, reason, None))
            assert self._client is not None
            answer = await lookup(
                self._client, base_url, u.effect.key, request, self.config.lookup_timeout_s
            )
        return request, answer

    async def _apply(self, u: Unsettled, decision: Decision) -> bool:
        guard = {
            "key": u.effect.key,
            "seen_status": u.effect.status.value,
            "seen_attempts": u.effect.attempts,
        }
        conn = self._db()
        evidence = Jsonb({"reconciler": decision.evidence})
        if decision.action is Action.DEFER:
            await conn.execute(
                Q["effect_defer"],
                {**guard, "retry_in_s": self.config.retry_in_s, "evidence": evidence},
            )
            return False
        if decision.action is Action.REQUEUE:
            cursor = await conn.execute(
                Q["effect_requeue"],
                {**guard, "evidence": evidence, "operator": None, "new_budget": False},
            )
        else:
            assert decision.status is not None
            succeeded = decision.status is EffectStatus.SUCCEEDED
            cursor = await conn.execute(
                Q["effect_settle"],
                {
                    **guard,
                    "status": decision.status.value,
                    "external_reference": decision.external_reference,
                    "result": Jsonb(decision.result) if decision.result is not None else None,
                    "error": None if succeeded else decision.reason,
                    "evidence": evidence,
                    "operator": None,
                    "outbox_status": (
                        OutboxStatus.DEAD
                        if decision.status is EffectStatus.FAILED
                        else OutboxStatus.DONE
                    ).value,
                },
            )
        applied = await cursor.fetchone() is not None
        if applied:
            log.info("reconciled %s: %s (%s)", u.effect.key, decision.action, decision.reason)
            if decision.status is not None:
                # The effect's final outcome, on the run's trace.
                settled_span(
                    u.effect.tool,
                    idempotency_key=u.effect.key,
                    status=decision.status.value,
                    reason=decision.reason,
                    settled_by="reconciler",
                    tool_traceparent=(u.request or {}).get("traceparent"),
                )
        return applied


async def reconcile_once(
    url: str, destinations: Mapping[str, str], *, config: ReconcilerConfig | None = None
) -> int:
    """One pass (for tests and `ledgerloop effects reconcile`); returns effects settled."""
    async with Reconciler(url, destinations, config) as reconciler:
        return await reconciler.reconcile_once()


async def run_reconciler(
    url: str,
    destinations: Mapping[str, str],
    *,
    stop: asyncio.Event,
    interval_s: float = 5.0,
    config: ReconcilerConfig | None = None,
    mcp_servers: Mapping[str, McpServer] | None = None,
) -> None:
    """The reconciler as a service, inside `ledgerloop up` or alone."""
    async with Reconciler(url, destinations, config, mcp_servers) as reconciler:
        await reconciler.run(stop, interval_s)


__all__ = [
    "Decision",
    "Reconciler",
    "ReconcilerConfig",
    "Unsettled",
    "decide",
    "reconcile_once",
    "run_reconciler",
]
