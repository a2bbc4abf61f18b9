"""The effect ledger: one record per side effect, written with its outbox row in one transaction.

Functions take the caller's connection (like ledgerloop.runs.store), so an act step, an HTTP handler
or a user's own transaction can write effects. Under `tenant_scope` they see and write only
that tenant's effects.

The workflow is told about outcomes by the database itself (see queries.sql), including the
ones an operator records here with `effect_resolve`.
"""

from __future__ import annotations

import uuid
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries
from ledgerloop.effects.errors import (
    EffectNotFound,
    EffectNotResolvable,
    InvalidCompensation,
    KeyReuse,
    RetryUnsafe,
)
from ledgerloop.effects.hashing import request_hash as hash_action
from ledgerloop.effects.messages import DeliveryRequest, EffectStatus, OutboxStatus
from ledgerloop.errors import LedgerloopError
from ledgerloop.telemetry.effect_spans import settled_span

Q = load_queries("ledgerloop.effects")

COMPENSATION_SUFFIX = ":compensate"


@dataclass(frozen=True)
class Effect:
    key: str
    run_id: uuid.UUID
    tenant_id: uuid.UUID
    tool: str
    request_hash: str
    destination: str
    status: EffectStatus
    external_reference: str | None
    result: Any
    error: str | None
    evidence: dict[str, Any] | None
    attempts: int
    lease_until: datetime | None
    compensates: str | None
    resolved_by: str | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Effect:
        return cls(
            key=row["idempotency_key"],
            run_id=row["run_id"],
            tenant_id=row["tenant_id"],
            tool=row["tool"],
            request_hash=row["request_hash"],
            destination=row["destination"],
            status=EffectStatus(row["status"]),
            external_reference=row["external_reference"],
            result=row["result"],
            error=row["error"],
            evidence=row["evidence"],
            attempts=row["attempts"],
            lease_until=row["lease_until"],
            compensates=row["compensates"],
            resolved_by=row["resolved_by"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )


def effect_begin(
    conn: Conn,
    *,
    key: str,
    run_id: uuid.UUID,
    tenant_id: uuid.UUID,
    tool: str,
    request_hash: str,
    destination: str,
    request: dict[str, Any] | DeliveryRequest,
    compensates: str | None = None,
) -> Effect:
    """Record the effect (pending) and its outbox row together, or return the existing record.

    Same key and same hash: the existing effect, whatever its status, and no second outbox row.
    Same key and another hash: KeyReuse, naming both hashes. The caller checks the returned
    status: a settled effect (replay after the outcome arrived) needs no waiting.
    """
    facts = {"key": key, "run_id": run_id, "tenant_id": tenant_id, "tool": tool}
    facts |= {"request_hash": request_hash, "destination": destination, "request": request}
    effect, _ = _begin(conn, "effect_insert", {**facts, "compensates": compensates})
    return effect


@dataclass(frozen=True)
class Claim:
    """The outbox row of an effect recorded already claimed by its recorder (attempt 1)."""

    outbox_id: int
    #: Seconds from the insert to the delivery deadline.
    deadline_in_s: float


def _begin(conn: Conn, query: str, facts: dict[str, Any]) -> tuple[Effect, Claim | None]:
    """Run `query` (effect_insert) with `effect_begin`'s facts."""
    params = effect_insert_params(facts)
    # Inside the caller's transaction (the act step's), a savepoint would only add two round
    # trips: any error here aborts that whole transaction anyway.
    in_transaction = conn.info.transaction_status is not TransactionStatus.IDLE
    with nullcontext() if in_transaction else conn.transaction():
        row = conn.execute(Q[query], params).fetchone()
        return effect_inserted(conn, row, facts)


def effect_insert_params(
    facts: dict[str, Any], lease_margin_s: float | None = None
) -> dict[str, Any]:
    """The parameters of an effect insert (effect_insert, or a statement that embeds one,
    such as an act step's claimed record) from `effect_begin`'s facts; checks a
    compensation's key. `lease_margin_s`: for a row born claimed."""
    key: str = facts["key"]
    compensates: str | None = facts["compensates"]
    delivery = DeliveryRequest.from_json(facts["request"])
    if compensates is not None and key != compensates + COMPENSATION_SUFFIX:
        raise InvalidCompensation(
            f"a compensation of {compensates!r} must have the key "
            f"{compensates + COMPENSATION_SUFFIX!r}, not {key!r}"
        )
    return {
        **facts,
        "request": Jsonb(delivery.to_json()),
        "deadline_s": delivery.deadline_s,
        "timeout_ms": delivery.timeout_ms,
        "lease_margin_s": lease_margin_s,
    }


def effect_inserted(
    conn: Conn, row: dict[str, Any] | None, facts: dict[str, Any]
) -> tuple[Effect, Claim | None]:
    """What an effect insert's `row` means: the new effect (with its claim, when it was born
    claimed), or, when the key was taken (no row), the existing effect if it is the same
    action; KeyReuse if it is not."""
    key: str = facts["key"]
    request_hash: str = facts["request_hash"]
    if row is not None:
        claim = None
        if "deadline_in_s" in row:
            claim = Claim(outbox_id=row["outbox_id"], deadline_in_s=row["deadline_in_s"])
        return Effect.from_row(row), claim
    existing = effect_get(conn, key)
    if existing is None:
        # The key exists (the insert conflicted) but row-level security hides it.
        raise KeyReuse(key, "<another tenant's request>", request_hash)
    if existing.request_hash != request_hash:
        raise KeyReuse(key, existing.request_hash, request_hash)
    return existing, None


def effect_get(conn: Conn, key: str) -> Effect | None:
    row = conn.execute(Q["effect_get"], {"key": key}).fetchone()
    return Effect.from_row(row) if row else None


def effect_require(conn: Conn, key: str) -> Effect:
    effect = effect_get(conn, key)
    if effect is None:
        raise EffectNotFound(f"no effect {key!r}", fix="check the key and the tenant")
    return effect


def effect_await(conn: Conn, key: str) -> Effect:
    """`effect_require` for a workflow about to wait for the effect's outcome: the effect is
    marked awaited first, so every status recorded from now on (and the one recorded
    already) sends its message. The mark counts once the caller's transaction commits (a
    pooled connection's block commits at its end): commit it before waiting."""
    row = conn.execute(Q["effect_await"], {"key": key}).fetchone()
    if row is None:
        raise EffectNotFound(f"no effect {key!r}", fix="check the key and the tenant")
    return Effect.from_row(row)


def effect_list(
    conn: Conn,
    *,
    status: EffectStatus | str | None = None,
    run_id: uuid.UUID | None = None,
    limit: int = 50,
) -> list[Effect]:
    """Newest first; `status` and `run_id` narrow the list."""
    rows = conn.execute(
        Q["effect_list"],
        {
            "status": EffectStatus(status).value if status else None,
            "run_id": run_id,
            "limit": limit,
        },
    ).fetchall()
    return [Effect.from_row(row) for row in rows]


def compensation_begin(
    conn: Conn,
    original: Effect,
    request: dict[str, Any] | DeliveryRequest,
    *,
    tool: str | None = None,
    request_hash: str | None = None,
    destination: str | None = None,
) -> Effect:
    """Begin the effect that undoes `original`: a new effect with its own key and audit trail.

    The key is the original's plus ':compensate'. `tool` defaults to 'compensate:<tool>',
    `destination` to the original's, and `request_hash` to a hash of the compensating action.
    Only an effect that did or may have happened can be compensated.
    """
    if original.compensates is not None:
        raise InvalidCompensation(
            f"{original.key!r} is itself a compensation; compensate it by hand"
        )
    undoable = {EffectStatus.SUCCEEDED, EffectStatus.OUTCOME_UNKNOWN, EffectStatus.NEEDS_HUMAN}
    if original.status not in undoable:
        raise InvalidCompensation(
            f"{original.key!r} is {original.status.value}: "
            + (
                "it did not happen, so there is nothing to undo"
                if original.status == EffectStatus.FAILED
                else "wait until it settles before compensating it"
            )
        )
    tool = tool or f"compensate:{original.tool}"
    destination = destination or original.destination
    delivery = DeliveryRequest.from_json(request)
    if request_hash is None:
        request_hash = hash_action(
            tool, {"compensates": original.key, "request": delivery.to_json()}, destination, ""
        )
    return effect_begin(
        conn,
        key=original.key + COMPENSATION_SUFFIX,
        run_id=original.run_id,
        tenant_id=original.tenant_id,
        tool=tool,
        request_hash=request_hash,
        destination=destination,
        request=delivery,
        compensates=original.key,
    )


RESOLVABLE = frozenset({EffectStatus.NEEDS_HUMAN, EffectStatus.OUTCOME_UNKNOWN})


def effect_resolve(
    conn: Conn,
    key: str,
    *,
    succeeded_ref: str | None = None,
    failed_reason: str | None = None,
    retry: bool = False,
    operator: str,
) -> Effect:
    """A person settles an effect the machines could not: exactly one of the three decisions.

    `succeeded_ref`: it happened, here is the downstream's reference. `failed_reason`: it did
    not happen. `retry`: try again automatically, allowed only where a resend can be made safe
    (the destination honours idempotency keys: resend with the same key; it has a lookup: the
    reconciler looks first and resends only when nothing was created). The workflow hears the
    outcome in the same transaction.
    """
    decisions = [succeeded_ref is not None, failed_reason is not None, retry]
    if sum(decisions) != 1:
        raise LedgerloopError(
            "resolve needs exactly one decision",
            fix="pass one of succeeded_ref, failed_reason or retry",
        )
    if not operator.strip():
        raise LedgerloopError("resolve needs the operator's identity")
    if succeeded_ref is not None and not succeeded_ref.strip():
        raise LedgerloopError("a succeeded resolution needs the downstream's reference")
    if failed_reason is not None and not failed_reason.strip():
        raise LedgerloopError("a failed resolution needs a reason")
    with conn.transaction():
        row = conn.execute(Q["effect_lock"], {"key": key}).fetchone()
        if row is None:
            raise EffectNotFound(f"no effect {key!r}", fix="check the key and the tenant")
        effect = Effect.from_row(row)
        if effect.status not in RESOLVABLE:
            raise EffectNotResolvable(
                f"effect {key!r} is {effect.status.value}; only needs_human or outcome_unknown "
                "effects can be resolved",
            )
        guard = {"key": key, "seen_status": effect.status.value, "seen_attempts": effect.attempts}
        resolution = {
            "operator": operator,
            "decision": "retry" if retry else "succeeded" if succeeded_ref else "failed",
            "from_status": effect.status.value,
        }
        evidence = Jsonb({"resolution": resolution})
        if retry:
            delivery = DeliveryRequest.from_json(row["request"])
            if not delivery.resend_safe:
                raise RetryUnsafe(
                    f"effect {key!r} goes to {effect.destination!r}, which neither honours "
                    "idempotency keys nor offers a lookup: no automatic retry where the policy "
                    f"says it is unsafe (the policy file's destinations.{effect.destination} "
                    "entry: honours_idempotency, lookup_path)",
                    fix="check the destination yourself, then resolve as succeeded or failed; "
                    "to make later retries safe, declare honours_idempotency or lookup_path for "
                    "the destination in the policy file (docs/policy.md, Destinations)",
                )
            if delivery.lookup_path is not None:
                moved = conn.execute(
                    Q["effect_recheck"], {**guard, "evidence": evidence, "operator": operator}
                ).fetchone()
            else:
                conn.execute(
                    Q["effect_requeue"],
                    {**guard, "evidence": evidence, "operator": operator, "new_budget": True},
                ).fetchone()
                moved = conn.execute(Q["effect_get"], {"key": key}).fetchone()
        else:
            status = EffectStatus.SUCCEEDED if succeeded_ref else EffectStatus.FAILED
            moved = conn.execute(
                Q["effect_settle"],
                {
                    **guard,
                    "status": status.value,
                    "external_reference": succeeded_ref,
                    "result": Jsonb({"external_reference": succeeded_ref, "resolved_by": operator})
                    if succeeded_ref
                    else None,
                    "error": None
                    if succeeded_ref
                    else f"resolved as failed by {operator}: {failed_reason}",
                    "evidence": evidence,
                    "operator": operator,
                    "outbox_status": OutboxStatus.DONE.value,
                },
            ).fetchone()
        # The row is locked, so the guarded update cannot miss.
        assert moved is not None, f"effect {key} changed under its lock"
        settled = Effect.from_row(moved)
    if not retry:
        # The effect's final outcome, on the run's trace (a retry's lands with its delivery).
        settled_span(
            settled.tool,
            idempotency_key=key,
            status=settled.status.value,
            reason=settled.error or f"resolved by {operator}",
            settled_by="operator",
            tool_traceparent=(row["request"] or {}).get("traceparent"),
        )
    return settled


def effects_cancel_pending(conn: Conn, run_id: uuid.UUID) -> list[str]:
    """Close the undelivered effects of a cancelled run; returns their keys.

    Cancelling stops pending work and undoes nothing: an effect a relay already claimed is in
    flight and settles as usual, and a compensation still goes out.
    """
    rows = conn.execute(Q["effects_cancel_pending_for_run"], {"run_id": run_id}).fetchall()
    return [row["idempotency_key"] for row in rows]


def effects_unsettled_runs(conn: Conn, run_ids: list[uuid.UUID]) -> set[uuid.UUID]:
    """Of `run_ids`, the runs that own an effect not yet succeeded or failed."""
    rows = conn.execute(Q["effects_unsettled_runs"], {"run_ids": run_ids}).fetchall()
    return {row["run_id"] for row in rows}


def outbox_delete_for_runs(conn: Conn, run_ids: list[uuid.UUID]) -> int:
    """Retention: drop the closed outbox rows of these runs' settled effects."""
    return conn.execute(Q["outbox_delete_for_runs"], {"run_ids": run_ids}).rowcount
